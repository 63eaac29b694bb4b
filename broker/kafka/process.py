"""The broker process: `automq broker --config FILE` ends up in `run_broker`.

Start-up order (each step only after the previous one succeeded):
1. bind the Kafka listeners (port 0 resolves to a real port) and serve HTTP: /healthz is
   200 from now on, /readyz 503 until step 5;
2. register with the controller → node epoch (higher than any before: older incarnations of
   this node are fenced from now on);
3. start the storage engine with the controller as its StreamManager/ObjectManager: WAL
   recovery (replay, upload, commit) happens here, before any request is served;
4. follow metadata (first image), open the partitions this node leads;
5. accept Kafka connections, heartbeat; /readyz turns 200.

A heartbeat answered "fenced" means the controller gave this node's partitions away: the
process exits non-zero so its supervisor (local mode, Kubernetes) restarts it with a new epoch.
SIGTERM/SIGINT: stop accepting, answer in-flight requests, close partitions (flush + upload),
close the storage engine, unregister, exit 0 — within `shutdown_timeout_ms` (2 s when the
controller does not answer, at once when fenced); past that the engine stops without
uploading: acknowledged data is durable in the WAL and replayed by the next start.

`BrokerService` is the same thing embeddable in tests (start/stop in one event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest

from automq.broker.config import NodeConfig, check_broker_config
from automq.broker.controller.protocol import METRICS_LISTENER, Endpoint
from automq.broker.kafka.broker import Broker, advertised_endpoints
from automq.broker.kafka.codec.preload import preload_schemas
from automq.broker.kafka.server import KafkaServer
from automq.broker.malloc import HeapCollector
from automq.broker.node import freeze_startup_heap, run_node
from automq.broker.storage.ack_lease import AckLease
from automq.broker.storage.metadata import NodeFencedError

if TYPE_CHECKING:
    from automq.broker.controller.client import ControllerClient
    from automq.broker.kafka.retention import RetentionTask
    from automq.broker.objectstore import ObjectStore
    from automq.broker.storage.engine import StorageEngine

log = logging.getLogger(__name__)


class BrokerService:
    def __init__(self, config: NodeConfig) -> None:
        check_broker_config(config)
        self.config = config
        self.registry = CollectorRegistry()
        # process_cpu_seconds_total & co.: the balancer and autoscaler read CPU from here
        ProcessCollector(registry=self.registry)
        HeapCollector(self.registry)
        self.server = KafkaServer(config=config)
        self.cluster: ControllerClient | None = None
        self.object_store: ObjectStore | None = None
        self.storage: StorageEngine | None = None
        self.broker: Broker | None = None
        self.http_port = 0
        self.fatal: str | None = None
        self._http: web.AppRunner | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.ack_lease: AckLease | None = None
        self.retention: RetentionTask | None = None  # time/size retention of led partitions
        self._wal_recovery: asyncio.Task[None] | None = None  # S3 WAL: recover fenced brokers' WALs
        self._failed = asyncio.Event()
        self._ready = {"registered": False, "storage_recovered": False, "metadata_received": False, "serving": False}

    # ---------------------------------------------------------------- properties

    @property
    def kafka_ports(self) -> dict[str, int]:
        return dict(self.server.bound_ports)

    @property
    def bootstrap(self) -> str:
        endpoint = advertised_endpoints(self.config, self.server.bound_ports)[0]
        return f"{endpoint.host}:{endpoint.port}"

    @property
    def http_host(self) -> str:
        """The host other machines reach this broker's HTTP endpoint at (the balancer scrapes it)."""
        host = self.config.http_host
        if host in ("0.0.0.0", "::", ""):
            host = (
                advertised_endpoints(self.config, self.server.bound_ports)[0].host
                if self.config.listeners
                else "127.0.0.1"
            )
        return host

    @property
    def metrics_url(self) -> str:
        host = self.http_host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}/metrics"

    @property
    def ready(self) -> bool:
        return all(self._ready.values()) and self.fatal is None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        from automq.broker.controller.client import ControllerClient
        from automq.broker.objectstore import open_object_store
        from automq.broker.security.controller_auth import ControllerClientAuth
        from automq.broker.storage.engine import StorageEngine

        config = self.config
        ports = self.server.bind()
        await self._start_http()
        self.cluster = ControllerClient(config.controller_urls, auth=ControllerClientAuth.from_config(config))
        endpoints = [*advertised_endpoints(config, ports), Endpoint(METRICS_LISTENER, self.http_host, self.http_port)]
        # acknowledge only while the controller vouches for this node (storage/ack_lease.py):
        # three heartbeats' worth, so one slow heartbeat does not hold acknowledgements
        self.ack_lease = AckLease(max(3 * config.heartbeat_interval_ms, 1000))
        node_epoch = await self.cluster.register_broker(config.node_id, endpoints, config.rack, lease=self.ack_lease)
        self._ready["registered"] = True
        log.info("broker %d registered with node epoch %d, endpoints %s", config.node_id, node_epoch, endpoints)
        # Heartbeats start now, not after recovery: replaying and uploading a full WAL can take
        # longer than the session timeout, and a broker fenced for it while starting would be
        # restarted only to be fenced again (seen in the fault soak).
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._heartbeat_loop(node_epoch), name="broker-heartbeat"
        )

        self.object_store = open_object_store(config.object_store_url)
        self.storage = StorageEngine(
            config, self.object_store, self.cluster, self.cluster, config.node_id, node_epoch, registry=self.registry
        )
        self.storage.wal.on_failed = self._wal_failed
        self.storage.ack_lease = self.ack_lease
        started = time.monotonic()
        await self.storage.start()
        self._ready["storage_recovered"] = True
        log.info("storage engine recovered in %.2fs", time.monotonic() - started)

        self.broker = Broker(
            config, node_epoch=node_epoch, cluster=self.cluster, storage=self.storage, registry=self.registry
        )
        self.broker.metrics_url = self.metrics_url
        self.server.broker = self.broker
        await self.broker.start()
        self._ready["metadata_received"] = True
        from automq.broker.kafka.retention import start_retention

        self.retention = start_retention(self.broker)
        if config.wal.kind == "s3":
            # Every broker can read every S3 WAL, so a live one recovers a fenced broker's
            # (a volume WAL lives on the dead node's disk: the operator handles those).
            from automq.broker.controller.recovery_worker import WalRecoveryWorker

            worker = WalRecoveryWorker(self.cluster, self.object_store, config.node_id, node_epoch, config.storage)
            self._wal_recovery = asyncio.get_running_loop().create_task(worker.run(), name="wal-recovery-worker")
        await self.server.start()
        self._ready["serving"] = True
        log.info("broker %d serving Kafka on %s", config.node_id, self.bootstrap)

    async def _heartbeat_loop(self, node_epoch: int) -> None:
        interval = self.config.heartbeat_interval_ms / 1000.0
        node_id = self.config.node_id
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.cluster.heartbeat(node_id, node_epoch, lease=self.ack_lease)  # type: ignore[union-attr]
                last_ok = time.monotonic()
            except NodeFencedError as exc:
                if self.ack_lease is not None:
                    self.ack_lease.revoke(str(exc))  # appends waiting for a renewal fail now
                self.fatal = f"fenced by the controller: {exc}"
                log.error(
                    "broker %d epoch %d was fenced (%s); exiting so the supervisor restarts it",
                    node_id,
                    node_epoch,
                    exc,
                )
                self._failed.set()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat failed (%s); last success %.1fs ago", exc, time.monotonic() - last_ok)

    def _wal_failed(self, exc: BaseException) -> None:
        """A write error stopped the WAL: every append fails from now on, so the partitions
        this broker leads cannot take a write. Exit (as Kafka halts when its last log
        directory fails): the supervisor restarts the broker, whose WAL replay brings back
        everything acknowledged, or, if the disk is gone, the node is replaced."""
        if self.fatal is None:
            self.fatal = f"WAL failed: {exc!r}"
            log.error("broker %d: %s; exiting so the supervisor restarts it", self.config.node_id, self.fatal)
            self._failed.set()

    async def wait_failed(self) -> None:
        await self._failed.wait()

    async def stop(self, timeout: float = 10.0) -> None:
        """Graceful within `shutdown_timeout_ms` (2 s when the controller has not answered a
        heartbeat lately: nothing could be committed or handed over): stop accepting, finish
        in-flight requests, close partitions (flush + upload), close the engine, unregister.
        Whatever is still running then is abandoned: what it acknowledged is durable in the
        WAL, which the next start (or the WAL recovery of this node) replays; nothing that
        was not committed is trimmed. Appends waiting for WAL space fail at once."""
        self._ready["serving"] = False
        if self.storage is not None:
            self.storage.stop_waiting()
        budget = self.config.shutdown_timeout_ms / 1000
        if self.fatal is not None:
            # fenced: it may commit nothing more (its WAL goes to whoever recovers it) and its
            # partitions are led elsewhere already; or its WAL failed: nothing can be flushed.
            # Nothing graceful is left to do
            budget = 0.0
        elif not await self._controller_reachable():
            budget = min(budget, 2.0)
        graceful = asyncio.ensure_future(self._stop_gracefully(timeout))
        done, _ = await asyncio.wait({graceful}, timeout=budget) if budget > 0 else (set(), None)
        if not done:
            if self.fatal is None:
                log.warning(
                    "graceful stop did not finish within %.1fs (controller or object store unreachable?); exiting "
                    "now: acknowledged data not uploaded yet stays in the WAL for the next start",
                    budget,
                )
            else:
                log.warning("%s: stopping at once; the WAL keeps what was not uploaded for its recovery", self.fatal)
            graceful.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await graceful
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.stop(0.5), 2.0)
            if self.storage is not None:
                try:
                    await self.storage.abort()
                except Exception:
                    log.exception("closing the storage engine failed")
        await self._cancel_heartbeat()
        if self.cluster is not None:
            await self.cluster.close()
        if self.object_store is not None:
            try:
                await asyncio.wait_for(self.object_store.close(), 5.0)  # a hung store must not hold the exit
            except Exception:
                log.exception("closing the object store failed")
        if self._http is not None:
            await self._http.cleanup()
            self._http = None

    async def _controller_reachable(self) -> bool:
        """One quick heartbeat: without a controller no upload can be committed, no partition
        handed over and nobody deregistered, so the graceful steps could only wait."""
        if self.cluster is None or self.broker is None:
            return False
        try:
            await asyncio.wait_for(self.cluster.heartbeat(self.config.node_id, self.broker.node_epoch), 1.5)
        except NodeFencedError:
            return True  # it answers (and fenced steps fail fast)
        except Exception as exc:
            log.warning("the controller does not answer (%s): stopping without handing anything over", exc)
            return False
        return True

    async def _cancel_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeat

    async def _stop_gracefully(self, timeout: float) -> None:
        """Each step runs even if an earlier one failed."""
        if self._wal_recovery is not None:
            self._wal_recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._wal_recovery
        steps = [("kafka listeners", self.server.stop(timeout))]
        if self.retention is not None:
            steps.append(("retention", self.retention.close()))
        if self.broker is not None:
            steps.append(("partitions", self.broker.close()))
        for name, step in steps:
            try:
                await step
            except Exception:
                log.exception("stopping %s failed", name)
        await self._cancel_heartbeat()
        if self.storage is not None:
            try:
                await self.storage.close()
            except Exception:
                log.exception("closing the storage engine failed")
        if self.cluster is not None and self.broker is not None and self.fatal is None:
            try:
                await self.cluster.unregister_broker(self.config.node_id, self.broker.node_epoch)
            except Exception as exc:
                log.warning("unregistering failed: %s", exc)

    # ---------------------------------------------------------------- HTTP

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._http = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._http.setup()
        site = web.TCPSite(self._http, self.config.http_host, self.config.http_port, reuse_address=True)
        await site.start()
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        if self.fatal is not None:
            return web.Response(status=503, text=f"fatal: {self.fatal}\n")
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.Response(text="ready\n")
        missing = [k for k, v in self._ready.items() if not v]
        text = f"not ready: {', '.join(missing) or self.fatal}\n"
        return web.Response(status=503, text=text)


async def _warm_up(served: dict[int, tuple[int, int]], stop: threading.Event) -> None:
    """Once serving: load every served schema on a worker thread (a lazy first load stalled
    the loop), then freeze what the schemas built out of garbage collection too. The start-up
    heap is frozen first, so the collections the loading triggers do not walk all of it."""
    log.debug("%d start-up objects frozen out of garbage collection", freeze_startup_heap())
    started = time.perf_counter()
    loaded = await asyncio.to_thread(preload_schemas, served, stop)
    log.debug("%d api versions' schemas loaded in %.2f s", loaded, time.perf_counter() - started)
    log.debug("%d objects frozen out of garbage collection after loading them", freeze_startup_heap())


async def serve(config: NodeConfig) -> int:
    service = BrokerService(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(service.start())
    stopping = asyncio.create_task(stop.wait())
    # heartbeats run during start-up (WAL recovery), so a fence can end it too
    failed = asyncio.create_task(service.wait_failed())
    done, _ = await asyncio.wait({starting, stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
    if starting not in done:
        starting.cancel()
        try:
            await starting
        except (asyncio.CancelledError, Exception):
            pass
        failed.cancel()
        await service.stop()
        return 3 if service.fatal is not None else 0
    if starting.exception() is not None:
        log.error("broker failed to start: %s", starting.exception(), exc_info=starting.exception())
        stopping.cancel()
        failed.cancel()
        await service.stop()
        return 1
    stop_warming = threading.Event()
    warming = asyncio.create_task(_warm_up(service.server.served, stop_warming))
    await asyncio.wait({stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
    stop_warming.set()
    for task in (stopping, failed, warming):
        task.cancel()
    await service.stop()
    return 3 if service.fatal is not None else 0


def run_broker(config: NodeConfig) -> None:
    """Blocking entry point; exits non-zero when start-up fails or the node was fenced."""
    run_node(config, serve, role="broker")
