"""What fault tests (tests/faults/) and benchmarks/fault_soak.py share: real processes to
break, a store that misbehaves on purpose, and a producer/reader pair that counts what a
fault cost.

- `ProcessCluster`: one controller and N brokers as separate `automq` processes (the same
  commands Kubernetes runs), each config written by us so a test can shrink the WAL, use the
  S3 WAL, shorten the session timeout or point the object store at a `FaultProxy`. Like a
  kubelet, a supervisor thread restarts any node that exits (killed, or exiting on its own
  after being fenced) unless the test holds it down (`kill9(name, restart=False)`,
  `terminate`); `pause`/`resume` send SIGSTOP/SIGCONT.
- `FaultProxy`: an HTTP reverse proxy in front of an S3 endpoint (SeaweedFS) that can pass,
  `stall` every request, `throttle` (503 SlowDown, as S3 throttles), `drop_replies` (the
  request reaches the store and takes effect, the reply never comes back) and `heal`.
- `SequenceProducer`: acks=all idempotent producer (confluent-kafka or kafka-python) in a
  thread, writing `<run>:<partition>:<seq>` values with dense per-partition sequences; it
  remembers every acknowledged (partition, seq, offset) and when it was acknowledged, and
  measures how long after a fault every partition acknowledges new data again
  (`time_to_serve_again`).
- `verify`: reads every partition from the start and reports acknowledged-but-missing,
  duplicated and reordered records, and acknowledgements at an offset that holds something
  else (`Verdict`). Tests assert on the counts; times are printed, never asserted.

Import it from a test module under tests/faults (its conftest puts this folder on sys.path):
`from faultkit import ProcessCluster, FaultProxy, SequenceProducer, verify`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automq.broker import local
from automq.broker.config import Listener, NodeConfig, dump_config

log = logging.getLogger("faultkit")

READY_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- processes


@dataclass
class NodeProcess:
    name: str  # "controller", "broker-1"
    role: str  # "controller" | "broker"
    node_id: int
    config_path: Path
    log_path: Path
    http_port: int
    kafka_port: int | None
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    supervised: bool = False  # restarted by the supervisor when it exits
    restarts: int = 0

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class ProcessCluster:
    """A controller and `brokers` broker processes on 127.0.0.1 (see module docstring).

    `overrides` are NodeConfig fields applied to every node (e.g. {"session_timeout_ms": 3000,
    "wal": {"capacity": 4 << 20}}); nested sections merge with the defaults.
    """

    def __init__(
        self,
        data_dir: Path,
        object_store_url: str,
        brokers: int = 2,
        overrides: dict[str, Any] | None = None,
        first_port: int | None = None,
        node_overrides: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.object_store_url = object_store_url
        self.overrides = overrides or {}
        # per node name, applied after `overrides` (e.g. the controller on a direct store URL)
        self.node_overrides = node_overrides or {}
        self.nodes: dict[str, NodeProcess] = {}
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._supervisor: threading.Thread | None = None
        port = first_port if first_port is not None else local.free_port_block(brokers)
        taken = set(range(port, port + brokers))
        for sub in ("config", "logs"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        controller_http = local.free_port(avoid=taken)
        taken.add(controller_http)
        self.controller_url = f"http://127.0.0.1:{controller_http}"
        self._add_node("controller", "controller", 0, controller_http, None)
        for i in range(1, brokers + 1):
            http = local.free_port(avoid=taken)
            taken.add(http)
            self._add_node(f"broker-{i}", "broker", i, http, port + i - 1)
        self.bootstrap = ",".join(f"127.0.0.1:{n.kafka_port}" for n in self.brokers)

    def _add_node(self, name: str, role: str, node_id: int, http_port: int, kafka_port: int | None) -> None:
        raw: dict[str, Any] = {
            "node_id": node_id,
            "data_dir": str(self.data_dir / name),
            "object_store_url": self.object_store_url,
            "controller_urls": [self.controller_url],
            "http_host": "127.0.0.1",
            "http_port": http_port,
            "listeners": [Listener(host="127.0.0.1", port=kafka_port).model_dump()] if kafka_port else [],
        }
        for overrides in (self.overrides, self.node_overrides.get(name, {})):
            for key, value in overrides.items():
                if isinstance(value, dict):
                    raw[key] = {**raw.get(key, {}), **value}
                else:
                    raw[key] = value
        config = NodeConfig.model_validate(raw)
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "config" / f"{name}.yaml"
        path.write_text(dump_config(config))
        self.nodes[name] = NodeProcess(
            name, role, node_id, path, self.data_dir / "logs" / f"{name}.log", http_port, kafka_port
        )

    @property
    def brokers(self) -> list[NodeProcess]:
        return [n for n in self.nodes.values() if n.role == "broker"]

    def broker(self, node_id: int) -> NodeProcess:
        return self.nodes[f"broker-{node_id}"]

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> ProcessCluster:
        for node in self.nodes.values():
            self.spawn(node.name)
        for node in self.nodes.values():
            self.wait_ready(node.name)
        self._supervisor = threading.Thread(target=self._supervise, name="cluster-supervisor", daemon=True)
        self._supervisor.start()
        return self

    def _supervise(self) -> None:
        while not self._closing.wait(0.2):
            with self._lock:
                for node in self.nodes.values():
                    if node.supervised and node.process is not None and node.process.poll() is not None:
                        log.info("%s exited with %s; restarting it", node.name, node.process.returncode)
                        node.restarts += 1
                        self.spawn(node.name)

    def spawn(self, name: str) -> None:
        node = self.nodes[name]
        assert not node.alive, f"{name} is already running"
        node.supervised = True
        with open(node.log_path, "ab", buffering=0) as out:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} starting {name}\n".encode())
            node.process = subprocess.Popen(
                [sys.executable, "-m", "automq.broker.cli", node.role, "--config", str(node.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                # die with the test process, however it ends (a node spawned by the supervisor
                # thread dies with that thread, which lives until stop())
                preexec_fn=local._die_with_launcher if sys.platform == "linux" else None,
            )
        node.paused = False

    def is_ready(self, name: str) -> bool:
        return local.http_ready(self.nodes[name].http_port)

    def wait_ready(self, name: str, timeout: float = READY_TIMEOUT_S) -> float:
        """Seconds until the node answers /readyz 200; fails with its log tail otherwise."""
        node = self.nodes[name]
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if not node.supervised and node.process is not None and node.process.poll() is not None:
                raise AssertionError(f"{name} exited with {node.process.returncode}:\n{self.log_tail(name)}")
            if self.is_ready(name):
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"{name} not ready after {timeout:.0f}s:\n{self.log_tail(name)}")

    def kill9(self, name: str, restart: bool = True) -> None:
        """SIGKILL; the supervisor starts it again unless restart=False (then `restart` does)."""
        node = self.nodes[name]
        with self._lock:
            node.supervised = restart
            if node.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)
                node.process.wait()  # type: ignore[union-attr]
            node.paused = False
            if restart:
                node.restarts += 1
                self.spawn(name)

    def restart(self, name: str, wait: bool = True) -> float:
        """Start a node held down (or kill -9 it and start it again); returns the seconds
        until ready (0 if not waited)."""
        with self._lock:
            self.kill9(name, restart=False)
            self.nodes[name].restarts += 1
            self.spawn(name)
        return self.wait_ready(name) if wait else 0.0

    def pause(self, name: str) -> None:
        os.kill(self.nodes[name].pid, signal.SIGSTOP)
        self.nodes[name].paused = True

    def resume(self, name: str) -> None:
        os.kill(self.nodes[name].pid, signal.SIGCONT)
        self.nodes[name].paused = False

    def terminate(self, name: str, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        node = self.nodes[name]
        node.supervised = False
        if not node.alive:
            return node.process.returncode if node.process else None
        if node.paused:
            self.resume(name)
        node.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        try:
            return node.process.wait(timeout)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill9(name)
            return None

    def stop(self) -> None:
        """Brokers first (they hand partitions back), then the controller; kill stragglers."""
        self._closing.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        for node in self.brokers:
            self.terminate(node.name, timeout=30)
        self.terminate("controller", timeout=15)

    def kill_all(self) -> None:
        self._closing.set()
        for name in self.nodes:
            with contextlib.suppress(Exception):
                self.kill9(name, restart=False)

    def __enter__(self) -> ProcessCluster:
        try:
            return self.start()
        except BaseException:
            self.kill_all()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.kill_all()

    # ---------------------------------------------------------------- Kafka-side helpers

    def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> dict[int, int]:
        """Create a topic and wait until every partition has a leader; returns {partition: leader}."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs or {})],
            operation_timeout=30,
        )
        futures[name].result(60)
        return self.leaders(name, partitions)

    def leaders(self, topic: str, partitions: int, timeout: float = 60.0) -> dict[int, int]:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                md = admin.list_topics(topic, timeout=5)
            except Exception as exc:  # a broker of the bootstrap list may be down right now
                last = exc
                time.sleep(0.2)
                continue
            t = md.topics.get(topic)
            if t is not None and t.error is None and len(t.partitions) == partitions:
                leaders = {p.id: p.leader for p in t.partitions.values()}
                if all(leader >= 0 for leader in leaders.values()):
                    return leaders
            last = t
            time.sleep(0.2)
        raise AssertionError(f"{topic}: not every partition has a leader after {timeout:.0f}s: {last}")

    def reassign(self, topic: str, partition: int, target: int) -> None:
        """Start moving a partition to broker `target` (Kafka's AlterPartitionReassignments,
        through kafka-python's admin client)."""
        from kafka import TopicPartition
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap.split(","), request_timeout_ms=30_000)
        try:
            admin.alter_partition_reassignments({TopicPartition(topic, partition): [target]}, timeout_ms=30_000)
        finally:
            admin.close()

    # ---------------------------------------------------------------- diagnostics

    def metric(self, name: str, metric: str) -> float:
        """Sum of the samples of a Prometheus metric (e.g. "automq_storage_wal_full_total")
        on a node's /metrics; 0 when absent or the node does not answer."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.nodes[name].http_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        total = 0.0
        for line in text.splitlines():
            if line.startswith(metric) and line[len(metric) : len(metric) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log_tail(self, name: str | None = None, lines: int = 30) -> str:
        out = []
        for node in self.nodes.values():
            if name is None or node.name == name:
                try:
                    text = node.log_path.read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    text = []
                out.append(f"--- {node.name}\n" + "\n".join(text))
        return "\n".join(out)

    def grep_logs(self, needle: str, lines: int = 20) -> list[str]:
        hits = []
        for node in self.nodes.values():
            with contextlib.suppress(OSError):
                hits += [
                    f"{node.name}: {x}" for x in node.log_path.read_text(errors="replace").splitlines() if needle in x
                ]
        return hits[-lines:]


# --------------------------------------------------------------------------- object store faults


def kill9_seaweedfs(server: Any) -> None:
    """SIGKILL a SeaweedFS (automq.broker.objectstore.seaweedfs.SeaweedFS) and its children;
    `server.start()` brings it back on the same ports and data."""
    process = server._process
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
    server.stop()  # forgets the process, closes its log


_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}


class FaultProxy:
    """HTTP reverse proxy for an S3 endpoint, with switchable faults (one at a time).

    The Host header is passed through unchanged, so SigV4 signatures made for the proxy's
    address still verify at the store. Runs its own event loop in a daemon thread.
    """

    def __init__(self, upstream: str, port: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self._port = port
        self.mode = "pass"  # pass | stall | throttle | drop
        self.probability = 1.0
        self.counts: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._healed: asyncio.Event | None = None
        self._runner: Any = None
        self._session: Any = None
        self._rng = random.Random(17)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def url_for(self, bucket: str) -> str:
        return f"s3://{bucket}?endpoint={self.endpoint}&region=us-east-1&path_style=true"

    # ---------------------------------------------------------------- control (any thread)

    def stall(self) -> None:
        """Hold every request (nothing reaches the store) until `heal`."""
        self._set("stall", 1.0)

    def throttle(self, probability: float = 0.5) -> None:
        """Answer this share of requests 503 SlowDown without forwarding them."""
        self._set("throttle", probability)

    def drop_replies(self, probability: float = 0.3) -> None:
        """Forward this share of requests, let them take effect, then cut the connection
        instead of replying (the client cannot tell whether its write happened)."""
        self._set("drop", probability)

    def heal(self) -> None:
        self._set("pass", 1.0)

    def _set(self, mode: str, probability: float) -> None:
        assert self._loop is not None, "proxy not started"

        def apply() -> None:
            self.mode, self.probability = mode, probability
            assert self._healed is not None
            if mode == "stall":
                self._healed.clear()
            else:
                self._healed.set()

        self._loop.call_soon_threadsafe(apply)
        self.counts[f"set:{mode}"] += 1

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FaultProxy:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def close(self) -> None:
        if self._loop is not None and self._thread is not None:
            self.heal()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        self._healed = asyncio.Event()
        self._healed.set()
        # a dropped reply is the point, not an error worth a traceback
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        self._port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        assert self._healed is not None
        self.counts["requests"] += 1
        if self.mode == "stall":
            self.counts["stalled"] += 1
            await self._healed.wait()
        if self.mode == "throttle" and self._rng.random() < self.probability:
            self.counts["throttled"] += 1
            await request.read()
            return web.Response(status=503, body=_SLOW_DOWN, content_type="application/xml")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            async with self._session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=headers,
                data=body if body else None,
                skip_auto_headers=("Content-Type", "User-Agent", "Accept", "Accept-Encoding"),
                allow_redirects=False,
            ) as upstream:
                payload = await upstream.read()
                status = upstream.status
                reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
        except Exception as exc:
            self.counts["upstream_errors"] += 1
            return web.Response(status=502, text=f"upstream failed: {exc}")
        if self.mode == "drop" and self._rng.random() < self.probability:
            self.counts["dropped"] += 1
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # nothing is written to the aborted connection
        if request.method == "HEAD":
            reply_headers["Content-Length"] = upstream.headers.get("Content-Length", "0")
            return web.Response(status=status, headers=reply_headers)
        return web.Response(status=status, body=payload, headers=reply_headers)


# --------------------------------------------------------------------------- produce and verify


@dataclass
class Ack:
    seq: int
    offset: int
    sent: float  # monotonic time produce() was called
    acked: float  # monotonic time the ack arrived


class SequenceProducer:
    """Produces `<run>:<partition>:<seq>` to every partition in turn, acks=all, idempotent,
    from a background thread, at up to `rate` records/s (gentle on a busy CI machine).

    client: "confluent" (librdkafka) or "kafka-python".
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        client: str = "confluent",
        rate: float = 400.0,
        delivery_timeout_s: float = 180.0,
        value_size: int = 0,
    ) -> None:
        if client not in ("confluent", "kafka-python"):
            raise ValueError(f"client must be 'confluent' or 'kafka-python', got {client!r}")
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.client = client
        self.rate = rate  # may be changed while running
        self.value_size = value_size  # pad values to this many bytes (fill a WAL faster)
        self.delivery_timeout_s = delivery_timeout_s
        self.run_id = uuid.uuid4().hex[:8]
        self.acks: dict[int, dict[int, Ack]] = {p: {} for p in range(partitions)}
        self.failed: list[tuple[int, int, str]] = []  # (partition, seq, error): outcome unknown
        self.sent = 0
        self._sent_at: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ack = [0.0] * partitions  # monotonic time of the newest ack per partition
        self._producer: Any = None

    def value(self, partition: int, seq: int) -> bytes:
        value = b"%s:%d:%010d" % (self.run_id.encode(), partition, seq)
        if self.value_size > len(value):
            value = b"#" * (self.value_size - len(value)) + value  # the seq stays last
        return value

    @property
    def acked(self) -> int:
        with self._lock:
            return sum(len(a) for a in self.acks.values())

    # ---------------------------------------------------------------- thread

    def start(self) -> SequenceProducer:
        self._producer = self._make_producer()
        self._thread = threading.Thread(target=self._run, name=f"seq-producer-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def _make_producer(self) -> Any:
        timeout_ms = int(self.delivery_timeout_s * 1000)
        if self.client == "confluent":
            from confluent_kafka import Producer

            return Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 5,
                    "message.timeout.ms": timeout_ms,
                    "retry.backoff.ms": 100,
                    "retry.backoff.max.ms": 1000,
                    "socket.timeout.ms": 10_000,
                }
            )
        from kafka import KafkaProducer

        return KafkaProducer(
            bootstrap_servers=self.bootstrap.split(","),
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            delivery_timeout_ms=timeout_ms,
            request_timeout_ms=10_000,
            retry_backoff_ms=100,
            max_in_flight_requests_per_connection=5,
        )

    def _on_ack(self, partition: int, seq: int, offset: int | None, error: str | None) -> None:
        now = time.monotonic()
        with self._lock:
            sent = self._sent_at.pop((partition, seq), now)
            if error is not None:
                self.failed.append((partition, seq, error))
                return
            if offset is None or offset < 0:
                self.failed.append((partition, seq, f"acknowledged without an offset ({offset})"))
                return
            self.acks[partition][seq] = Ack(seq, offset, sent, now)
            self._last_ack[partition] = now

    def _send(self, partition: int, seq: int) -> None:
        value = self.value(partition, seq)
        key = b"%d" % seq
        with self._lock:
            self._sent_at[(partition, seq)] = time.monotonic()
        if self.client == "confluent":

            def delivered(err: Any, msg: Any, partition: int = partition, seq: int = seq) -> None:
                if err is not None:
                    self._on_ack(partition, seq, None, str(err))
                else:
                    self._on_ack(partition, seq, msg.offset(), None)

            while not self._stop.is_set():
                try:
                    self._producer.produce(self.topic, value=value, key=key, partition=partition, on_delivery=delivered)
                    break
                except BufferError:
                    self._producer.poll(0.05)
            self._producer.poll(0)
        else:
            future = self._producer.send(self.topic, value=value, key=key, partition=partition)

            def ok(md: Any, partition: int = partition, seq: int = seq) -> None:
                self._on_ack(partition, seq, md.offset, None)

            def bad(exc: BaseException, partition: int = partition, seq: int = seq) -> None:
                self._on_ack(partition, seq, None, repr(exc))

            future.add_callback(ok)
            future.add_errback(bad)

    def _run(self) -> None:
        seqs = [0] * self.partitions
        next_at = time.monotonic()
        p = 0
        while not self._stop.is_set():
            try:
                self._send(p, seqs[p])
            except Exception as exc:  # kafka-python raises KafkaTimeoutError when its buffer is full
                with self._lock:
                    self._sent_at.pop((p, seqs[p]), None)
                log.debug("send failed before it was queued (%s); retrying the same sequence", exc)
                time.sleep(0.1)
                continue
            seqs[p] += 1
            self.sent += 1
            p = (p + 1) % self.partitions
            next_at += 1.0 / self.rate if self.rate > 0 else 0.0
            delay = next_at - time.monotonic()
            if delay > 0:
                if self.client == "confluent":
                    self._producer.poll(delay)
                else:
                    time.sleep(delay)
            elif delay < -1.0:
                next_at = time.monotonic()  # fell behind (fault): do not burst to catch up

    def stop(self, flush_timeout: float | None = None) -> None:
        """Stop producing and wait for every outstanding record's outcome."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._producer is None:
            return
        timeout = flush_timeout if flush_timeout is not None else self.delivery_timeout_s + 30
        if self.client == "confluent":
            self._producer.flush(timeout)
        else:
            self._producer.flush(timeout)
            self._producer.close(10)
        self._producer = None

    def __enter__(self) -> SequenceProducer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- measuring

    def describe(self) -> str:
        """Per-partition ack counts and the first delivery failures: diagnostics for asserts."""
        with self._lock:
            counts = {p: len(a) for p, a in self.acks.items()}
            failed = self.failed[:5]
        return f"{self.client} {self.topic}: acked per partition {counts}, sent {self.sent}, failed {len(self.failed)}: {failed}"

    def wait_acked(self, count: int, timeout: float = 60.0) -> int:
        """Block until at least `count` records are acknowledged in total; returns the count."""
        deadline = time.monotonic() + timeout
        while self.acked < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.acked

    def longest_ack_gap(self, since: float, until: float | None = None) -> float:
        """The longest time (seconds) any partition went without an acknowledgement in
        [since, until]: how long the fault kept some partition from serving, whatever the
        moment it was injected."""
        until = time.monotonic() if until is None else until
        worst = 0.0
        with self._lock:
            for acks in self.acks.values():
                times = sorted(a.acked for a in acks.values() if since <= a.acked <= until)
                edges = [since, *times, until]
                worst = max(worst, max(b - a for a, b in itertools.pairwise(edges)))
        return worst

    def time_to_serve_again(self, since: float, timeout: float = 120.0) -> float | None:
        """Seconds from `since` (monotonic, e.g. when a fault started or was healed) until
        every partition acknowledged a record sent at or after `since`; None on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                done = []
                for acks in self.acks.values():
                    first = min((a.acked for a in acks.values() if a.sent >= since), default=None)
                    done.append(first)
            if all(d is not None for d in done):
                return max(done) - since  # type: ignore[type-var, operator]
            time.sleep(0.1)
        return None


@dataclass
class Verdict:
    acked: int
    read: int
    missing: list[tuple[int, int]] = field(default_factory=list)  # (partition, seq) acked but not read
    duplicates: list[tuple[int, int]] = field(default_factory=list)  # read more than once
    reordered: list[tuple[int, int]] = field(default_factory=list)  # read after a higher seq
    wrong_offset: list[tuple[int, int]] = field(default_factory=list)  # acked offset holds another record
    unknown_outcome: int = 0  # delivery failed at the client: may or may not be in the log

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.reordered or self.wrong_offset)

    def summary(self) -> str:
        return (
            f"acked={self.acked} read={self.read} missing={len(self.missing)} duplicates={len(self.duplicates)} "
            f"reordered={len(self.reordered)} wrong_offset={len(self.wrong_offset)} unknown_outcome={self.unknown_outcome}"
        )


def verify(producer: SequenceProducer, timeout: float = 120.0) -> Verdict:
    """Read every partition of the producer's topic from offset 0 to its high watermark and
    compare with what was acknowledged (call after `producer.stop()`)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    prefix = producer.run_id.encode() + b":"
    consumer = Consumer(
        {
            "bootstrap.servers": producer.bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    seen: dict[int, list[tuple[int, int]]] = {p: [] for p in range(producer.partitions)}  # (offset, seq)
    deadline = time.monotonic() + timeout
    try:
        ends: dict[int, int] = {}
        for p in range(producer.partitions):
            while True:
                try:
                    ends[p] = consumer.get_watermark_offsets(TopicPartition(producer.topic, p), timeout=10)[1]
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        consumer.assign([TopicPartition(producer.topic, p, OFFSET_BEGINNING) for p in range(producer.partitions)])
        positions = dict.fromkeys(range(producer.partitions), 0)
        while any(positions[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            positions[msg.partition()] = msg.offset() + 1
            value = (msg.value() or b"").lstrip(b"#")
            if value.startswith(prefix):
                seen[msg.partition()].append((msg.offset(), int(value.rsplit(b":", 1)[1])))
    finally:
        consumer.close()
    verdict = Verdict(acked=0, read=sum(len(v) for v in seen.values()), unknown_outcome=len(producer.failed))
    for p, records in seen.items():
        acks = producer.acks[p]
        verdict.acked += len(acks)
        by_offset = dict(records)
        counts = Counter(seq for _, seq in records)
        verdict.duplicates += [(p, s) for s, n in counts.items() if n > 1]
        verdict.missing += [(p, s) for s in acks if s not in counts]
        verdict.wrong_offset += [(p, s) for s, a in acks.items() if s in counts and by_offset.get(a.offset) != s]
        highest = -1
        for _, seq in records:
            if seq < highest and counts[seq] == 1:
                verdict.reordered.append((p, seq))
            highest = max(highest, seq)
    return verdict


# --------------------------------------------------------------------------- raw produce


def idempotent_batch(count: int, producer_id: int, epoch: int, base_sequence: int) -> bytes:
    """One v2 batch as an idempotent producer sends it (kafka-python's encoder), so a test
    can send the very same bytes again, as a client retrying a lost answer does."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i in range(count):
        builder.append(i, timestamp=None, key=None, value=b"r%d" % i, headers=[])
    return bytes(builder.build())


def raw_produce(address: str, topic: str, partition: int, batch: bytes, timeout: float = 15.0) -> tuple[int, int]:
    """Send one Produce (v9, acks=all) with `batch` to the broker at host:port; returns
    (error_code, base_offset) of the partition's answer."""
    import datetime
    import socket
    import struct

    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

    from automq.broker.kafka import codec

    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=partition, records=batch),)),
        ),
    )
    host, port = address.rsplit(":", 1)

    def read(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            data += chunk
        return data

    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        frame = codec.encode_request(1, request)
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", read(sock, 4))[0]
        answer = codec.decode_response(read(sock, size), ProduceRequest)[1].responses[0].partition_responses[0]
    return int(answer.error_code), answer.base_offset


def end_offset(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"eo-{uuid.uuid4().hex[:8]}"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=15)[1]
    finally:
        consumer.close()
