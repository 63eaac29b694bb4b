"""How far a producer that pipelines many requests gets past a producer_byte_rate quota.
Prints numbers next to what Kafka's rate window allows; asserts nothing.

    python benchmarks/quota_overshoot_bench.py                  # 1 MiB/s quota, 20 s per client
    python benchmarks/quota_overshoot_bench.py --quota-mib 2 --seconds 30 --base-port 36100

One broker (`automq local up`, a real process, Kafka's default quota window 11 x 1 s). Two
producers, each with its own client id under the same quota, one after the other:
- raw: a hostile client on one connection that keeps --in-flight Produce requests of
  --batch-kib outstanding at all times and never honours throttle_time_ms (what Kafka's
  channel muting exists for);
- confluent: librdkafka with max.in.flight 100, small batches and no linger, which does
  honour throttle times but has many requests on the wire when the first throttle arrives.
For each, the acknowledged bytes over --seconds are compared with Kafka's allowance over the
same time: quota x (T + 10 s) / T (a rate is measured over at least 10 s, so the first
~10 s worth of quota passes at once). "overshoot" = achieved / allowance.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from automq.broker import local

MiB = 1 << 20
TOPIC = "quota-bench"
WINDOW_NUM, WINDOW_S = 11, 1.0


def start(data: Path, port: int | None) -> tuple[subprocess.Popen[str], str]:
    port = port if port is not None else local.free_port_block(1)
    cmd = [sys.executable, "-m", "automq.broker.cli", "local", "up", "--brokers", "1"]
    cmd += ["--data-dir", str(data), "--port", str(port), "--set", "group.initial.rebalance.delay.ms=0"]
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


def prepare(bootstrap: str, quota: float, client_ids: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(60)
    Entry = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest(
        entries=[
            Entry(
                entity=[Entry.EntityData(entity_type="client-id", entity_name=c)],
                ops=[Entry.OpData(key="producer_byte_rate", value=quota, remove=False)],
            )
            for c in client_ids
        ],
        validate_only=False,
    )
    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        response = kadmin._manager.run(kadmin._manager.send, request)
        assert all(e.error_code == 0 for e in response.entries), response
    finally:
        kadmin.close()


async def raw(bootstrap: str, seconds: float, batch_bytes: int, in_flight: int) -> tuple[int, int]:
    """(bytes acknowledged within `seconds`, largest throttle_time_ms seen)."""
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.static.primitive import i16, i32Timedelta

    from automq.broker.kafka import codec, records

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    now_ms = int(time.time() * 1000)
    one = records.encode_record(0, 0, None, b"x" * (batch_bytes - 100))
    batch = records.build_batch(0, [one], last_offset_delta=0, base_timestamp=now_ms, max_timestamp=now_ms)
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        topic_data=(TopicProduceData(name=TOPIC, partition_data=(PartitionProduceData(index=0, records=batch),)),),  # type: ignore[arg-type]
    )
    frames = [codec.encode_request(i, request, client_id="raw-pipeliner") for i in range(1, in_flight * 4 + 1)]
    size = struct.Struct(">i")
    slots = asyncio.Semaphore(in_flight)
    acked, max_throttle = 0, 0
    deadline = time.monotonic() + seconds
    stop_writing = asyncio.Event()

    async def write() -> None:
        i = 0
        while not stop_writing.is_set():
            await slots.acquire()
            frame = frames[i % len(frames)]
            writer.write(size.pack(len(frame)) + frame)
            i += 1
            await writer.drain()

    async def read() -> None:
        nonlocal acked, max_throttle
        while time.monotonic() < deadline:
            try:
                (n,) = size.unpack(await asyncio.wait_for(reader.readexactly(4), deadline - time.monotonic()))
                frame = await reader.readexactly(n)
            except TimeoutError:
                return
            _, response = codec.decode_response(frame, ProduceRequest)
            if time.monotonic() > deadline:
                return
            p = response.responses[0].partition_responses[0]
            if p.error_code == 0:
                acked += len(batch)
            max_throttle = max(max_throttle, int(response.throttle_time.total_seconds() * 1000))
            slots.release()

    writer_task = asyncio.create_task(write())
    await read()
    stop_writing.set()
    writer_task.cancel()
    writer.close()
    return acked, max_throttle


def confluent(bootstrap: str, seconds: float, batch_bytes: int) -> tuple[int, int]:
    from confluent_kafka import Producer

    throttles: list[int] = []
    acked = [0]
    deadline = time.monotonic() + seconds

    def delivered(err, msg) -> None:
        if err is None and time.monotonic() <= deadline:
            acked[0] += len(msg.value())

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "rdkafka-pipeliner",
            "acks": 1,
            "linger.ms": 0,
            "batch.size": batch_bytes,
            "max.in.flight.requests.per.connection": 100,
            "queue.buffering.max.kbytes": 64 * 1024,
            "throttle_cb": lambda e: throttles.append(e.throttle_time),
        }
    )
    payload = b"x" * (batch_bytes - 200)
    while time.monotonic() < deadline:
        try:
            p.produce(TOPIC, payload, on_delivery=delivered)
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.purge()
    p.flush(30)
    return acked[0], int(max(throttles, default=0) * 1000)  # throttle_cb gives seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quota-mib", type=float, default=1.0, help="producer_byte_rate, MiB/s")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each producer runs")
    ap.add_argument("--batch-kib", type=int, default=64, help="bytes per Produce request")
    ap.add_argument("--in-flight", type=int, default=100, help="raw client: requests outstanding")
    ap.add_argument("--base-port", type=int, default=None)
    args = ap.parse_args()
    quota = args.quota_mib * MiB
    allowance = quota * (args.seconds + (WINDOW_NUM - 1) * WINDOW_S) / args.seconds
    with tempfile.TemporaryDirectory(prefix="quota-overshoot-") as tmp:
        proc, bootstrap = start(Path(tmp) / "c", args.base_port)
        try:
            prepare(bootstrap, quota, ["raw-pipeliner", "rdkafka-pipeliner"])
            print(
                f"quota {args.quota_mib:g} MiB/s; Kafka's window allows {allowance / MiB:.2f} MiB/s over {args.seconds:g} s"
            )
            results = {
                "raw": asyncio.run(raw(bootstrap, args.seconds, args.batch_kib * 1024, args.in_flight)),
                "confluent": confluent(bootstrap, args.seconds, args.batch_kib * 1024),
            }
        finally:
            stop(proc)
    for name, (acked, throttle) in results.items():
        rate = acked / args.seconds
        print(
            f"{name:9s} {rate / MiB:7.2f} MiB/s acknowledged  overshoot {rate / allowance:5.2f}x  "
            f"(largest throttle_time_ms {throttle})"
        )


if __name__ == "__main__":
    main()
