"""Independent observers for elastic tests and benchmarks: what each broker really carries and
which partitions really moved, measured from outside the operator and the balancer.

- `BytesInMeter(k8s, cluster)`: per-broker bytes-in rates from each Ready broker pod's /metrics
  (`kafka_server_brokertopicmetrics_bytesin_total`, summed over the partitions present in both
  scrapes: a partition that moved away mid-window counts for neither side). Parsed here with a
  regex, not with the balancer's parser, so a bug there cannot hide here.
- `LeaderWatcher(bootstrap, topics)`: a thread polling Kafka metadata (confluent-kafka admin)
  that records every leader change (a move) with its time; `moves(since, until)`,
  `last_led(broker)`, `leaders()`.
- `imbalance(rates)`: max |rate - mean| / mean over the brokers, as a percentage.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

_BYTES_IN = re.compile(
    r"^kafka_server_brokertopicmetrics_bytesin_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+-]+)", re.M
)


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode("utf-8", errors="replace")
    return {m.group("labels"): float(m.group("value")) for m in _BYTES_IN.finditer(text)}


class BytesInMeter:
    def __init__(self, k8s, cluster: str) -> None:
        self.k8s = k8s
        self.cluster = cluster

    def _urls(self) -> dict[int, str]:
        out = {}
        for pod in self.k8s.ready_pods(self.cluster):
            state = self.k8s.pod_process(pod)
            if state is not None and state.probe_port in state.ports:
                out[int(pod.rsplit("-", 1)[1])] = f"http://{state.ip}:{state.ports[state.probe_port]}/metrics"
        return out

    def rates(self, window_s: float = 3.0) -> dict[int, float]:
        """Bytes in per second per Ready broker over the next `window_s` seconds."""
        urls = self._urls()
        first = {b: _scrape(u) for b, u in urls.items()}
        t0 = time.monotonic()
        time.sleep(window_s)
        second = {b: _scrape(u) for b, u in urls.items()}
        dt = time.monotonic() - t0
        out = {}
        for broker, series in second.items():
            before = first.get(broker, {})
            out[broker] = sum(max(0.0, v - before[k]) for k, v in series.items() if k in before) / dt
        return out


def imbalance(rates: dict[int, float]) -> float:
    """Max deviation from the mean, percent of the mean (0 when there is no load)."""
    if not rates:
        return 0.0
    mean = sum(rates.values()) / len(rates)
    if mean <= 0:
        return 0.0
    return max(abs(r - mean) for r in rates.values()) / mean * 100


@dataclass(frozen=True)
class LeaderChange:
    at: float  # time.monotonic()
    topic: str
    partition: int
    old: int
    new: int


class LeaderWatcher:
    def __init__(self, bootstrap: str, topics: Iterable[str], interval_s: float = 0.5) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.topics = list(topics)
        self.interval_s = interval_s
        self.changes: list[LeaderChange] = []
        self._current: dict[tuple[str, int], int] = {}
        self._last_led: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watcher", daemon=True)

    def start(self) -> LeaderWatcher:
        self._poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _poll(self) -> None:
        md = self.admin.list_topics(timeout=10)
        now = time.monotonic()
        with self._lock:
            for topic in self.topics:
                t = md.topics.get(topic)
                if t is None:
                    continue
                for p in t.partitions.values():
                    key = (topic, p.id)
                    old = self._current.get(key)
                    if p.leader < 0:
                        continue  # moving: no leader this instant
                    if old is not None and old != p.leader:
                        self.changes.append(LeaderChange(now, topic, p.id, old, p.leader))
                    self._current[key] = p.leader
                    self._last_led[p.leader] = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._poll()
            except Exception:
                pass  # a broker leaving mid-poll; the next poll sees the result

    def leaders(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._current)

    def moves(self, since: float = 0.0, until: float = float("inf")) -> list[LeaderChange]:
        with self._lock:
            return [c for c in self.changes if since <= c.at < until]

    def last_led(self, broker: int) -> float | None:
        """When `broker` was last seen leading any watched partition."""
        with self._lock:
            return self._last_led.get(broker)

    def led_by(self, broker: int) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(k for k, v in self._current.items() if v == broker)
