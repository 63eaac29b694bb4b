"""What authorization and client quotas cost on the produce path, and how closely a byte-rate
quota holds a producer. Prints numbers next to the same-run baseline; asserts nothing.

    python benchmarks/security_bench.py                 # 64 MiB per run, 2 rounds (~5 min)
    python benchmarks/security_bench.py --mib 256 --rounds 3

1. per-call costs in this process: a check with no authorizer configured, a cached
   authorization decision (1000 ACLs loaded), quota bookkeeping for one request;
2. rounds of three one-broker `automq local up` clusters (real processes), each producing
   --mib of 1 KiB records with acks=all from confluent-kafka: plain (no authorizer, no
   quota: the baseline), acls (authorizer on, ACLs allowing the producer), quotas (a
   producer_byte_rate far above reach: bookkeeping on every request, never a throttle);
   the best of the rounds is compared, as the machine is shared;
3. throttled: a producer_byte_rate of --quota-mib MiB/s and 40 s worth of it to send; the
   achieved rate is printed next to what Kafka's rate window allows over the same time
   (quota x (T + 10 s) / T: the first ~10 s x quota pass at once).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from automq.broker import local

MiB = 1 << 20
RECORD = 1024
TOPIC = "bench"


def start(data: Path, sets: list[str], base_port: int | None) -> tuple[subprocess.Popen[str], str]:
    port = base_port if base_port is not None else local.free_port_block(1)
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", "1"]
    cmd += ["--data-dir", str(data), "--port", str(port)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("bootstrap: "):
            return proc, line.split(" ", 1)[1].strip()
    stop(proc)
    raise SystemExit(f"the local cluster did not start; logs under {data}/logs")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def prepare(bootstrap: str, mode: str, quota_bytes: float) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if mode == "acls":
        # allowed to create these because no ACL exists on the cluster yet (allow-everyone)
        acls = [
            AclBinding(
                ResourceType.TOPIC,
                TOPIC,
                ResourcePatternType.LITERAL,
                "User:ANONYMOUS",
                "*",
                op,
                AclPermissionType.ALLOW,
            )
            for op in (AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE)
        ]
        for f in admin.create_acls(acls).values():
            f.result(30)
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(60)
    if mode in ("quotas", "throttled"):
        from kafka.admin import KafkaAdminClient
        from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

        Entry = AlterClientQuotasRequest.EntryData
        request = AlterClientQuotasRequest(
            entries=[
                Entry(
                    entity=[Entry.EntityData(entity_type="client-id", entity_name="bench-producer")],
                    ops=[Entry.OpData(key="producer_byte_rate", value=quota_bytes, remove=False)],
                )
            ],
            validate_only=False,
        )
        kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            response = kadmin._manager.run(kadmin._manager.send, request)
            assert all(e.error_code == 0 for e in response.entries), response
        finally:
            kadmin.close()


def produce(bootstrap: str, total: int) -> tuple[float, int]:
    """(MiB/s, throttle callbacks seen)."""
    from confluent_kafka import Producer

    throttles: list[int] = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "bench-producer",
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 256 * 1024,
            "throttle_cb": lambda e: throttles.append(e.throttle_time),
        }
    )
    payload = b"x" * RECORD
    n = total // RECORD
    started = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(TOPIC, payload)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(600)
    elapsed = time.perf_counter() - started
    return n * RECORD / MiB / elapsed, len([t for t in throttles if t > 0])


def micro() -> None:
    """Per-call costs, in this process: what a request pays for a check when nothing is
    configured, a cached authorization decision, and quota bookkeeping."""
    import timeit

    from automq.broker.config import KafkaConfig
    from automq.broker.controller.acls import AclBinding
    from automq.broker.controller.quotas import ClientQuota
    from automq.broker.kafka.authorizer import Authorizer
    from automq.broker.kafka.quotas import PRODUCE, ClientQuotas

    authorizer = Authorizer(KafkaConfig(authorizer_class_name="standard"))
    authorizer.update(tuple(AclBinding(2, f"t{i}", 3, "User:ANONYMOUS", "*", 4, 3) for i in range(1000)))
    quotas = ClientQuotas(KafkaConfig())
    quotas.update((ClientQuota((("client-id", "c"),), {"producer_byte_rate": 1e12}),))
    holder = type("B", (), {"authorizer": None})()
    n = 1_000_000
    off = timeit.timeit(lambda: holder.authorizer is not None, number=n) / n
    empty = timeit.timeit(lambda: None, number=n) / n
    cached = timeit.timeit(lambda: authorizer.authorize("User:ANONYMOUS", "127.0.0.1", 4, 2, "t7"), number=n) / n
    record = timeit.timeit(lambda: quotas.record(PRODUCE, "ANONYMOUS", "c", 1000), number=n // 10) / (n // 10)
    print(f"empty lambda call (baseline)        {empty * 1e9:7.0f} ns")
    print(f"authorizer off: one 'is None' check {off * 1e9:7.0f} ns")
    print(f"authorizer on: cached decision      {cached * 1e9:7.0f} ns  (1000 ACLs)")
    print(f"quota bookkeeping per request       {record * 1e9:7.0f} ns", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="MiB produced per mode")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of plain / acls / quotas (best of each is kept)")
    ap.add_argument("--quota-mib", type=float, default=2.0, help="the throttled mode's producer_byte_rate, MiB/s")
    ap.add_argument("--base-port", type=int, default=None, help="first port of the clusters (each mode adds 20)")
    args = ap.parse_args()
    micro()
    common = ["group.initial.rebalance.delay.ms=0"]
    sets = {
        "plain": [],
        "acls": ["authorizer.class.name=standard", "allow.everyone.if.no.acl.found=true"],
        "quotas": [],
    }
    runs: dict[str, list[float]] = {m: [] for m in sets}
    with tempfile.TemporaryDirectory(prefix="security-bench-") as tmp:
        i = 0
        for r in range(args.rounds):
            for mode, extra in sets.items():
                port = None if args.base_port is None else args.base_port + 20 * (i % 10)
                proc, bootstrap = start(Path(tmp) / f"c{i}", common + extra, port)
                i += 1
                try:
                    prepare(bootstrap, mode, 1e12)
                    rate, _ = produce(bootstrap, args.mib * MiB)
                finally:
                    stop(proc)
                runs[mode].append(rate)
                print(f"round {r + 1} {mode:7s} {rate:8.1f} MiB/s", flush=True)
        port = None if args.base_port is None else args.base_port + 20 * (i % 10)
        proc, bootstrap = start(Path(tmp) / "throttled", common, port)
        try:
            quota = args.quota_mib * MiB
            prepare(bootstrap, "throttled", quota)
            rate, throttled, seconds = produce_throttled(bootstrap, int(quota * 40))
        finally:
            stop(proc)
    base = max(runs["plain"])
    print(f"\nproduce, 1 KiB records, acks=all, best of {args.rounds} (all: {runs})")
    print(f"plain   {base:8.1f} MiB/s (baseline)")
    for mode in ("acls", "quotas"):
        print(f"{mode:7s} {max(runs[mode]):8.1f} MiB/s  {max(runs[mode]) / base * 100:5.1f} % of baseline")
    # Kafka's rate divides by at least 10 windows of 1 s, so over a run of T seconds a client
    # gets quota x (T + 10 s) through: what a Java broker would allow in the same run
    expected = args.quota_mib * (seconds + 10.0) / seconds
    print(
        f"throttled: quota {args.quota_mib:.2f} MiB/s; achieved {rate:.2f} MiB/s over {seconds:.1f} s; "
        f"Kafka's window arithmetic allows {expected:.2f} MiB/s over that time; {throttled} throttle callbacks"
    )
    print("(busy machine: brokers and the load generator share it; numbers include that contention)")


def produce_throttled(bootstrap: str, total: int) -> tuple[float, int, float]:
    """(MiB/s over the run, throttle callbacks, seconds the run took)."""
    from confluent_kafka import Producer

    throttles: list[int] = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "bench-producer",
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 256 * 1024,
            "throttle_cb": lambda e: throttles.append(e.throttle_time),
        }
    )
    payload = b"x" * RECORD
    started = time.perf_counter()
    for _ in range(total // RECORD):
        while True:
            try:
                p.produce(TOPIC, payload)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(600)
    elapsed = time.perf_counter() - started
    return total / MiB / elapsed, len([t for t in throttles if t > 0]), elapsed


if __name__ == "__main__":
    main()
