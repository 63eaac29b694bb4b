"""`automq status`: how the cluster is, in one look (the `rpk cluster health` of this project).

Asks every controller for its role and readiness (`GET /v1/status`, `/readyz`), the active one
for the metadata (brokers with state and node epoch, topics, partition placement, pending WAL
recoveries) and broker sessions (how long ago each broker was heard), and every live broker's
`/metrics` (found in the broker registry under the AUTOMQ_HTTP endpoint) for its WAL backlog
and open streams. What could not be asked is reported as a problem, never guessed.

`collect_status` gathers, `render` draws tables, `ClusterStatus.to_dict` is the JSON form.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from automq.broker.controller.client import ControllerClient
from automq.broker.controller.protocol import METRICS_LISTENER, MetadataImage

# Broker metrics read for the status (names from broker/storage/metrics.py).
WAL_PENDING = "automq_storage_wal_bytes_pending"
OPEN_STREAMS = "automq_storage_open_streams"


@dataclass
class ControllerStatus:
    url: str
    reachable: bool
    role: str | None = None  # "leader" | "standby"
    ready: bool = False
    ready_reason: str = ""  # /readyz body when not ready (e.g. "object store stalled ...")
    error: str | None = None


@dataclass
class BrokerStatus:
    node_id: int
    node_epoch: int
    state: str  # active | draining | fenced
    rack: str | None
    kafka_endpoints: list[str]
    heartbeat_age_ms: int | None = None
    partitions_led: int = 0
    wal_backlog_bytes: int | None = None
    open_streams: int | None = None
    metrics_error: str | None = None


@dataclass
class ClusterStatus:
    cluster_id: str | None = None
    controllers: list[ControllerStatus] = field(default_factory=list)
    brokers: list[BrokerStatus] = field(default_factory=list)
    topics: int = 0
    partitions: int = 0
    partitions_by_state: dict[str, int] = field(default_factory=dict)
    wal_recovery_jobs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["healthy"] = self.healthy
        return out


def _parse_prometheus(text: str, names: set[str]) -> dict[str, float]:
    """Values of unlabelled samples named in `names` (enough for the gauges read here)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, rest = line.partition(" ")
        if name in names:
            try:
                values[name] = float(rest.split()[0])
            except (IndexError, ValueError):
                continue
    return values


async def _controller(http: aiohttp.ClientSession, url: str, timeout_s: float) -> ControllerStatus:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with http.get(f"{url}/v1/status", timeout=timeout) as resp:
            body = await resp.json()
        async with http.get(f"{url}/readyz", timeout=timeout) as resp:
            ready = resp.status == 200
            reason = "" if ready else (await resp.text()).strip()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            error += " (the controller's CA: AUTOMQ_CONTROLLER_CA_FILE)"
        return ControllerStatus(url, reachable=False, error=error)
    return ControllerStatus(url, reachable=True, role=body.get("role"), ready=ready, ready_reason=reason)


async def _broker_metrics(http: aiohttp.ClientSession, broker: BrokerStatus, url: str, timeout_s: float) -> None:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            resp.raise_for_status()
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        broker.metrics_error = f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")
        return
    values = _parse_prometheus(text, {WAL_PENDING, OPEN_STREAMS})
    if WAL_PENDING in values:
        broker.wal_backlog_bytes = int(values[WAL_PENDING])
    if OPEN_STREAMS in values:
        broker.open_streams = int(values[OPEN_STREAMS])


def _metrics_url(endpoints: tuple[Any, ...]) -> str | None:
    for e in endpoints:
        if e.listener == METRICS_LISTENER:
            host = f"[{e.host}]" if ":" in e.host else e.host
            return f"http://{host}:{e.port}/metrics"
    return None


def _apply_metadata(status: ClusterStatus, image: MetadataImage, sessions: dict[str, Any] | None) -> dict[int, str]:
    """Fill brokers, topics and partitions from the metadata; returns broker id -> metrics URL."""
    status.cluster_id = image.cluster_id
    ages = {b["node_id"]: b.get("heartbeat_age_ms") for b in (sessions or {}).get("brokers", [])}
    led: Counter[int] = Counter()
    states: Counter[str] = Counter()
    for topic in image.topics:
        for p in topic.partitions:
            states[p.state] += 1
            if p.leader >= 0:
                led[p.leader] += 1
    status.topics = len(image.topics)
    status.partitions = sum(states.values())
    status.partitions_by_state = dict(sorted(states.items()))
    status.wal_recovery_jobs = len(image.wal_recovery_jobs)
    urls: dict[int, str] = {}
    for b in sorted(image.brokers, key=lambda b: b.node_id):
        status.brokers.append(
            BrokerStatus(
                node_id=b.node_id,
                node_epoch=b.node_epoch,
                state=b.state,
                rack=b.rack,
                kafka_endpoints=[
                    f"{e.listener}://{e.host}:{e.port}" for e in b.endpoints if e.listener != METRICS_LISTENER
                ],
                heartbeat_age_ms=ages.get(b.node_id),
                partitions_led=led.get(b.node_id, 0),
            )
        )
        url = _metrics_url(b.endpoints)
        if url is not None and b.state != "fenced":
            urls[b.node_id] = url
    return urls


def _judge(status: ClusterStatus) -> None:
    if not any(c.reachable for c in status.controllers):
        status.problems.append(
            "no controller answered: " + "; ".join(f"{c.url}: {c.error}" for c in status.controllers)
        )
        return
    for c in status.controllers:
        if not c.reachable:
            status.problems.append(f"controller {c.url} is unreachable: {c.error}")
        elif not c.ready:
            status.problems.append(f"controller {c.url} is not ready: {c.ready_reason or 'no reason given'}")
    if not any(c.role == "leader" for c in status.controllers):
        status.problems.append("no controller is the active leader")
    live = [b for b in status.brokers if b.state != "fenced"]
    if not live:
        status.problems.append("no live broker is registered")
    for b in status.brokers:
        if b.metrics_error:
            status.problems.append(f"broker {b.node_id}: metrics unreadable ({b.metrics_error})")
    for state in ("offline", "moving"):
        n = status.partitions_by_state.get(state, 0)
        if n:
            status.problems.append(f"{n} partition(s) {state}")
    if status.wal_recovery_jobs:
        status.problems.append(f"{status.wal_recovery_jobs} WAL recovery job(s) pending (a fenced broker's WAL)")


async def collect_status(controller_urls: list[str], timeout_s: float = 5.0) -> ClusterStatus:
    """Everything `automq status` shows. Never raises for an unreachable part: it becomes a problem."""
    status = ClusterStatus()
    from automq.broker.security.controller_auth import ControllerClientAuth

    auth = ControllerClientAuth.from_env()  # AUTOMQ_CONTROLLER_TOKEN_FILE / _CA_FILE when the API is secured
    connector = aiohttp.TCPConnector(ssl=auth.ssl if auth.ssl is not None else True)
    async with aiohttp.ClientSession(headers=auth.headers(), connector=connector) as http:
        status.controllers = list(await asyncio.gather(*(_controller(http, u, timeout_s) for u in controller_urls)))
        leaders = [c.url for c in status.controllers if c.role == "leader"]
        if leaders:
            client = ControllerClient(
                leaders + [u for u in controller_urls if u not in leaders], retry_deadline_s=timeout_s
            )
            try:
                image = await client.watch_metadata(0, 0)
                try:
                    sessions: dict[str, Any] | None = await client.broker_sessions()
                except Exception as exc:
                    status.problems.append(f"broker sessions unavailable: {exc}")
                    sessions = None
            except Exception as exc:
                status.problems.append(f"metadata unavailable from {leaders[0]}: {type(exc).__name__}: {exc}")
                image = None
            finally:
                await client.close()
            if image is not None:
                urls = _apply_metadata(status, image, sessions)
                by_id = {b.node_id: b for b in status.brokers}
                await asyncio.gather(*(_broker_metrics(http, by_id[i], u, timeout_s) for i, u in urls.items()))
    _judge(status)
    return status


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render(status: ClusterStatus, console: Any) -> None:
    """Tables for a terminal (a rich Console)."""
    from rich.table import Table

    head = "[green]healthy[/]" if status.healthy else "[red]unhealthy[/]"
    console.print(f"cluster {status.cluster_id or '?'}: {head}")
    controllers = Table("controller", "role", "ready", "detail", title="Controllers", title_justify="left")
    for c in status.controllers:
        controllers.add_row(
            c.url,
            c.role or "-",
            "yes" if c.ready else "no",
            c.error or c.ready_reason or "",
        )
    console.print(controllers)
    brokers = Table(
        "id",
        "state",
        "epoch",
        "rack",
        "heartbeat",
        "partitions",
        "WAL backlog",
        "streams",
        "kafka",
        title="Brokers",
        title_justify="left",
    )
    for b in status.brokers:
        age = "-" if b.heartbeat_age_ms is None else f"{b.heartbeat_age_ms / 1000:.1f}s ago"
        brokers.add_row(
            str(b.node_id),
            b.state,
            str(b.node_epoch),
            b.rack or "-",
            age,
            str(b.partitions_led),
            _size(b.wal_backlog_bytes),
            "-" if b.open_streams is None else str(b.open_streams),
            ", ".join(b.kafka_endpoints),
        )
    console.print(brokers)
    states = ", ".join(f"{n} {s}" for s, n in status.partitions_by_state.items()) or "none"
    console.print(
        f"topics: {status.topics}; partitions: {status.partitions} ({states}); "
        f"WAL recovery jobs pending: {status.wal_recovery_jobs}"
    )
    for problem in status.problems:
        console.print(f"[red]problem:[/] {problem}", highlight=False)
