"""Regenerate docs/configuration.md from the config model and the topic config table.

    python docs/generate_configuration.py          # rewrite the file
    python docs/generate_configuration.py --check  # exit 1 if it is stale (tests do this)

Facts come from their one place: keys, types and defaults from the pydantic models in
`automq.broker.config`, meanings from the comment on each field's line there (or the
field's description); topic configs from `automq.broker.topic_configs`. The few
meanings below (`FALLBACK_MEANINGS`) cover fields that have no comment in config.py yet.
"""

from __future__ import annotations

import inspect
import io
import re
import sys
import tokenize
import typing
from pathlib import Path

from pydantic import BaseModel

from automq.broker import config as config_module
from automq.broker.config import NodeConfig
from automq.broker.objectstore.s3 import S3Settings
from automq.broker.topic_configs import topic_config_table

DOC = Path(__file__).with_name("configuration.md")

FALLBACK_MEANINGS = {
    "node_id": "This node's id, unique among brokers (controllers use their own); stable across restarts",
    "cluster_id": "Name of the cluster; every node of one cluster uses the same",
    "object_store_url": "Where data and metadata live: `s3://bucket?endpoint=...&region=...&path_style=true` or `file:///path`",
    "controller_urls": "HTTP URLs of the controllers; a broker tries them in order",
    "rack": "Rack/zone of this broker, reported to clients (rack-aware consumers)",
    "listeners": "Kafka listeners this broker binds (name, host, port, advertised host/port)",
    "http_host": "Address of the HTTP endpoint (metrics, health, controller API)",
    "heartbeat_interval_ms": "A broker heartbeats to the controller this often",
    "session_timeout_ms": "The controller fences a broker whose heartbeats stopped this long ago",
    "log_level": "Process log level",
    "wal": "The write-ahead log (section below)",
    "storage": "Caches and uploads of the storage engine (section below)",
    "kafka": "Kafka broker defaults (section below)",
    "controller": "The metadata controller (section below)",
    "wal.kind": "`volume`: a preallocated file or block device used as a ring; `s3`: bulk objects in the object store",
    "storage.read_ahead_initial_bytes": "First read-ahead of a catch-up reader",
    "storage.read_ahead_max_bytes": "Read-ahead grows per miss up to this (per stream, and at most half the block cache over the streams catching up; reads in flight stay within a quarter of the block cache and count against it)",
    "listeners[].name": "Listener name (clients see it in metadata)",
    "listeners[].host": "Bind address",
    "listeners[].port": "Bind port",
    "listeners[].advertised_port": "Port clients are told; defaults to port",
    "kafka.auto_create_topics_enable": "Metadata/Produce for an unknown topic creates it",
    "kafka.num_partitions": "partitions of a topic created without a count",
    "kafka.default_replication_factor": "accepted up to the number of live brokers; a partition has one replica",
    "kafka.log_retention_ms": "default `retention.ms` of topics",
    "kafka.log_retention_bytes": "default `retention.bytes` of topics; -1 = no limit",
    "kafka.message_max_bytes": "default `max.message.bytes` (largest batch) of topics",
    "kafka.socket_request_max_bytes": "larger requests are refused and the connection closed",
    "kafka.group_initial_rebalance_delay_ms": "wait for more members before the first rebalance of an empty group",
    "kafka.group_min_session_timeout_ms": "smallest session timeout a consumer may ask for",
    "kafka.group_max_session_timeout_ms": "largest session timeout a consumer may ask for",
    "kafka.offsets_retention_ms": "committed offsets of an empty group expire after this (Kafka's `offsets.retention.minutes`, here in ms)",
    "kafka.transactional_id_expiration_ms": "State of an idle transactional id expires after this",
    "kafka.producer_id_expiration_ms": "idempotent producer state of an idle producer expires after this",
}


def _field_comments(cls: type) -> dict[str, str]:
    """`name: type = default  # comment` -> {name: comment}, read from the class source."""
    source = inspect.getsource(cls)
    comments: dict[str, str] = {}
    field_re = re.compile(r"^\s+(\w+)\s*:")
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = lines[tok.start[0] - 1]
            m = field_re.match(line)
            if m and not line.strip().startswith("#"):
                comments[m.group(1)] = tok.string.lstrip("#").strip()
    return comments


def _type_name(annotation: object) -> str:
    metadata = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extra = metadata
        validators = [getattr(m, "func", None) for m in extra]
        if config_module.parse_size in validators:
            return "size"
        if config_module.parse_duration_ms in validators:
            return "duration (ms)"
        return _type_name(base)
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("|", "\\|")


def _default(info) -> str:
    if info.is_required():
        return "(required)"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return "one " + type(value[0]).__name__ + " with its defaults"
    return _format_default(value)


def _format_default(value: object) -> str:
    """A plain default value as the tables show it."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is None:
        return "none"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{value}`"


def model_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of every field of a section, depth-first."""
    comments = _field_comments(model)
    rows = []
    for name, info in model.model_fields.items():
        key = prefix + name
        meaning = comments.get(name) or info.description or FALLBACK_MEANINGS.get(key, "")
        if prefix == "kafka.":
            kafka = config_module.kafka_name(name)
            meaning = f"`{kafka}`: {meaning}" if kafka is not None else f"(no Kafka key) {meaning}"
        annotation = info.annotation
        rows.append(
            (
                key,
                _type_name(info.rebuild_annotation() if hasattr(info, "rebuild_annotation") else annotation),
                _default(info),
                meaning,
            )
        )
    return rows


def sections() -> list[tuple[str, str, type[BaseModel], str]]:
    """(title, docstring, model, key prefix) of the top level and each section."""
    out = [("Top level", NodeConfig.__doc__ or "", NodeConfig, "")]
    for name, info in NodeConfig.model_fields.items():
        ann = info.annotation
        inner = typing.get_args(ann)[0] if typing.get_origin(ann) is list else ann
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            prefix = f"{name}[]." if typing.get_origin(ann) is list else f"{name}."
            out.append((f"`{name}`", inner.__dict__.get("__doc__") or "", inner, prefix))
    return out


def all_keys() -> list[str]:
    return [row[0] for _, _, model, prefix in sections() for row in model_rows(model, prefix)]


INTRO = """# Configuration

<!-- Generated by `python docs/generate_configuration.py` from broker/config.py and
broker/topic_configs.py. Edit those, then regenerate; a test fails when this is stale. -->

Every process (`automq broker`, `automq controller`) reads one YAML file given with
`--config FILE`. The operator renders the same model into its ConfigMap and
`automq local up` writes one file per node under `<data-dir>/config/`, so all three agree
on every key. Unknown keys are errors (a typo must not silently become a default), and
every error names the key:

```
$ automq broker --config broker.yaml
invalid configuration in broker.yaml:
  kafka.num_partition: unknown key
```

Sizes take bytes or a unit (`512KiB`, `64MiB`, `2GiB`); durations take milliseconds or a
unit (`250ms`, `60s`, `5m`). A minimal broker file:

```yaml
node_id: 1
object_store_url: s3://automq?endpoint=http://127.0.0.1:8333&region=us-east-1&path_style=true
controller_urls: ["http://127.0.0.1:9093"]
listeners:
  - {name: PLAINTEXT, host: 0.0.0.0, port: 9092, advertised_host: broker-1.example}
```

Local mode (`automq local up --brokers N --data-dir DIR --port P [--object-store URL]`)
writes the controller's and each broker's file itself: broker *i* listens on `P+i-1`, the
HTTP ports are picked free, the object store defaults to `file://DIR/objects` and is
remembered in `DIR/cluster.yaml` (a restart without `--object-store` reuses it). Process
logs go to `DIR/logs/`, pids to `DIR/run/`. A node that exits on its own is restarted
(a broker replays its WAL, the controller reloads the metadata log) after a delay that
doubles with each exit in a row (0.5 s up to 60 s); the others keep running, and a node
that keeps exiting is named with the last lines of its log. Ctrl-C or SIGTERM stops the brokers
first (graceful: flush, upload, deregister), then the controller, and kills whatever did not
stop within 30 s. Starting again with the same `--data-dir` recovers every topic, record
and committed offset.

Any other key reaches every node's file with `--set KEY=VALUE` (repeatable; dotted keys such
as `kafka.num_partitions=3` or `wal.capacity=64MiB`, or a broker key by its Kafka name such as
`num.partitions=3`, `group.min.session.timeout.ms=1000`, `group.initial.rebalance.delay.ms=0`;
values are YAML scalars) and `--config FILE` (a YAML fragment of a node config, merged into
every node's; `--set` wins). A controller ignores the broker-only sections. An unknown or bad
key stops the start before any process runs, naming the key; the keys local mode sets itself
(`node_id`, `listeners`, `http_port`, `data_dir`, `object_store_url`, ...) are refused with the
option to use instead. These settings are not remembered: a start without them uses the
defaults. The effective settings and `group.initial.rebalance.delay.ms` are printed at start.

## Node config keys
"""

TOPIC_INTRO = """
## Topic configs

Set at creation (`CreateTopics` configs) or later (`AlterConfigs`,
`IncrementalAlterConfigs`: SET, DELETE, and APPEND/SUBTRACT for list keys). A topic stores
only the keys set on it; the others fall back to the broker default, which is the node
config's `kafka.*` field when one exists (e.g. `retention.ms` ← `kafka.log_retention_ms`)
and Kafka's default otherwise. `DescribeConfigs` reports each value's source
(`DYNAMIC_TOPIC_CONFIG`, `STATIC_BROKER_CONFIG` for a key set in the node file,
`DEFAULT_CONFIG`), its synonyms in precedence order and its type, as a Kafka broker does.
Unknown keys and bad values are refused with `INVALID_CONFIG` and a message naming the key,
e.g. `Invalid value soon for configuration retention.ms: Not a number of type LONG`.

Broker resources (`DescribeConfigs` on a broker id) list the node's `kafka.*` keys under
their Kafka names plus `node.id`, `broker.rack`, `listeners` and `advertised.listeners`;
they are read-only: altering them is refused with `INVALID_REQUEST` (change the node
config file and restart the broker).

`cleanup.policy=compact` topics are compacted by the Spark key-compaction job (`automq spark
compact --keys`, docs/spark.md) when it runs; between runs such a topic keeps every record.
Kafka guarantees compaction eventually and never when, so readers of compacted topics
already cope with superseded values. The `automq.table.topic.*` keys configure lake
ingestion (`automq spark ingest`, docs/spark.md). Retention by time/size applies only when the
policy includes `delete`, as in Kafka. Retention checks run every 5 minutes (Kafka's
`log.retention.check.interval.ms` default) and trim whole record batches, oldest first.

"""


S3_INTRO = """
## S3 object store URL parameters

`object_store_url: s3://BUCKET?endpoint=...&region=...&path_style=true&...` takes these
query parameters (an unknown or malformed one, or an integer below its minimum, stops the
start, naming it). Credentials come from the standard AWS chain (environment,
config files, instance roles), never from the URL.

| Parameter | Type | Default | Meaning |
|---|---|---|---|
"""


def s3_rows() -> list[tuple[str, str, str, str]]:
    """(parameter, type, default, meaning) of every S3 URL parameter but the bucket."""
    import dataclasses

    from automq.broker.objectstore.s3 import _INT_PARAMS

    comments = _field_comments(S3Settings)
    rows = []
    for field in dataclasses.fields(S3Settings):
        if field.name == "bucket":
            continue
        value = field.default
        default = _format_default(value)
        type_name = {bool: "bool", int: "int"}.get(type(value), "str")
        if field.name in _INT_PARAMS:
            type_name += f" (>= {_INT_PARAMS[field.name]})"
        rows.append((field.name, type_name, default, comments.get(field.name, "")))
    return rows


def render() -> str:
    out = [INTRO]
    for title, doc, model, prefix in sections():
        out.append(f"\n### {title}\n\n")
        if doc and model is not NodeConfig:
            out.append(" ".join(doc.split()) + "\n\n")
        out.append("| Key | Type | Default | Meaning |\n|---|---|---|---|\n")
        for key, type_name, default, meaning in model_rows(model, prefix):
            meaning = meaning.replace("|", "\\|")
            out.append(f"| `{key}` | {type_name} | {default} | {meaning} |\n")
    out.append(S3_INTRO)
    for name, type_name, default, meaning in s3_rows():
        out.append(f"| `{name}` | {type_name} | {default} | {meaning.replace('|', chr(92) + '|')} |\n")
    out.append(TOPIC_INTRO)
    out.append(topic_config_table())
    return "".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python docs/generate_configuration.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
