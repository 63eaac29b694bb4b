"""Leader election between operator replicas: one coordination.k8s.io Lease, one active operator.

Two operator replicas (an upgrade's surge, or `replicas: 2` for a fast failover) must never both
act: two rolling restarts would take two brokers down at once, two node-loss recoveries would
race. kopf's peering only pauses operators by priority and keeps no lock, so the operator elects
a leader the way Kubernetes' own controllers do (client-go's leaderelection):

- The Lease `automq-operator` in the operator's namespace names the holder and the lease
  duration. A candidate creates it when missing (the API server's create is the arbiter: a
  second create gets 409) or takes it over once it saw no renewal for a whole lease duration,
  with a merge patch carrying the resourceVersion it read (a concurrent writer makes it 409).
- Expiry is judged on this replica's own monotonic clock (when it last saw the record change),
  never on the holder's `renewTime`: clocks of two machines need not agree.
- The leader renews every `retry_period_s` and counts itself leader only until
  `renew_deadline_s` after the start of its last successful renewal. That deadline is shorter
  than the lease duration, so a leader cut off from the API server stops acting before anyone
  else may take over: never two leaders at once, even across a network split.
- A leader that stops cleanly releases the Lease (holder cleared), so its successor starts at
  once instead of a lease duration later.

Everything that writes (the reconcile, node-loss and elastic loops, the delete handler, pod
labels) asks `is_leader()` first or waits in `wait_leading()`; watch-only handlers run on every
replica, so a new leader starts with warm caches.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from automq.operator.kube import KubeApi, KubeError

log = logging.getLogger(__name__)

LEASE_NAME = "automq-operator"


def default_identity() -> str:
    """The pod name (downward API) or host name, plus a random part: a restarted process is a
    new candidate, never mistaken for the one it replaces."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """The operator pod's namespace (downward API, or the service account's), else `default`."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _micro_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElection:
    api: KubeApi
    namespace: str
    identity: str = field(default_factory=default_identity)
    name: str = LEASE_NAME
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    clock: Callable[[], float] = time.monotonic  # callable from any thread (is_leader)
    on_change: Callable[[bool], None] | None = None
    _leading_until: float = float("-inf")
    _observed: tuple[Any, ...] | None = None
    _observed_at: float = float("-inf")
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _was_leader: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration")

    # -- what the handlers ask -----------------------------------------------------------------

    def is_leader(self) -> bool:
        return self.clock() < self._leading_until

    async def wait_leading(self, stopped: Any = None) -> bool:
        """Return True once this replica leads (False if `stopped` is set first)."""
        while not self.is_leader():
            if stopped is not None and stopped:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=self.retry_period_s)
            except TimeoutError:
                pass
        return True

    # -- the election loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Try to acquire or renew every retry period, until cancelled (then release)."""
        try:
            while True:
                try:
                    await self.try_acquire_or_renew()
                except Exception as exc:  # any API failure: not renewed; leadership ends at the deadline
                    log.warning("leader election: %s: %s", type(exc).__name__, exc)
                self._notify()
                await asyncio.sleep(self.retry_period_s)
        finally:
            await asyncio.shield(self.release())

    def _notify(self) -> None:
        leading = self.is_leader()
        if leading != self._was_leader:
            self._was_leader = leading
            log.info(
                "%s %s leadership (Lease %s/%s)",
                self.identity,
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
            )
            if self.on_change is not None:
                self.on_change(leading)
        self._changed.set()

    def _lease(self, now: dt.datetime, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration_s)),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }
        if acquired is not None:
            spec["acquireTime"] = acquired
        return spec

    async def try_acquire_or_renew(self) -> bool:
        started = self.clock()  # leadership counts from before the write, never from after it
        now = dt.datetime.now(dt.UTC)
        lease = await self.api.get("Lease", self.namespace, self.name)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._lease(now, 0, _micro_time(now)),
            }
            try:
                await self.api.create(body)
            except KubeError as exc:
                if exc.status == 409:  # another candidate created it first
                    return False
                raise
            return self._lead(started)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        if holder == self.identity:
            patch_spec = self._lease(now, int(spec.get("leaseTransitions") or 0))
        elif holder and started < self._observed_at + duration:
            self._leading_until = float("-inf")
            return False  # held by a live leader
        else:
            transitions = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
            patch_spec = self._lease(now, transitions, _micro_time(now))
        version = (lease.get("metadata") or {}).get("resourceVersion")
        try:
            await self.api.patch(
                "Lease",
                self.namespace,
                self.name,
                {"metadata": {"resourceVersion": version}, "spec": patch_spec},
            )
        except KubeError as exc:
            if exc.status == 409:  # someone else wrote it since we read it: not ours this round
                self._leading_until = float("-inf")
                return False
            raise
        return self._lead(started)

    def _lead(self, started: float) -> bool:
        self._leading_until = started + self.renew_deadline_s
        return True

    async def release(self) -> None:
        """Give the Lease up (only if still ours), so a successor needs not wait for expiry."""
        if not self._was_leader and not self.is_leader():
            return
        self._leading_until = float("-inf")
        self._notify()
        try:
            lease = await self.api.get("Lease", self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            version = (lease.get("metadata") or {}).get("resourceVersion")
            await self.api.patch(
                "Lease",
                self.namespace,
                self.name,
                {"metadata": {"resourceVersion": version}, "spec": {"holderIdentity": None, "renewTime": None}},
            )
            log.info("%s released Lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, exc)
