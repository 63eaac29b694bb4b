"""Rebalance time of a consumer group, the classic protocol next to KIP-848, in the same run and
on the same broker. Prints numbers; asserts nothing.

    python benchmarks/group_rebalance_bench.py                      # 10 members x 100 partitions, 3 rounds
    python benchmarks/group_rebalance_bench.py --heartbeat-ms 1000  # both protocols' heartbeat at 1 s

A one-broker `automq local up` cluster (real processes; group.initial.rebalance.delay.ms=0 so
the classic protocol is not charged Kafka's 3 s first-join delay) and a topic of --partitions.
Members are librdkafka consumers (confluent-kafka), one thread each:
- classic: librdkafka's default protocol (JoinGroup/SyncGroup, client-side range assignor,
  eager: every member gives up everything at each rebalance);
- consumer: `group.protocol=consumer` (KIP-848: the broker assigns, members reconcile
  incrementally by heartbeats).
Two measurements per protocol and round, each from the moment the last member called
subscribe() until every partition is owned by exactly one member (seen through the members'
assign/revoke callbacks):
1. cold start: --members members subscribe at once;
2. scale-out: one member joins a settled group of --members - 1; also counted: partitions the
   incumbents gave up, and the most partitions owned by nobody at one moment.
Heartbeat intervals are Kafka's defaults unless --heartbeat-ms is given (classic: the client's
heartbeat.interval.ms 3000; KIP-848: the broker's group.consumer.heartbeat.interval.ms 5000);
they bound how soon an incumbent hears of a new member in both protocols.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from automq.broker import local

TOPIC = "rebalance-bench"


class Group:
    """Members' ownership as their callbacks report it, and when it was last complete."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.lock = threading.Lock()
        self.owned: dict[str, set[int]] = {}
        self.settled_at: float | None = None
        self.revoked = 0
        self.max_unowned = 0

    def reset(self, expected_members: int) -> None:
        with self.lock:
            self.expected = expected_members
            self.settled_at = None
            self.revoked = 0
            self.max_unowned = 0

    def update(self, name: str, add: set[int], remove: set[int]) -> None:
        now = time.perf_counter()
        with self.lock:
            mine = self.owned.setdefault(name, set())
            self.revoked += len(mine & remove)
            mine -= remove
            mine |= add
            live = [p for p in self.owned.values() if p]
            union: set[int] = set().union(*live) if live else set()
            self.max_unowned = max(self.max_unowned, self.partitions - len(union))
            complete = (
                len(live) == self.expected
                and len(union) == self.partitions
                and sum(len(p) for p in live) == self.partitions
            )
            if complete and self.settled_at is None:
                self.settled_at = now
            elif not complete:
                self.settled_at = None

    def forget(self, name: str) -> None:
        with self.lock:
            self.owned.pop(name, None)


class Member(threading.Thread):
    def __init__(self, bootstrap: str, group_id: str, protocol: str, name: str, group: Group, heartbeat_ms: int | None):
        super().__init__(daemon=True, name=name)
        self.config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "client.id": name,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
        }
        if protocol == "consumer":
            self.config["group.protocol"] = "consumer"
        elif heartbeat_ms is not None:
            self.config["heartbeat.interval.ms"] = heartbeat_ms
        self.group = group
        self.stop_flag = threading.Event()
        self.subscribed_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            c = Consumer(self.config)
            name = self.name
            c.subscribe(
                [TOPIC],
                on_assign=lambda _c, ps: self.group.update(name, {p.partition for p in ps}, set()),
                on_revoke=lambda _c, ps: self.group.update(name, set(), {p.partition for p in ps}),
                on_lost=lambda _c, ps: self.group.update(name, set(), {p.partition for p in ps}),
            )
            self.subscribed_at = time.perf_counter()
            while not self.stop_flag.is_set():
                c.poll(0.05)
            c.close()
        except BaseException as exc:
            self.error = exc
        finally:
            self.group.forget(self.name)


def wait_settled(group: Group, members: list[Member], timeout: float = 180.0) -> float:
    """Seconds from the last subscribe() to the moment ownership became complete (and stayed
    so for a second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        errors = [m.error for m in members if m.error]
        if errors:
            raise SystemExit(f"a member failed: {errors[0]!r}")
        with group.lock:
            settled = group.settled_at
        if settled is not None and time.perf_counter() - settled > 1.0:
            started = max(m.subscribed_at or 0.0 for m in members)
            return settled - started
        time.sleep(0.02)
    raise SystemExit(f"the group did not settle in {timeout:.0f}s: {group.owned}")


def run_protocol(bootstrap: str, protocol: str, members: int, partitions: int, heartbeat_ms: int | None) -> dict:
    group = Group(partitions)
    group_id = f"bench-{protocol}-{uuid.uuid4().hex[:8]}"
    started: list[Member] = []
    try:
        group.reset(members)
        started = [
            Member(bootstrap, group_id, protocol, f"{protocol}-{i}", group, heartbeat_ms) for i in range(members)
        ]
        for m in started:
            m.start()
        cold = wait_settled(group, started)

        leaving = started.pop()
        group.reset(members - 1)
        leaving.stop_flag.set()
        leaving.join(60)
        wait_settled(group, started)

        group.reset(members)
        newcomer = Member(bootstrap, group_id, protocol, f"{protocol}-new", group, heartbeat_ms)
        started.append(newcomer)
        newcomer.start()
        while newcomer.subscribed_at is None and newcomer.is_alive():
            time.sleep(0.005)
        scale = wait_settled(group, [newcomer])
        return {"cold": cold, "scale": scale, "revoked": group.revoked, "unowned": group.max_unowned}
    finally:
        for m in started:
            m.stop_flag.set()
        for m in started:
            m.join(60)


def start_cluster(data: Path, port: int, heartbeat_ms: int | None) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", "1"]
    cmd += ["--data-dir", str(data), "--port", str(port), "--set", "group.initial.rebalance.delay.ms=0"]
    if heartbeat_ms is not None:
        cmd += ["--set", f"group.consumer.heartbeat.interval.ms={heartbeat_ms}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("bootstrap: "):
            return proc, line.split(" ", 1)[1].strip()
    stop_cluster(proc)
    raise SystemExit(f"the local cluster did not start; logs under {data}/logs")


def stop_cluster(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def create_topic(bootstrap: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC)
        if t is not None and len(t.partitions) == partitions and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise SystemExit("the topic's partitions got no leaders")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heartbeat-ms", type=int, default=None, help="both protocols' heartbeat interval")
    parser.add_argument("--port", type=int, default=None, help="the cluster's first port (default: a free block)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rebalance-bench-") as tmp:
        port = args.port if args.port is not None else local.free_port_block(1)
        proc, bootstrap = start_cluster(Path(tmp), port, args.heartbeat_ms)
        try:
            create_topic(bootstrap, args.partitions)
            results: dict[str, list[dict]] = {"classic": [], "consumer": []}
            for r in range(args.rounds):
                for protocol in ("classic", "consumer"):  # interleaved: both see the same machine load
                    got = run_protocol(bootstrap, protocol, args.members, args.partitions, args.heartbeat_ms)
                    results[protocol].append(got)
                    print(
                        f"round {r + 1} {protocol:8s}: cold start {got['cold']:.2f} s, scale-out "
                        f"{got['scale']:.2f} s, {got['revoked']} partitions revoked from incumbents, "
                        f"at most {got['unowned']} unowned",
                        flush=True,
                    )
        finally:
            stop_cluster(proc)

    hb = (
        f"{args.heartbeat_ms} ms for both" if args.heartbeat_ms else "Kafka defaults (classic 3000 ms, KIP-848 5000 ms)"
    )
    print(f"\n{args.members} members x {args.partitions} partitions, heartbeat interval: {hb}, median of {args.rounds}")
    print(
        "| protocol | cold start | scale-out (+1 member) | partitions revoked from incumbents | most unowned at once |"
    )
    print("|---|---|---|---|---|")
    for protocol, label in (("classic", "classic (baseline)"), ("consumer", "KIP-848 consumer")):
        rows = results[protocol]
        print(
            f"| {label} | {statistics.median(x['cold'] for x in rows):.2f} s "
            f"| {statistics.median(x['scale'] for x in rows):.2f} s "
            f"| {statistics.median(x['revoked'] for x in rows):.0f} "
            f"| {statistics.median(x['unowned'] for x in rows):.0f} |"
        )


if __name__ == "__main__":
    main()
