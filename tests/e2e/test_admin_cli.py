"""`automq topics` and `automq groups` against the shared real cluster, as a user would type them."""

from __future__ import annotations

import json
import subprocess
import sys

from confluent_kafka import Consumer, TopicPartition


def _automq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", *args], capture_output=True, text=True, timeout=60
    )


def _json(*args: str):
    result = _automq(*args, "--output", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_topic_lifecycle(cluster, e2e):
    b = ("--bootstrap", cluster.bootstrap)
    name = e2e.topic_name("cli")
    created = _automq("topics", "create", name, "--partitions", "3", "--config", "retention.ms=3600000", *b)
    assert created.returncode == 0, created.stderr
    e2e.wait_for_leaders(cluster.bootstrap, name, 3)
    assert {"name": name, "partitions": 3, "internal": False} in _json("topics", "list", *b)
    e2e.produce(cluster.bootstrap, name, [b"v%d" % i for i in range(12)])
    detail = _json("topics", "describe", name, *b)
    assert [p["partition"] for p in detail["partitions"]] == [0, 1, 2]
    assert sum(p["end_offset"] - p["start_offset"] for p in detail["partitions"]) == 12
    assert detail["configs"] == {"retention.ms": "3600000"}

    altered = _automq("topics", "alter-config", name, "--set", "cleanup.policy=delete", "--delete", "retention.ms", *b)
    assert altered.returncode == 0, altered.stderr
    assert _json("topics", "describe", name, *b)["configs"] == {"cleanup.policy": "delete"}

    bad = _automq("topics", "alter-config", name, "--set", "retention.ms=soon", *b)
    assert bad.returncode == 1 and "INVALID_CONFIG" in bad.stderr
    again = _automq("topics", "create", name, *b)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr

    assert _automq("topics", "delete", name, *b).returncode == 0
    assert name not in {t["name"] for t in _json("topics", "list", *b)}
    missing = _automq("topics", "describe", name, *b)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


def test_group_lag(cluster, e2e):
    b = ("--bootstrap", cluster.bootstrap)
    name, group = e2e.topic_name("lag"), e2e.topic_name("g")
    e2e.create_topic(cluster.bootstrap, name, partitions=2)
    e2e.wait_for_leaders(cluster.bootstrap, name, 2)
    e2e.produce(cluster.bootstrap, name, [b"x"] * 30)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        # commit offset 5 on each partition: 25 of the 30 records are lag
        ends = {p: consumer.get_watermark_offsets(TopicPartition(name, p), timeout=30)[1] for p in (0, 1)}
        consumer.commit(offsets=[TopicPartition(name, p, 5) for p in (0, 1)], asynchronous=False)
    finally:
        consumer.close()
    assert sum(ends.values()) == 30
    assert any(g["group_id"] == group for g in _json("groups", "list", *b))
    detail = _json("groups", "describe", group, *b)
    assert detail["state"] in ("Empty", "Dead") and detail["members"] == []
    lags = {
        o["partition"]: (o["committed"], o["end_offset"], o["lag"]) for o in detail["offsets"] if o["topic"] == name
    }
    assert lags == {p: (5, ends[p], ends[p] - 5) for p in (0, 1)}
    assert detail["total_lag"] == 20
    table = _automq("groups", "describe", group, *b)
    assert table.returncode == 0 and "total lag 20" in table.stdout


def test_bad_usage_and_unreachable_cluster(tmp_path):
    assert _automq("topics", "list", "--bootstrap", "no-port").returncode == 2
    assert _automq("topics", "create", "x", "--config", "novalue", "--bootstrap", "127.0.0.1:1").returncode == 2
    down = _automq("topics", "list", "--bootstrap", "127.0.0.1:1")
    assert down.returncode == 1 and "no broker answered" in down.stderr
