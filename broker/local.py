"""Local mode: a controller and N brokers as separate processes on 127.0.0.1 (`automq local up`).

The processes are the same ones a Kubernetes deployment runs (`automq controller`,
`automq broker`), each with a NodeConfig file written under the data dir, so local mode
exercises the real configuration path. Layout of the data dir:

    cluster.yaml              what this data dir was created with (object store URL) and the
                              last --brokers/--port, which a restart without them reuses
    .lock                     held by the running launcher; holds its pid (`automq local down`)
    config/controller.yaml    generated node configs, rewritten on every start
    config/broker-<id>.yaml
    broker-<id>/              a broker's local scratch: its WAL file
    objects/                  the embedded object store (file://), unless --object-store
    logs/<node>.log           each process's output
    run/<node>.pid            pids of the running processes (tests use them to kill -9 one)

Restarting with the same data dir recovers everything: node ids and WAL files are the same,
and all metadata and data live in the object store.

Supervision: a node that exits on its own is restarted (a broker replays its WAL, the
controller reloads the metadata log) after a delay that doubles with each exit in a row, up
to a minute; the other nodes keep running, and a node that keeps exiting is named with the
last lines of its log.
Ctrl-C / SIGTERM stops brokers first (they hand their partitions back to the controller and
flush their WAL), then the controller; stragglers are killed after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http.client
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from automq.broker.config import (
    ConfigError,
    KafkaConfig,
    Listener,
    NodeConfig,
    dump_config,
    kafka_field,
    parse_config,
)
from automq.broker.local_secure import SECURE_LISTENER, SecureLocal
from automq.broker.objectstore.check import ObjectStoreCheckError, check_object_store

CONTROLLER_NODE_ID = 0
READY_TIMEOUT_S = 180.0
BROKER_STOP_GRACE_S = 30.0
CONTROLLER_STOP_GRACE_S = 10.0
CONTROLLER_LOST_GRACE_S = 10.0  # a broker without its controller stops in ~5 s (see BrokerService.stop)
RESTART_BACKOFF_S = 0.5  # first restart of a node that exited; doubles per exit in a row ...
RESTART_BACKOFF_MAX_S = 60.0  # ... up to this
STABLE_AFTER_S = 60.0  # a node that ran this long before exiting starts its backoff over
KEEPS_DYING = 3  # exits in a row after which the launcher shows the node's log tail
CLUSTER_ID = "automq-local"


class LocalClusterError(Exception):
    """Local mode cannot start; the message says what to change."""


@dataclass
class Node:
    name: str  # "controller", "broker-1"
    node_id: int
    config_path: Path
    http_port: int
    kafka_port: int | None
    log_path: Path
    pid_path: Path
    role: str  # "controller" | "broker"
    process: subprocess.Popen[bytes] | None = None
    https: bool = False  # its HTTP endpoint serves TLS (the controller of a --secure cluster)
    started_at: float = 0.0
    exits_in_a_row: int = 0
    restart_at: float | None = None  # when a node that exited is started again

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "automq.broker.cli", self.role, "--config", str(self.config_path)]


# --------------------------------------------------------------------------- ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the servers bind: SO_REUSEADDR, so a port in TIME_WAIT counts as free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_port_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default floor


def free_port_block(n: int) -> int:
    """A first port P such that P..P+n-1 are free now, for tools and tests that start local
    clusters on fresh Kafka ports. Chosen BELOW the kernel's ephemeral range: a cluster
    restarts on the same Kafka ports, and a port from the ephemeral range can be taken in
    between as the local end of some outgoing connection (seen: EADDRINUSE when a broker came
    back)."""
    floor = _ephemeral_port_floor()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10_000, floor - n)
        if all(port_is_free(base + i) for i in range(n)):
            return base
    raise LocalClusterError(f"no block of {n} free ports below {floor}")


def free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not avoid or port not in avoid:
            return port


# --------------------------------------------------------------------------- configs


def _recorded_object_store(data_dir: Path) -> str | None:
    try:
        recorded = yaml.safe_load((data_dir / "cluster.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None  # none yet; a broken file is reported by resolve_object_store
    url = recorded.get("object_store_url") if isinstance(recorded, dict) else None
    return url if isinstance(url, str) else None


def resolve_object_store(data_dir: Path, requested: str | None) -> str:
    """The object store URL for this data dir: the one it was created with, so a restart
    without --object-store finds its data; a different one is refused."""
    record = data_dir / "cluster.yaml"
    recorded: str | None = None
    if record.exists():
        try:
            recorded = (yaml.safe_load(record.read_text()) or {}).get("object_store_url")
        except yaml.YAMLError as exc:
            raise LocalClusterError(f"{record} is not valid YAML ({exc}); fix or delete it") from None
    default = (data_dir / "objects").as_uri()
    url = requested or recorded or default
    if recorded and url != recorded:
        raise LocalClusterError(
            f"data dir {data_dir} holds a cluster on object store {recorded}; pass --object-store {recorded} "
            "or use another --data-dir"
        )
    if not url.startswith(("file://", "s3://")):
        raise LocalClusterError(f"--object-store must be an s3:// or file:// URL, got {url!r}")
    if recorded is None:
        record.write_text(yaml.safe_dump({"object_store_url": url, "cluster_id": CLUSTER_ID}))
    return url


# keys local mode decides for every node: a --set/--config of them would break the cluster
# (ports, ids, where data lives), so they are refused with the option to use instead
_LOCAL_OWNED = {
    "node_id": "node ids are 0 (controller) and 1..N (brokers)",
    "cluster_id": "local mode's cluster id is fixed",
    "data_dir": "use --data-dir",
    "object_store_url": "use --object-store",
    "controller_urls": "local mode points brokers at its controller",
    "listeners": "use --port",
    "http_host": "local nodes serve HTTP on 127.0.0.1",
    "http_port": "local mode picks free HTTP ports",
}


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_path(key: str) -> list[str]:
    """`kafka.num_partitions` -> ["kafka", "num_partitions"]; a Kafka name such as
    `num.partitions` or `group.initial.rebalance.delay.ms` -> ["kafka", "<name with _>"]."""
    parts = key.split(".")
    if parts[0] in NodeConfig.model_fields:
        return parts
    field = kafka_field(key)  # Kafka's own name, e.g. max.incremental.fetch.session.cache.slots
    if field is not None:
        return ["kafka", field]
    dotted = key.replace(".", "_").replace("-", "_")  # the field name written with dots
    if dotted in KafkaConfig.model_fields:
        return ["kafka", dotted]
    return parts  # unknown: validation names it


def node_overrides(sets: list[str] | None = None, config_file: Path | None = None) -> dict[str, Any]:
    """The settings `--config FILE` (a YAML fragment of a node config) and `--set KEY=VALUE`
    (later wins) add to every node's config, as a nested mapping. Values are YAML scalars
    ("3" is a number, "64MiB" a size, "true" a boolean). Raises LocalClusterError naming an
    unknown or bad key, or one local mode sets itself."""
    raw: dict[str, Any] = {}
    if config_file is not None:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        except OSError as exc:
            raise LocalClusterError(f"--config {config_file}: cannot read it ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise LocalClusterError(f"--config {config_file} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise LocalClusterError(f"--config {config_file} must hold a mapping of keys, got {type(loaded).__name__}")
        raw = _merge(raw, loaded)
    for item in sets or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LocalClusterError(f"--set {item!r}: expected KEY=VALUE, e.g. --set kafka.num_partitions=3")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        nested: Any = value
        for part in reversed(_set_path(key)):
            nested = {part: nested}
        raw = _merge(raw, nested)
    for key, why in _LOCAL_OWNED.items():
        if key in raw:
            raise LocalClusterError(f"{key} cannot be set in local mode: {why}")
    # validated once here, so a typo fails before any process starts, naming the key
    probe = {"node_id": 1, **raw}
    try:
        parse_config(probe, source="--set/--config")
    except ConfigError as exc:
        raise LocalClusterError(str(exc)) from None
    return raw


def _flat(raw: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in raw.items():
        if isinstance(value, dict) and value:
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def node_configs(
    brokers: int,
    data_dir: Path,
    port: int,
    object_store_url: str,
    controller_http: int,
    broker_http: list[int],
    overrides: dict[str, Any] | None = None,
    secure: SecureLocal | None = None,
) -> dict[str, NodeConfig]:
    controller_url = f"{'https' if secure else 'http'}://127.0.0.1:{controller_http}"
    secured: dict[str, Any] = secure.node_settings() if secure is not None else {}
    configs = {
        "controller": NodeConfig(
            node_id=CONTROLLER_NODE_ID,
            cluster_id=CLUSTER_ID,
            data_dir=str(data_dir / "controller"),
            object_store_url=object_store_url,
            controller_urls=[controller_url],
            listeners=[],
            http_host="127.0.0.1",
            http_port=controller_http,
            **secured,
        )
    }
    for i in range(1, brokers + 1):
        configs[f"broker-{i}"] = NodeConfig(
            node_id=i,
            cluster_id=CLUSTER_ID,
            data_dir=str(data_dir / f"broker-{i}"),
            object_store_url=object_store_url,
            controller_urls=[controller_url],
            listeners=[
                Listener(name=SECURE_LISTENER, host="127.0.0.1", port=port + i - 1, security_protocol="SASL_SSL")
                if secure
                else Listener(name="PLAINTEXT", host="127.0.0.1", port=port + i - 1)
            ],
            http_host="127.0.0.1",
            http_port=broker_http[i - 1],
            **secured,
        )
    if overrides:
        # every node gets every setting (a controller ignores the broker-only sections), so
        # one fragment works for all; validation already happened in node_overrides
        configs = {
            name: parse_config(_merge(c.model_dump(mode="json", exclude_defaults=True), overrides), source=name)
            for name, c in configs.items()
        }
    return configs


def _config_yaml(config: NodeConfig) -> str:
    """Only the keys local mode sets: a key written to the file counts as set by the operator
    of the node (DescribeConfigs reports it as STATIC_BROKER_CONFIG, as Kafka does for
    server.properties), so defaults stay out of it. Reads back to an equal NodeConfig."""
    text = yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
    if load_config_text(text) != config:  # never write a file that means something else
        text = dump_config(config)
    return text


def load_config_text(text: str) -> NodeConfig:
    from automq.broker.config import parse_config

    return parse_config(yaml.safe_load(text) or {})


def prepare(
    brokers: int,
    data_dir: Path,
    port: int,
    object_store_url: str | None,
    overrides: dict[str, Any] | None = None,
    secure: SecureLocal | None = None,
) -> list[Node]:
    """Check ports, write every node's config file; returns the nodes in start order."""
    if brokers < 1:
        raise LocalClusterError(f"--brokers must be at least 1, got {brokers}")
    if port < 1 or port + brokers - 1 > 65535:
        raise LocalClusterError(f"--port {port} with {brokers} brokers leaves the port range")
    for i in range(brokers):
        if not port_is_free(port + i):
            raise LocalClusterError(
                f"port {port + i} (broker {i + 1}'s Kafka listener) is already in use on 127.0.0.1; "
                f"stop what uses it or pick another first port with --port"
            )
    data_dir.mkdir(parents=True, exist_ok=True)
    url = resolve_object_store(data_dir, object_store_url)
    if url.startswith("file://"):
        Path(url[len("file://") :]).mkdir(parents=True, exist_ok=True)
    kafka_ports = set(range(port, port + brokers))
    taken = set(kafka_ports)
    controller_http = free_port(avoid=taken)
    taken.add(controller_http)
    broker_http = []
    for _ in range(brokers):
        p = free_port(avoid=taken)
        taken.add(p)
        broker_http.append(p)
    for sub in ("config", "logs", "run"):
        (data_dir / sub).mkdir(parents=True, exist_ok=True)
    nodes = []
    configs = node_configs(brokers, data_dir, port, url, controller_http, broker_http, overrides, secure)
    for name, config in configs.items():
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        path = data_dir / "config" / f"{name}.yaml"
        path.write_text(_config_yaml(config))
        nodes.append(
            Node(
                name=name,
                node_id=config.node_id,
                config_path=path,
                http_port=config.http_port,
                kafka_port=config.listeners[0].port if config.listeners else None,
                log_path=data_dir / "logs" / f"{name}.log",
                pid_path=data_dir / "run" / f"{name}.pid",
                role="controller" if name == "controller" else "broker",
                https=name == "controller" and config.security.controller_tls,
            )
        )
    return nodes


# --------------------------------------------------------------------------- processes


def _die_with_launcher() -> None:
    """In the child before exec: die with the launcher, so a killed `automq local up` leaves
    no cluster behind. SIGKILL, not SIGTERM: the controller goes at the same moment, so a
    graceful broker stop could only wait for it in vain; the next start recovers the WALs,
    exactly as after a crash. (Linux only; elsewhere a no-op.)"""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def spawn(node: Node) -> None:
    log = open(node.log_path, "ab", buffering=0)  # noqa: SIM115 - handed to the child, closed below
    try:
        log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(node.command)}\n".encode())
        # its own process group: a terminal's Ctrl-C reaches only us, and we stop the
        # children in order (brokers before the controller they deregister from)
        node.started_at = time.monotonic()
        node.process = subprocess.Popen(
            node.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_die_with_launcher if sys.platform == "linux" else None,
        )
    finally:
        log.close()
    node.pid_path.write_text(f"{node.process.pid}\n")


def is_ready(node: Node) -> bool:
    return http_ready(node.http_port, https=node.https)


def http_ready(http_port: int, https: bool = False) -> bool:
    """Whether the node serving HTTP on this local port answers /readyz with 200."""
    conn = (
        http.client.HTTPSConnection("127.0.0.1", http_port, timeout=1.0, context=ssl._create_unverified_context())
        if https  # a readiness probe of our own child process: what matters is that it answers
        else http.client.HTTPConnection("127.0.0.1", http_port, timeout=1.0)
    )
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def log_tail(node: Node, lines: int = 20) -> str:
    try:
        text = node.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _write_tail(node: Node) -> None:
    # raw, not through rich: log lines hold brackets rich would read as markup, and wrapping
    # them at the terminal width makes tracebacks unreadable
    sys.stderr.write(log_tail(node) + "\n")
    sys.stderr.flush()


def stop(nodes: list[Node], console: Console, broker_grace_s: float = BROKER_STOP_GRACE_S) -> None:
    """Brokers first, then the controller: SIGTERM, wait, SIGKILL stragglers."""
    brokers = [n for n in nodes if n.role == "broker"]
    controllers = [n for n in nodes if n.role == "controller"]
    for group, grace in ((brokers, broker_grace_s), (controllers, CONTROLLER_STOP_GRACE_S)):
        running = [(n, n.process) for n in group if n.process is not None and n.process.poll() is None]
        for _, process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for n, process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                console.print(f"[yellow]{n.name} did not stop within {grace:.0f}s; killing it[/]")
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait()
    for n in nodes:
        with contextlib.suppress(OSError):
            n.pid_path.unlink()


class _Signals:
    """SIGINT/SIGTERM set a flag; the supervisor loop notices it."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.count >= 3:
            # a third Ctrl-C: the user really wants out
            raise KeyboardInterrupt

    def install(self) -> None:
        signal.signal(signal.SIGINT, self)
        signal.signal(signal.SIGTERM, self)


@contextlib.contextmanager
def _data_dir_lock(data_dir: Path):
    lock_path = data_dir / ".lock"
    handle = open(lock_path, "a+")  # noqa: SIM115 - held for the life of the cluster
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            raise LocalClusterError(
                f"data dir {data_dir} is in use by another `automq local up` (pid {owner})"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


def _wait_ready(nodes: list[Node], console: Console, signals: _Signals) -> bool:
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False
    ) as progress:
        tasks = {n.name: progress.add_task(f"{n.name}: starting", total=1) for n in nodes}
        pending = list(nodes)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            if signals.count:
                return False
            for n in list(pending):
                code = n.process.poll() if n.process else None
                if code is not None:
                    progress.update(tasks[n.name], description=f"[red]{n.name}: exited with code {code}[/]")
                    console.print(
                        f"[red]{n.name} exited with code {code} while starting. Last lines of {n.log_path}:[/]"
                    )
                    _write_tail(n)
                    return False
                if is_ready(n):
                    where = f"127.0.0.1:{n.kafka_port}" if n.kafka_port else f"http://127.0.0.1:{n.http_port}"
                    progress.update(tasks[n.name], completed=1, description=f"[green]{n.name}: ready[/] ({where})")
                    pending.remove(n)
            if time.monotonic() > deadline:
                for n in pending:
                    console.print(
                        f"[red]{n.name} not ready after {READY_TIMEOUT_S:.0f}s. Last lines of {n.log_path}:[/]"
                    )
                    _write_tail(n)
                return False
            time.sleep(0.2)
    return True


def _recorded(data_dir: Path) -> dict[str, object]:
    try:
        recorded = yaml.safe_load((data_dir / "cluster.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def remembered_options(data_dir: Path, brokers: int | None, port: int | None) -> tuple[int, int]:
    """--brokers and --port as given, else as the last start of this data dir used them."""
    recorded = _recorded(Path(data_dir).expanduser().resolve())
    b, p = recorded.get("brokers"), recorded.get("port")
    return (
        brokers if brokers is not None else (b if isinstance(b, int) and b >= 1 else 1),
        port if port is not None else (p if isinstance(p, int) and 0 < p < 65536 else 9092),
    )


def _remember(data_dir: Path, brokers: int, port: int) -> None:
    record = data_dir / "cluster.yaml"
    recorded = _recorded(data_dir)
    if recorded.get("brokers") != brokers or recorded.get("port") != port:
        record.write_text(yaml.safe_dump({**recorded, "brokers": brokers, "port": port}))


def _print_endpoints(nodes: list[Node], console: Console, data_dir: Path) -> None:
    for n in nodes:
        base = f"{'https' if n.https else 'http'}://127.0.0.1:{n.http_port}"
        kafka = f"kafka 127.0.0.1:{n.kafka_port}, " if n.kafka_port else ""
        console.print(f"  {n.name}: {kafka}metrics {base}/metrics, health {base}/healthz, {base}/readyz")
        if n.role == "controller":  # docs/schema-registry.md
            console.print(f"  schema registry (Confluent-compatible): {base}")
    console.print(f"  logs: {data_dir / 'logs'}; `automq status --data-dir {data_dir}` shows the cluster's state")


def run_local_cluster(
    brokers: int | None,
    data_dir: Path | str,
    port: int | None,
    object_store_url: str | None,
    sets: list[str] | None = None,
    config_file: Path | None = None,
    secure: bool = False,
) -> int:
    """Run a local cluster in the foreground until Ctrl-C/SIGTERM; returns the exit code.
    `brokers`/`port` None: what the last start of this data dir used (else 1 and 9092).
    `sets` (KEY=VALUE) and `config_file` (YAML fragment) go into every node's config; they
    are not remembered: a start without them uses the defaults again."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    data_dir = Path(data_dir).expanduser().resolve()
    try:
        overrides = node_overrides(sets, config_file)
    except LocalClusterError as exc:
        console.print(str(exc), style="red", markup=False)
        return 2
    brokers, port = remembered_options(data_dir, brokers, port)
    # A store given (or recorded by an earlier start) is proven usable before anything is
    # created on disk: a wrong URL, endpoint, bucket or credential fails here in seconds.
    to_check, setting = object_store_url, "--object-store"
    if to_check is None:
        to_check, setting = _recorded_object_store(data_dir), f"object_store_url in {data_dir / 'cluster.yaml'}"
    if to_check is not None:
        console.print(f"checking object store {to_check} ...")
        try:
            asyncio.run(check_object_store(to_check, setting=setting))
        except ObjectStoreCheckError as exc:
            console.print(f"[red]{exc}[/]")
            return 2
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        console.print(f"[red]cannot create data dir {data_dir}: {exc.strerror}[/]")
        return 2
    signals = _Signals()
    signals.install()
    nodes: list[Node] = []
    try:
        with _data_dir_lock(data_dir):
            secured = SecureLocal.ensure(data_dir) if secure else None
            nodes = prepare(brokers, data_dir, port, object_store_url, overrides, secured)
            _remember(data_dir, brokers, port)
            console.print(f"data dir {data_dir}; process logs in {data_dir / 'logs'}")
            for key, value in _flat(overrides):
                console.print(f"setting {key} = {value!r}", markup=False)
            delay = parse_config({"node_id": 1, **overrides}).kafka.group_initial_rebalance_delay_ms
            console.print(
                f"group.initial.rebalance.delay.ms = {delay} ms"
                + (" (Kafka's default)" if delay == KafkaConfig().group_initial_rebalance_delay_ms else ""),
                markup=False,
            )
            for n in nodes:
                spawn(n)
            # brokers retry their controller registration, so all start at once
            if not _wait_ready(nodes, console, signals):
                console.print("stopping ...")
                stop(nodes, console)
                return 0 if signals.count else 1  # stopped on request (Ctrl-C/SIGTERM) vs failed to start
            bootstrap = ",".join(f"127.0.0.1:{n.kafka_port}" for n in nodes if n.kafka_port)
            if secured is not None:
                controller = next(n for n in nodes if n.role == "controller")
                asyncio.run(secured.create_admin(f"https://127.0.0.1:{controller.http_port}"))
                console.print("client settings (TLS + SCRAM-SHA-512):", markup=False)
                print(secured.client_settings(bootstrap), flush=True)
            print(f"bootstrap: {bootstrap}", flush=True)
            console.print(f"cluster ready: {len(nodes) - 1} broker(s); Ctrl-C (or `automq local down`) stops it")
            _print_endpoints(nodes, console, data_dir)
            code = _supervise(nodes, console, signals)
            console.print("stopping brokers, then the controller ...")
            controller_alive = all(
                n.process is not None and n.process.poll() is None for n in nodes if n.role == "controller"
            )
            # without a controller a broker can neither commit its uploads nor deregister: its WAL
            # keeps the data for the next start, so waiting long for a graceful stop buys nothing
            stop(nodes, console, BROKER_STOP_GRACE_S if controller_alive else CONTROLLER_LOST_GRACE_S)
            console.print("stopped")
            return code
    except LocalClusterError as exc:
        console.print(f"[red]{exc}[/]")
        stop(nodes, console)
        return 2
    except KeyboardInterrupt:
        for n in nodes:
            if n.process is not None and n.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    n.process.kill()
        return 130


def _supervise(nodes: list[Node], console: Console, signals: _Signals) -> int:
    """Restart every node that exits (the controller too: its state is in the object store,
    and brokers wait for it), after a delay that doubles with each exit in a row. The other
    nodes keep running; a node that keeps exiting is named with the last lines of its log."""
    while not signals.count:
        now = time.monotonic()
        for n in nodes:
            if n.process is None:
                if n.restart_at is not None and now >= n.restart_at:
                    n.restart_at = None
                    spawn(n)
                continue
            code = n.process.poll()
            if code is None:
                continue
            n.process = None
            if now - n.started_at >= STABLE_AFTER_S:
                n.exits_in_a_row = 0
            n.exits_in_a_row += 1
            delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (n.exits_in_a_row - 1))
            n.restart_at = now + delay
            what = "its WAL is replayed on start" if n.role == "broker" else "it reloads the metadata log"
            if n.exits_in_a_row >= KEEPS_DYING:
                console.print(
                    f"[red]{n.name} keeps exiting (code {code}, {n.exits_in_a_row} times in a row); "
                    f"restarting it in {delay:.0f}s, the others keep running. Last lines of {n.log_path}:[/]"
                )
                _write_tail(n)
            else:
                console.print(
                    f"[yellow]{n.name} exited with code {code}; restarting it in {delay:.1f}s ({what}). "
                    f"Log: {n.log_path}[/]"
                )
        time.sleep(0.25)
    return 0


# --------------------------------------------------------------------------- background mode

DETACH_READY_TIMEOUT_S = 180.0
DOWN_TIMEOUT_S = 120.0


def running_launcher(data_dir: Path) -> int | None:
    """The pid of the `automq local up` holding this data dir, or None when none runs."""
    lock_path = Path(data_dir).expanduser().resolve() / ".lock"
    if not lock_path.exists():
        return None
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def detach(argv: list[str], data_dir: Path) -> int:
    """Start `automq local up ARGV` in its own session, wait until it serves, print the
    bootstrap line and return 0; if it fails first, print the end of its output and return its code."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    data_dir = Path(data_dir).expanduser().resolve()
    pid = running_launcher(data_dir)
    if pid is not None:
        console.print(f"[red]a cluster already runs in {data_dir} (pid {pid}); `automq local down` stops it[/]")
        return 2
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "local-up.log"
    with open(log_path, "ab") as log:
        start = log.tell()
        process = subprocess.Popen(
            [sys.executable, "-m", "automq.broker.cli", "local", "up", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in this terminal no longer reaches it
        )
    deadline = time.monotonic() + DETACH_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(log_path, "rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("bootstrap: "):
                for setting in text.splitlines():  # --secure: the client settings printed before it
                    if setting.startswith(
                        ("bootstrap.servers=", "security.protocol=", "sasl.", "ssl.ca.location=", "# controller")
                    ):
                        print(setting, flush=True)
                print(line, flush=True)
                console.print(
                    f"running in the background (pid {process.pid}); output in {log_path}; "
                    f"`automq local down --data-dir {data_dir}` stops it"
                )
                return 0
        code = process.poll()
        if code is not None:
            console.print(f"[red]the cluster did not start (exit code {code}); the end of {log_path}:[/]")
            console.print("\n".join(text.splitlines()[-15:]), markup=False)
            return code or 1
        time.sleep(0.2)
    console.print(f"[red]not serving after {DETACH_READY_TIMEOUT_S:.0f}s; still starting? see {log_path}[/]")
    return 1


def local_down(data_dir: Path, timeout_s: float = DOWN_TIMEOUT_S) -> int:
    """Stop the background cluster of a data dir (SIGTERM to its launcher, which stops brokers,
    then the controller); 0 once it has exited, 1 if none ran or it did not stop in time."""
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    data_dir = Path(data_dir).expanduser().resolve()
    pid = running_launcher(data_dir)
    if pid is None:
        console.print(f"no cluster is running in {data_dir}")
        return 1
    if pid <= 0:
        console.print(f"[red]{data_dir / '.lock'} is held but names no pid; stop the launcher by hand[/]")
        return 1
    console.print(f"stopping the cluster in {data_dir} (launcher pid {pid}) ...")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_launcher(data_dir) is None:
            console.print("stopped")
            return 0
        time.sleep(0.2)
    console.print(f"[red]still running after {timeout_s:.0f}s (pid {pid}); see {data_dir / 'logs'}[/]")
    return 1
