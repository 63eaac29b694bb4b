"""The controller process's brain: leader election, group commit, sessions, GC, snapshots.

One `Controller` per process. It is a *standby* that follows the metadata log until the
leader stops writing for `lease_timeout_ms` (or, with `leadership: lease`, until it holds
the Kubernetes Lease); then it tries to write the next log entry, a `ControllerElected`
record. The conditional create makes that attempt the election: at most one controller
wins each sequence number, and a deposed leader's next write fails, so it steps down.

As leader it runs every request through one queue. A batch of queued requests is validated
and applied in order (`commands.py`), and all their records go into ONE log entry (group
commit); each caller is answered only after that entry is durable. Reads are answered at
once when no entry is being written (the in-memory state then equals the durable state),
otherwise they join the next batch, so nobody ever sees a change that could still be lost.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from automq.broker.config import ControllerConfig
from automq.broker.controller import commands, users
from automq.broker.controller import records as r
from automq.broker.controller.commands import Tx
from automq.broker.controller.log import LogConflictError, LogCorruptError, MetadataLog
from automq.broker.controller.protocol import MetadataImage
from automq.broker.controller.state import MetadataState
from automq.broker.objectstore import ObjectStore, ObjectStoreError
from automq.broker.storage.metadata import MetadataError, NotControllerError, object_key

log = logging.getLogger(__name__)
T = TypeVar("T")

# The longest acknowledgement lease granted, whatever the session timeout: a broker that
# registers again waits its old lease out inside one request (the clients' timeout is 10 s),
# and after a failover a new leader waits this long for leases it did not grant.
MAX_ACK_LEASE_MS = 8_000


class ControllerFatalError(Exception):
    """This controller must not run against this metadata log (e.g. another cluster's)."""


class Role(str, enum.Enum):
    STARTING = "starting"
    STANDBY = "standby"
    LEADER = "leader"
    STOPPED = "stopped"


def wall_ms() -> int:
    return int(time.time() * 1000)


class LeadershipLease(Protocol):
    """An outside lock on who may try to lead (a Kubernetes Lease, `lease.py`)."""

    async def try_acquire(self) -> bool: ...

    async def release(self) -> None: ...


@dataclass(slots=True)
class _Pending:
    fn: Callable[[Tx], Any]
    future: asyncio.Future | None


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.commit_seconds = Histogram(
            "automq_controller_log_append_seconds",
            "Time to write one metadata log entry (conditional PUT)",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.batch_commands = Histogram(
            "automq_controller_batch_commands",
            "Requests sharing one log entry (group commit)",
            registry=registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
        )
        self.requests = Counter(
            "automq_controller_requests_total", "Controller requests by outcome", ["outcome"], registry=registry
        )
        self.role = Gauge("automq_controller_leader", "1 while this controller is the active leader", registry=registry)
        self.last_seq = Gauge(
            "automq_controller_log_seq", "Last applied metadata log sequence number", registry=registry
        )
        self.version = Gauge("automq_controller_metadata_version", "Metadata image version", registry=registry)
        self.objects_deleted = Counter(
            "automq_controller_gc_objects_deleted_total", "Objects deleted by the garbage collector", registry=registry
        )
        self.brokers_fenced = Counter(
            "automq_controller_brokers_fenced_total", "Brokers fenced after their session expired", registry=registry
        )
        self.elections = Counter(
            "automq_controller_elections_won_total", "Times this controller became leader", registry=registry
        )
        self.store_errors = Counter(
            "automq_controller_object_store_errors_total",
            "Metadata log reads and writes that failed (the object store refused or timed out)",
            registry=registry,
        )
        self.store_stalled = Gauge(
            "automq_controller_object_store_stalled",
            "1 while a metadata log write has been in flight longer than the stall threshold",
            registry=registry,
        )
        self.append_inflight = Gauge(
            "automq_controller_log_append_inflight_seconds",
            "How long the metadata log write in flight has been waiting (0 when none is)",
            registry=registry,
        )


class Controller:
    def __init__(
        self,
        store: ObjectStore,
        *,
        controller_id: int,
        url: str,
        cluster_id: str,
        config: ControllerConfig | None = None,
        session_timeout_ms: int = 10_000,
        gc_retention_ms: int = 60_000,
        lease: LeadershipLease | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.url = url
        self.cluster_id = cluster_id
        self.config = config or ControllerConfig()
        self.session_timeout_ms = session_timeout_ms
        self.gc_retention_ms = gc_retention_ms
        # extra gate before trying to lead (the Kubernetes Lease); the log rule always applies
        self.lease = lease
        self.registry = registry or CollectorRegistry()
        self.metrics = ControllerMetrics(self.registry)
        self.log = MetadataLog(store, self.config.metadata_prefix)
        self.state = MetadataState()
        self.role = Role.STARTING
        self.caught_up = False
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._writing = False
        self._dirty = True  # in-memory state may differ from the log: reload before following
        self._image: MetadataImage | None = None
        self._image_changed = asyncio.Event()
        self._sessions: dict[int, float] = {}  # node id -> monotonic deadline (leader only)
        # Acknowledgement leases (storage/ack_lease.py): node id -> when the newest lease this
        # leader granted it runs out (monotonic). A lease is at most half a session, and at
        # most MAX_ACK_LEASE_MS: a re-registration waits one out, inside a client's request.
        self.max_ack_lease_ms = max(1, min(session_timeout_ms // 2, MAX_ACK_LEASE_MS))
        self._ack_leases: dict[int, float] = {}
        # before this, a lease the previous leader granted to a node registered before this
        # term (`_inherited_leases`) may still run (both set on leading)
        self._ack_leases_unknown_until = 0.0
        self._inherited_leases: set[int] = set()
        # node id -> the newest image version that broker has applied (it watches from there)
        self._applied: dict[int, int] = {}
        self._applied_changed = asyncio.Event()
        self._committed = asyncio.Event()
        self._entries_since_snapshot = 0
        self._snapshot_task: asyncio.Task | None = None
        self._main: asyncio.Task | None = None
        self._became_leader = asyncio.Event()
        self._stopped = asyncio.Event()
        self._resigning = False
        self.fatal: ControllerFatalError | None = None
        # Object-store health as this controller sees it: when the log write in flight began,
        # and the last failure of a log read or write (cleared by the next success).
        self._append_started: float | None = None
        self._store_read_error: str | None = None
        self._store_write_error: str | None = None
        # A write in flight longer than this is reported as a stalled store (readiness,
        # metrics): the controller can no longer make timely decisions.
        self.stall_after_s = max(1.0, min(5.0, session_timeout_ms / 2000))
        self.metrics.store_stalled.set_function(lambda: 1.0 if self.store_stalled_for() else 0.0)
        self.metrics.append_inflight.set_function(
            lambda: 0.0 if self._append_started is None else time.monotonic() - self._append_started
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._main = asyncio.create_task(self._run(), name=f"controller-{self.controller_id}")

    async def resign(self, timeout_s: float = 2.0) -> None:
        """Leave leadership on purpose (graceful shutdown): one last entry tells standbys
        to elect now; nothing is written after it."""
        if self.role is not Role.LEADER:
            return
        term = self.state.term

        def resign(tx: Tx) -> None:
            tx.emit(r.ControllerResigned(self.controller_id, term))
            self._resigning = True

        try:
            await asyncio.wait_for(self.execute(resign), timeout_s)
        except (MetadataError, TimeoutError) as exc:
            log.warning("controller %d: could not resign cleanly: %s", self.controller_id, exc)
        if self.lease is not None:
            await self.lease.release()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        self.role = Role.STOPPED
        self._stopped.set()
        self._fail_queued()
        for task in (self._main, self._snapshot_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._image_changed.set()

    async def wait_leader(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._became_leader.wait(), timeout)

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def ready(self) -> bool:
        return self.unready_reason() is None

    def unready_reason(self) -> str | None:
        """Why this controller cannot do its job now (None: it can), for /readyz."""
        if self.fatal is not None:
            return f"fatal: {self.fatal}"
        if self.role is Role.STOPPED:
            return "stopped"
        stalled = self.store_stalled_for()
        if stalled:
            return (
                f"object store stalled: a metadata log write to {self.store.url} has been in flight for {stalled:.1f}s"
            )
        error = self._store_write_error or self._store_read_error
        if error is not None:
            return f"object store failing ({self.store.url}): {error}"
        if self.role is Role.LEADER:
            return None
        if self.role is Role.STANDBY and self.caught_up:
            return None
        return f"{self.role.value}, not caught up with the metadata log"

    def store_stalled_for(self) -> float:
        """Seconds the current log write has been in flight, if past the stall threshold (else 0)."""
        started = self._append_started
        if started is None:
            return 0.0
        waited = time.monotonic() - started
        return waited if waited >= self.stall_after_s else 0.0

    def _store_failed(self, what: str, exc: BaseException, write: bool) -> None:
        message = f"{what}: {type(exc).__name__}: {exc}"
        if write:
            self._store_write_error = message
        else:
            self._store_read_error = message
        self.metrics.store_errors.inc()

    def _store_ok(self, wrote: bool) -> None:
        """A read succeeded; `wrote`: a write did too (ours, or another controller's entry
        we just read), so the store takes writes again."""
        self._store_read_error = None
        if wrote:
            self._store_write_error = None

    @property
    def leader_url(self) -> str | None:
        if self.role is Role.LEADER:
            return self.url
        return self.state.controller_url or None

    async def _run(self) -> None:
        while self.role is not Role.STOPPED:
            try:
                await self._follow()
                if self.role is Role.LEADER:
                    await self._lead()
            except asyncio.CancelledError:
                raise
            except ControllerFatalError as exc:
                log.error("controller %d stops: %s", self.controller_id, exc)
                self.fatal = exc
                self.role = Role.STOPPED
                self._stopped.set()
                return
            except Exception:
                log.exception("controller %d: unexpected error; restarting as standby", self.controller_id)
                self._step_down("unexpected error")
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ standby

    async def _follow(self) -> None:
        self.role = Role.STANDBY
        self.metrics.role.set(0)
        lease_s = self.config.lease_timeout_ms / 1000
        poll_s = self.config.poll_interval_ms / 1000
        while self._dirty:
            try:
                self.state = await self.log.load()
                self._dirty = False
                self._store_ok(wrote=False)
            except (ObjectStoreError, LogCorruptError) as exc:
                log.warning("controller %d: cannot load metadata log yet: %s", self.controller_id, exc)
                self._store_failed("loading the metadata log", exc, write=False)
                await asyncio.sleep(poll_s)
        if self.state.cluster_id and self.state.cluster_id != self.cluster_id:
            raise ControllerFatalError(
                f"cluster_id mismatch: the metadata log at {self.store.url} belongs to cluster "
                f"{self.state.cluster_id!r}, this controller is configured for {self.cluster_id!r}"
            )
        self.caught_up = True
        self._publish()
        last_progress = time.monotonic()
        # A restarted sole controller need not wait out its own dead lease.
        eager = self.state.last_seq < 0 or self.state.controller_id == self.controller_id or self.state.leader_resigned
        while self.role is Role.STANDBY:
            try:
                applied = await self.log.catch_up(self.state)
                self._store_ok(wrote=bool(applied))
            except (ObjectStoreError, LogCorruptError) as exc:
                log.warning("controller %d: reading the metadata log failed: %s", self.controller_id, exc)
                self._store_failed("reading the metadata log", exc, write=False)
                await asyncio.sleep(poll_s)
                continue
            if applied:
                last_progress = time.monotonic()
                self.metrics.last_seq.set(self.state.last_seq)
                self._publish()
                # Someone alive is writing the log: an empty log's or our own dead lease's
                # eagerness is over (otherwise a standby that loaded the log just before a peer's
                # first election entry elects itself over that live leader at once, and until the
                # deposed one's next write fails both say they lead). A resignation makes it
                # eager again.
                eager = self.state.leader_resigned
            if self.lease is not None:
                # the Lease holder leads: ask for it every renew interval (it expires by itself)
                due = eager or time.monotonic() - last_progress >= self.config.renew_interval_ms / 1000
            else:
                due = eager or time.monotonic() - last_progress >= lease_s
            if due and not self._resigning:
                eager = False
                if await self._try_elect():
                    return
                last_progress = time.monotonic()
            await asyncio.sleep(poll_s)

    async def _try_elect(self) -> bool:
        if self.lease is not None and not await self.lease.try_acquire():
            return False
        try:
            seqs = await self.log.snapshot_seqs()
            if seqs and seqs[-1] > self.state.last_seq:
                # fell behind a log truncation: writing "our" next entry could land on a deleted key
                self.state = await self.log.load()
                return False
            records: list[r.Record] = [
                r.ControllerElected(self.controller_id, self.url, self.state.term + 1, wall_ms())
            ]
            if not self.state.cluster_id:
                records.append(r.ClusterInitialized(self.cluster_id))
            seq = self.state.last_seq + 1
            self._append_started = time.monotonic()
            try:
                await self.log.append(seq, self.controller_id, records)
            finally:
                self._append_started = None
            self._store_ok(wrote=True)
        except LogConflictError:
            return False
        except (ObjectStoreError, LogCorruptError) as exc:
            log.warning("controller %d: election attempt failed: %s", self.controller_id, exc)
            self._store_failed("writing the election entry", exc, write=True)
            return False
        for rec in records:
            self.state.apply(rec)
        self.state.last_seq = seq
        self.role = Role.LEADER
        self.metrics.elections.inc()
        log.info("controller %d is the leader (term %d, log seq %d)", self.controller_id, self.state.term, seq)
        return True

    # ------------------------------------------------------------------ leader

    async def _lead(self) -> None:
        self.metrics.role.set(1)
        now = time.monotonic()
        # every broker gets a full session from the new leader: heartbeats went to the old one
        self._sessions = {
            b.node_id: now + self.session_timeout_ms / 1000 for b in self.state.brokers.values() if b.state != "fenced"
        }
        self._ack_leases = {}
        self._ack_leases_unknown_until = now + self.max_ack_lease_ms / 1000
        self._inherited_leases = set(self.state.brokers)
        self._publish()
        self._became_leader.set()
        timers = [
            asyncio.create_task(self._session_loop(), name="controller-sessions"),
            asyncio.create_task(self._gc_loop(), name="controller-gc"),
        ]
        if self.lease is not None:
            timers.append(asyncio.create_task(self._lease_loop(), name="controller-lease"))
        try:
            await self._commit_loop()
        finally:
            for task in timers:
                task.cancel()
            await asyncio.gather(*timers, return_exceptions=True)
            self._became_leader.clear()

    async def _commit_loop(self) -> None:
        renew_s = self.config.renew_interval_ms / 1000
        limit = self.config.max_batch_commands
        term = self.state.term
        while self.role is Role.LEADER:
            if self._resigning:
                self._step_down("resigned")
                return
            try:
                first = await asyncio.wait_for(self._queue.get(), renew_s)
            except TimeoutError:
                if self.lease is not None:
                    continue  # the Lease says we are alive; no heartbeat entries (PUTs cost money)
                first = _Pending(lambda tx: tx.emit(r.LeaderHeartbeat(term, tx.now_ms)), None)
            batch = [first]
            while len(batch) < limit and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._commit(batch)

    async def _commit(self, batch: list[_Pending]) -> None:
        records: list[r.Record] = []
        outcomes: list[tuple[bool, Any]] = []
        self._writing = True
        now = wall_ms()
        for pending in batch:
            tx = Tx(self.state, now, records)
            try:
                outcomes.append((True, pending.fn(tx)))
            except MetadataError as exc:
                outcomes.append((False, exc))
            except Exception as exc:
                log.exception("controller %d: request failed", self.controller_id)
                outcomes.append((False, MetadataError(f"internal controller error: {type(exc).__name__}: {exc}")))
        if records:
            seq = self.state.last_seq + 1
            started = time.perf_counter()
            self._append_started = time.monotonic()
            try:
                await self.log.append(seq, self.controller_id, records)
                self._store_ok(wrote=True)
            except BaseException as exc:
                self._append_started = None
                if isinstance(exc, (ObjectStoreError, LogCorruptError)):
                    self._store_failed(f"writing metadata log entry {seq}", exc, write=True)
                self._writing = False
                self._step_down(f"log entry {seq} failed: {type(exc).__name__}: {exc}")
                err = self._not_controller()
                for pending in batch:
                    if pending.future is not None and not pending.future.done():
                        pending.future.set_exception(err)
                if isinstance(exc, (LogConflictError, ObjectStoreError)):
                    return
                raise
            self._append_started = None
            self.state.last_seq = seq
            self.metrics.commit_seconds.observe(time.perf_counter() - started)
            self.metrics.last_seq.set(seq)
            self._entries_since_snapshot += 1
        self._writing = False
        self.metrics.batch_commands.observe(len(batch))
        for pending, (ok, value) in zip(batch, outcomes, strict=False):
            self.metrics.requests.labels("ok" if ok else getattr(value, "code", "error")).inc()
            if pending.future is None or pending.future.done():
                continue
            if ok:
                pending.future.set_result(value)
            else:
                pending.future.set_exception(value)
        if any(r.is_visible(rec) for rec in records):
            self._publish()
        if records:  # e.g. a stream opened: await_applied re-checks (not visible in images)
            self._committed.set()
            self._committed = asyncio.Event()
        if self._entries_since_snapshot >= self.config.snapshot_interval_entries:
            self._start_snapshot()

    def _step_down(self, reason: str) -> None:
        if self.role is Role.LEADER:
            log.warning("controller %d steps down: %s", self.controller_id, reason)
        if self.role is not Role.STOPPED:
            self.role = Role.STANDBY
        self.metrics.role.set(0)
        self._dirty = True  # applied records may not be in the log: rebuild from it
        self._fail_queued()
        self._image_changed.set()

    def _fail_queued(self) -> None:
        err = self._not_controller()
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if pending.future is not None and not pending.future.done():
                pending.future.set_exception(err)

    def _not_controller(self) -> NotControllerError:
        leader = self.state.controller_url if self.state.controller_id != self.controller_id else None
        err = NotControllerError(
            f"controller {self.controller_id} is not the active controller"
            + (f"; the leader is at {leader}" if leader else "; a new leader is being elected")
        )
        err.leader_url = leader  # type: ignore[attr-defined]
        return err

    def _start_snapshot(self) -> None:
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return
        self._entries_since_snapshot = 0
        seq = self.state.last_seq
        data = self.log.encode_snapshot(self.state)  # now, while the state is exactly entry `seq`

        async def write() -> None:
            try:
                await self.log.write_snapshot(seq, data)
                await self.log.truncate()
            except ObjectStoreError as exc:
                log.warning("controller %d: snapshot %d failed: %s", self.controller_id, seq, exc)

        self._snapshot_task = asyncio.create_task(write(), name="controller-snapshot")

    async def _lease_loop(self) -> None:
        """Keep the Lease while leading; give up leadership once it could not be renewed for
        a whole lease timeout (another controller may hold it by now)."""
        assert self.lease is not None
        renewed = time.monotonic()
        while self.role is Role.LEADER:
            await asyncio.sleep(self.config.renew_interval_ms / 1000)
            if await self.lease.try_acquire():
                renewed = time.monotonic()
            elif time.monotonic() - renewed > self.config.lease_timeout_ms / 1000:
                self._step_down("lost the Kubernetes Lease")
                return

    async def _session_loop(self) -> None:
        interval = max(0.05, min(1.0, self.session_timeout_ms / 4000))
        while self.role is Role.LEADER:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for b in list(self.state.brokers.values()):
                if b.state == "fenced":
                    self._sessions.pop(b.node_id, None)
                    continue
                deadline = self._sessions.setdefault(b.node_id, now + self.session_timeout_ms / 1000)
                if deadline < now:
                    node_id, epoch = b.node_id, b.node_epoch

                    def fence(tx: Tx, node_id: int = node_id, epoch: int = epoch) -> None:
                        cur = tx.state.brokers.get(node_id)
                        if cur is None or cur.node_epoch != epoch or cur.state == "fenced":
                            return  # re-registered or fenced meanwhile
                        if self._sessions.get(node_id, 0.0) >= time.monotonic():
                            return  # it heartbeated while this fence waited (e.g. behind a stalled write)
                        log.warning(
                            "controller: node %d missed its session (%d ms); fencing it",
                            node_id,
                            self.session_timeout_ms,
                        )
                        self.metrics.brokers_fenced.inc()
                        commands.fence_broker(tx, node_id)

                    self._sessions.pop(node_id, None)
                    try:
                        await self.execute(fence)
                    except MetadataError:
                        return

    async def _gc_loop(self) -> None:
        while self.role is Role.LEADER:
            await asyncio.sleep(self.config.gc_interval_ms / 1000)
            try:
                await self.collect_garbage()
            except NotControllerError:
                return
            except (MetadataError, ObjectStoreError) as exc:
                log.warning("controller %d: garbage collection failed: %s", self.controller_id, exc)

    async def collect_garbage(self) -> int:
        """One GC round: expire prepared ids, then delete objects marked for deletion longer
        than the retention ago, and record that they are gone. Returns how many were deleted."""
        await self.execute(commands.expire_prepared)
        await self.execute(users.remove_expired_delegation_tokens)
        ids = await self.read(lambda st: commands.deletable_objects(st, wall_ms(), self.gc_retention_ms))
        if not ids:
            return 0
        # delete first, record after: a crash in between only repeats an idempotent delete
        await self.store.delete_many([object_key(i) for i in ids])
        await self.execute(lambda tx: commands.objects_destroyed(tx, ids))
        self.metrics.objects_deleted.inc(len(ids))
        return len(ids)

    # ------------------------------------------------------------------ API for the server

    def _require_leader(self) -> None:
        if self.role is not Role.LEADER:
            raise self._not_controller()

    async def execute(self, fn: Callable[[Tx], T]) -> T:
        """Run a command on the leader; returns once its records are durable."""
        self._require_leader()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(fn, future))
        return await future

    async def read(self, fn: Callable[[MetadataState], T]) -> T:
        """Answer from durable state only (see module docstring)."""
        self._require_leader()
        if not self._writing:
            return fn(self.state)
        return await self.execute(lambda tx: fn(tx.state))

    async def broker_sessions(self) -> list[dict]:
        """Each registered broker's state and how long ago this leader last heard from it.

        The operator asks this before fencing a broker whose Kubernetes node looks lost: one
        signal alone (the node's status, which an API-server partition can fake) must not fence
        a broker that still heartbeats. A new leader gives every broker a full session, so its
        ages start at 0: it never vouches for a silence it did not observe."""
        brokers = await self.read(lambda st: list(st.brokers.values()))
        now = time.monotonic()
        out = []
        for b in brokers:
            deadline = self._sessions.get(b.node_id)
            age_ms = None if deadline is None else max(0, int(self.session_timeout_ms - (deadline - now) * 1000))
            out.append({"node_id": b.node_id, "node_epoch": b.node_epoch, "state": b.state, "heartbeat_age_ms": age_ms})
        return out

    def touch_session(self, node_id: int) -> None:
        self._sessions[node_id] = time.monotonic() + self.session_timeout_ms / 1000

    async def register_broker(self, node_id: int, endpoints, rack) -> int:
        if node_id in self.state.brokers:
            await self.ack_lease_expired(node_id)  # a newer epoch: its recovery reads the WAL
        epoch = await self.execute(lambda tx: commands.register_broker(tx, node_id, endpoints, rack))
        self._inherited_leases.discard(node_id)  # any older incarnation's lease has run out
        self.touch_session(node_id)
        return epoch

    async def unregister_broker(self, node_id: int, node_epoch: int) -> None:
        await self.execute(lambda tx: commands.unregister_broker(tx, node_id, node_epoch))
        # it unregisters after closing its WAL and listeners: it acknowledges nothing more
        self._ack_leases.pop(node_id, None)

    async def claim_wal_recovery(self, job_id: int, node_id: int, node_epoch: int) -> int:
        job = self.state.jobs.get(job_id)
        if job is not None and job.state != "claimed":
            await self.ack_lease_expired(job.node_id)
        return await self.execute(lambda tx: commands.claim_wal_recovery(tx, job_id, node_id, node_epoch))

    def grant_ack_lease(self, node_id: int, requested_ms: int) -> int:
        """A lease for the broker that just registered or heartbeated (0: it asked for none).
        Counted from now, after the broker sent its request, so it runs out here last."""
        if requested_ms <= 0:
            return 0
        granted = min(requested_ms, self.max_ack_lease_ms)
        until = time.monotonic() + granted / 1000
        if until > self._ack_leases.get(node_id, 0.0):
            self._ack_leases[node_id] = until
        return granted

    async def ack_lease_expired(self, node_id: int) -> None:
        """Wait until no incarnation of the node can still acknowledge a write (its lease,
        or one the previous leader may have granted, ran out): only then may a newer epoch
        of it be issued, whose holder reads the node's WAL. Without it a broker frozen past
        its fence would, once resumed, acknowledge records written after that read."""
        until = self._ack_leases.get(node_id, 0.0)
        if node_id in self._inherited_leases:
            until = max(until, self._ack_leases_unknown_until)
        delay = until - time.monotonic()
        if delay > 0:
            log.info(
                "node %d may still hold an acknowledgement lease: a newer epoch in %.2fs, once it has run out",
                node_id,
                delay,
            )
            await asyncio.sleep(delay + 0.01)

    async def heartbeat(self, node_id: int, node_epoch: int) -> str:
        """Answered from memory, never behind a log write: a broker's liveness must not
        depend on object-store latency. (The in-memory state may hold a fence that is not
        durable yet; telling that broker early is harmless: it exits and registers again.)"""
        self._require_leader()
        state = commands.check_node(self.state, node_id, node_epoch).state
        self.touch_session(node_id)
        return state

    def _publish(self) -> None:
        self._image = self.state.image()
        self.metrics.version.set(self._image.version)
        self._image_changed.set()
        self._image_changed = asyncio.Event()

    async def watch(self, since_version: int, timeout_ms: int, node_id: int = -1) -> MetadataImage:
        """The image once its version > since_version (or at the timeout). A broker watching
        from `since_version` has applied that version: noted, for `await_applied`."""
        self._require_leader()
        if node_id >= 0 and since_version > self._applied.get(node_id, -1):
            self._applied[node_id] = since_version
            self._applied_changed.set()
            self._applied_changed = asyncio.Event()
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            image = self._image
            if image is not None and image.version > since_version:
                return image
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return image if image is not None else self.state.image()
            changed = self._image_changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                pass
            self._require_leader()

    async def await_applied(self, version: int, timeout_ms: int, topics: tuple[str, ...] = ()) -> dict[str, list]:
        """Wait until every live broker has applied image `version` and every partition of
        `topics` that has a leader is open on it (its stream held by the leader under the
        leader epoch), or the timeout. Returns what is still missing: {"laggards": [node ids],
        "unopened": [[topic, partition], ...]} (both empty when done). CreateTopics and
        CreatePartitions answer after this, so create-then-use works on any broker."""
        self._require_leader()
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            state = self.state
            laggards = sorted(
                b.node_id
                for b in state.brokers.values()
                if b.state != "fenced" and self._applied.get(b.node_id, -1) < version
            )
            unopened = []
            for name in topics:
                t = state.topics.get(name)
                for p in t.partitions if t is not None else ():
                    s = state.streams.get(p.stream_id)
                    if p.leader >= 0 and (
                        s is None or s.state != "open" or s.owner != p.leader or s.epoch != p.leader_epoch
                    ):
                        unopened.append([name, p.partition])
            remaining = deadline - time.monotonic()
            if (not laggards and not unopened) or remaining <= 0:
                return {"laggards": laggards, "unopened": unopened}
            waits = [asyncio.ensure_future(e.wait()) for e in (self._applied_changed, self._committed)]
            try:
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            self._require_leader()
