"""Load from real Kafka clients with per-partition sequence numbers, and the exactly-once check.

    load = SequencedProducer(bootstrap, "orders", partitions=8, client="confluent", rate=300)
    load.start(); ...; load.set_rate(50); load.set_weights({0: 10}); ...; load.stop()
    check_exactly_once(bootstrap, "orders", [load, other_load])
    create_topic(bootstrap, "orders", 8)

Each producer is idempotent with acks=all (confluent-kafka / librdkafka, or kafka-python) and
writes values `<name>:<partition>:<seq>` (padded to `value_size`), seq counting up per partition.
It records every acknowledged (partition, offset, seq). `check_exactly_once` reads the partitions
back with a confluent-kafka consumer (assign from the start to the high watermark) and asserts:
every acknowledged record is there once, at the offset it was acknowledged with; no value appears
twice; each producer's seqs rise with the offset in every partition (order kept). A record whose
acknowledgement was lost may be present (at most once), as Kafka allows.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer


@dataclass
class Acked:
    partition: int
    offset: int
    seq: int


@dataclass
class SequencedProducer:
    bootstrap: str
    topic: str
    partitions: int
    client: str = "confluent"  # or "kafka-python"
    rate: float = 200.0  # records per second, all partitions together
    value_size: int = 200
    name: str = "p"
    weights: dict[int, float] = field(default_factory=dict)  # partition -> relative weight (default 1)
    acked: list[Acked] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seq: dict[int, int] = defaultdict(int)
        self._thread = threading.Thread(target=self._run, name=f"load-{self.name}", daemon=True)
        self._latencies: list[tuple[float, float]] = []  # (sent at, seconds to ack)
        self._credit: dict[int, float] = {}

    # ---------------------------------------------------------------- control

    def start(self) -> SequencedProducer:
        self._thread.start()
        return self

    def set_rate(self, rate: float) -> None:
        self.rate = rate

    def set_weights(self, weights: dict[int, float]) -> None:
        self.weights = dict(weights)

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"producer {self.name} did not flush within {timeout}s"

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def latencies(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        """Seconds from send to acknowledgement of records sent in [since, until) (time.monotonic)."""
        with self._lock:
            return [lat for at, lat in self._latencies if since <= at < until]

    # ---------------------------------------------------------------- the loop

    def _value(self, partition: int) -> tuple[bytes, int]:
        seq = self._seq[partition]
        self._seq[partition] = seq + 1
        head = f"{self.name}:{partition}:{seq}:".encode()
        return head + b"x" * max(0, self.value_size - len(head)), seq

    def _pick(self) -> int:
        """Smooth weighted round-robin: each partition gets exactly its share, evenly spread
        (random picks would make per-broker rates noisy, and balance checks flaky)."""
        total = 0.0
        for p in range(self.partitions):
            w = self.weights.get(p, 1.0)
            total += w
            self._credit[p] = self._credit.get(p, 0.0) + w
        best = max(range(self.partitions), key=self._credit.__getitem__)
        self._credit[best] -= total
        return best

    def _on_ack(self, partition: int, seq: int, sent_at: float, offset: int | None, error: object) -> None:
        with self._lock:
            if error is not None or offset is None:
                self.errors.append(f"{partition}:{seq}: {error}")
                return
            self.acked.append(Acked(partition, offset, seq))
            self._latencies.append((sent_at, time.monotonic() - sent_at))

    def _run(self) -> None:
        if self.client == "confluent":
            self._run_confluent()
        else:
            self._run_kafka_python()

    def _paced(self) -> Iterable[None]:
        """Yield once per record to send, at `rate` records/s (re-read each tick)."""
        tick = 0.01
        credit = 0.0
        while not self._stop.is_set():
            credit += self.rate * tick
            while credit >= 1.0:
                credit -= 1.0
                yield None
            time.sleep(tick)

    def _run_confluent(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "retries": 1_000_000,
            }
        )
        for _ in self._paced():
            partition = self._pick()
            value, seq = self._value(partition)
            sent_at = time.monotonic()

            def report(err, msg, partition=partition, seq=seq, sent_at=sent_at):
                self._on_ack(partition, seq, sent_at, msg.offset() if err is None else None, err)

            while True:
                try:
                    producer.produce(self.topic, value=value, partition=partition, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.sent += 1
            producer.poll(0)
        remaining = producer.flush(120)
        if remaining:
            self.errors.append(f"{remaining} records not acknowledged at stop")

    def _run_kafka_python(self) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap.split(","),
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
            retries=1_000_000,
            delivery_timeout_ms=120_000,
        )
        try:
            for _ in self._paced():
                partition = self._pick()
                value, seq = self._value(partition)
                sent_at = time.monotonic()
                future = producer.send(self.topic, value=value, partition=partition)
                future.add_callback(
                    lambda md, partition=partition, seq=seq, sent_at=sent_at: self._on_ack(
                        partition, seq, sent_at, md.offset, None
                    )
                )
                future.add_errback(
                    lambda exc, partition=partition, seq=seq, sent_at=sent_at: self._on_ack(
                        partition, seq, sent_at, None, exc
                    )
                )
                self.sent += 1
            producer.flush(120)
        finally:
            producer.close(10)


def create_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout_s)


def read_partitions(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0) -> dict[int, list]:
    """Every record of the topic, per partition, as (offset, value), from offset 0 to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    try:
        ends = {}
        for p in range(partitions):
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        out: dict[int, list] = {p: [] for p in range(partitions)}
        pending = {p for p in range(partitions) if ends[p] > 0}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= ends[msg.partition()]:
                        pending.discard(msg.partition())
                    continue
                raise AssertionError(f"consumer error: {msg.error()}")
            out[msg.partition()].append((msg.offset(), msg.value()))
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
        assert not pending, f"partitions {sorted(pending)} not read to their end {ends} within {timeout_s}s"
        return out
    finally:
        consumer.close()


def check_exactly_once(bootstrap: str, topic: str, producers: list[SequencedProducer]) -> int:
    """Assert the module doc's guarantees; returns how many acknowledged records were checked."""
    partitions = max(p.partitions for p in producers)
    records = read_partitions(bootstrap, topic, partitions)
    problems: list[str] = []
    for partition, rows in records.items():
        offsets = [o for o, _ in rows]
        if offsets != sorted(set(offsets)):
            problems.append(f"partition {partition}: offsets not strictly increasing")
        seen: dict[bytes, int] = {}
        last_seq: dict[str, int] = {}
        for offset, value in rows:
            if value in seen:
                problems.append(f"partition {partition}: {value[:40]!r} at offsets {seen[value]} and {offset}")
            seen[value] = offset
            name, part, seq, _ = value.split(b":", 3)
            if int(part) != partition:
                problems.append(f"partition {partition}: offset {offset} holds a record for partition {int(part)}")
            key = name.decode()
            if int(seq) <= last_seq.get(key, -1):
                problems.append(f"partition {partition}: {key} seq {int(seq)} after {last_seq[key]} (offset {offset})")
            last_seq[key] = int(seq)
    checked = 0
    for producer in producers:
        assert not producer.errors, f"producer {producer.name} failed: {producer.errors[:5]}"
        by_offset = {p: dict(rows) for p, rows in records.items()}
        for ack in producer.acked:
            checked += 1
            value = by_offset.get(ack.partition, {}).get(ack.offset)
            prefix = f"{producer.name}:{ack.partition}:{ack.seq}:".encode()
            if value is None or not value.startswith(prefix):
                problems.append(
                    f"acknowledged {prefix!r} at partition {ack.partition} offset {ack.offset}: read {value[:40] if value else None!r}"
                )
    assert not problems, f"{len(problems)} problems, first: {problems[:10]}"
    return checked
