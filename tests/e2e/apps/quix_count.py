"""A quixstreams application counting records per key, run as its own process by
tests/e2e/test_quixstreams.py under the interpreter of `.venv-streams` (quixstreams caps
confluent-kafka below the version the rest of the suite needs, so it lives in its own
environment; scripts/setup-venv.sh makes it).

Each input record (any JSON value) bumps its key's count in a state store (RocksDB, backed
by a compacted changelog topic); the new count goes to the output topic under the same key.
With exactly-once a key's outputs must read 1, 2, ..., n exactly once through any failure.

    python quix_count.py BOOTSTRAP INPUT OUTPUT GROUP GUARANTEE STATE_DIR
"""

from __future__ import annotations

import sys

from quixstreams import Application, State


def count(value: object, state: State) -> dict[str, int]:
    n = int(state.get("count", 0)) + 1
    state.set("count", n)
    return {"count": n}


def main() -> None:
    bootstrap, source, sink, group, guarantee, state_dir = sys.argv[1:7]
    producer_config = {}
    if guarantee == "exactly-once":
        # a stable id (one per instance, as a deployment would give it): a restarted instance
        # fences its predecessor instead of running beside it
        producer_config["transactional.id"] = f"{group}-0"
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee=guarantee,
        commit_interval=0.5,
        state_dir=state_dir,
        producer_extra_config=producer_config,
        consumer_extra_config={"session.timeout.ms": 10_000, "heartbeat.interval.ms": 1_000},
        loglevel="INFO",
    )
    source_topic = app.topic(source, key_deserializer="str", value_deserializer="json")
    sink_topic = app.topic(sink, key_serializer="str", value_serializer="json")
    app.dataframe(source_topic).apply(count, stateful=True).to_topic(sink_topic)
    app.run()


if __name__ == "__main__":
    main()
