"""Turning the data source's rows (Arrow) into a table topic's rows, per the topic's
`automq.table.topic.*` configs: value conversion (raw | string | json | by_schema_id |
by_latest_schema, the last two in avroconvert.py: Avro, JSON Schema and Protobuf), transforms (none |
flatten | flatten_debezium), and the split into good rows and dead letters.

Whole columns at a time (pyarrow compute, polars' JSON decoder); per-record Python only for
the records of a batch that failed vectorised decoding, to tell the bad ones apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from automq.broker import topic_configs as tc
from automq.spark import avroconvert

META_PREFIX = "_kafka_"  # metadata columns of JSON and Avro tables (the values' fields own the plain names)
# conversions whose values' fields become the table's columns (the table's schema follows them)
FIELD_CONVERSIONS = ("json", "by_schema_id", "by_latest_schema")
REGISTRY_CONVERSIONS = ("by_schema_id", "by_latest_schema")
DLQ_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("error", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class TableSettings:
    """A topic's `automq.table.topic.*` configs, defaults filled in."""

    enabled: bool = False
    commit_interval_ms: int = 0
    namespace: str = "kafka"
    convert: str = "raw"
    transform: str = "none"
    id_columns: tuple[str, ...] = ()
    partition_by: tuple[tuple[str, str, int | None], ...] = ()
    errors_tolerance: str = "none"
    value_subject: str = ""  # by_latest_schema: the registry subject ("" = <topic>-value)
    value_message: str = ""  # by_latest_schema, Protobuf: the message's full name ("" = the first)
    # set by the job, not by topic configs: where the schema registry is, and for
    # by_latest_schema the id of the subject's latest schema when the run started
    registry_url: str = ""
    latest_schema_id: int | None = None

    @property
    def has_fields(self) -> bool:
        """Whether the values' fields are the table's columns (its schema evolves with them)."""
        return self.convert in FIELD_CONVERSIONS

    @classmethod
    def from_topic_configs(cls, configs: dict[str, str]) -> TableSettings:
        def get(name: str) -> str:
            key = tc.TOPIC_CONFIGS[tc.TABLE_PREFIX + name]
            return tc.validate_value(key.name, configs[key.name]) if key.name in configs else key.default

        settings = cls(
            enabled=get("enable") == "true",
            commit_interval_ms=int(get("commit.interval.ms")),
            namespace=get("namespace"),
            convert=get("convert.value.type"),
            transform=get("transform.value.type"),
            id_columns=tuple(c for c in get("id.columns").split(",") if c),
            partition_by=tuple(tc.parse_partition_by(get("partition.by"))),
            errors_tolerance=get("errors.tolerance"),
            value_subject=get("convert.value.subject"),
            value_message=get("convert.value.message.full.name"),
        )
        if settings.transform != "none" and not settings.has_fields:
            raise tc.TopicConfigError(
                f"automq.table.topic.transform.value.type={settings.transform} needs "
                f"automq.table.topic.convert.value.type one of {', '.join(FIELD_CONVERSIONS)}"
            )
        return settings


class ConversionError(Exception):
    """Records could not be converted and errors.tolerance is none."""


@dataclass(slots=True)
class Converted:
    rows: pa.Table
    dead: pa.Table  # DLQ_SCHEMA
    deletes: pa.Table | None = None  # flatten_debezium: id columns of deleted rows


def convert(rows: pa.Table, settings: TableSettings, *, merge_ids: bool = True) -> Converted:
    """Rows of the data source (ROW_SCHEMA) -> rows of the topic's table. Upserts
    (flatten_debezium with id.columns): `merge_ids=False` keeps every image of an id (the
    executors' upsert picks the latest after the shuffle) and computes no deletes; records
    whose image lacks an id are bad records either way."""
    if settings.convert == "raw":
        return Converted(rows, DLQ_SCHEMA.empty_table())
    if settings.convert == "string":
        return _to_string(rows, settings)
    if settings.convert in REGISTRY_CONVERSIONS:
        return _to_avro(rows, settings, merge_ids)
    return _to_json(rows, settings, merge_ids)


def _dead(rows: pa.Table, errors: list[str]) -> pa.Table:
    return pa.table(
        {
            "topic": rows["topic"],
            "partition": rows["partition"],
            "offset": rows["offset"],
            "timestamp": rows["timestamp"],
            "key": rows["key"],
            "value": rows["value"],
            "error": pa.array(errors, pa.string()),
        },
        schema=DLQ_SCHEMA,
    )


def _check_tolerance(dead: pa.Table, settings: TableSettings) -> None:
    if dead.num_rows and settings.errors_tolerance == "none":
        first = dead.slice(0, 1).to_pylist()[0]
        raise ConversionError(
            f"{dead.num_rows} record(s) cannot be converted ({settings.convert}); first: topic {first['topic']} "
            f"partition {first['partition']} offset {first['offset']}: {first['error']}. Set "
            "automq.table.topic.errors.tolerance=all to send them to the dead-letter table instead"
        )


def _to_string(rows: pa.Table, settings: TableSettings) -> Converted:
    values = rows["value"]
    try:
        as_text = values.cast(pa.string())  # validates UTF-8 for the whole column
        good, dead = rows, DLQ_SCHEMA.empty_table()
        bad_mask = None
    except pa.ArrowInvalid:
        bad_mask = pa.array([_bad_utf8(v) for v in values.to_pylist()], pa.bool_())
        good = rows.filter(pc.invert(bad_mask))
        dead = _dead(rows.filter(bad_mask), ["value is not valid UTF-8"] * pc.sum(bad_mask).as_py())
        as_text = good["value"].cast(pa.string())
    _check_tolerance(dead, settings)
    out = good.set_column(good.schema.get_field_index("value"), "value", as_text)
    return Converted(out, dead)


def _bad_utf8(v: bytes | None) -> bool:
    if v is None:
        return False
    try:
        v.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _json_error(v: bytes | None) -> str | None:
    if v is None:
        return None
    try:
        doc = json.loads(v)
    except (UnicodeDecodeError, ValueError) as exc:
        return f"value is not JSON: {exc}"
    if not isinstance(doc, dict):
        return f"value is JSON {type(doc).__name__}, not an object"
    return None


def _meta(rows: pa.Table) -> dict[str, pa.ChunkedArray]:
    return {
        f"{META_PREFIX}partition": rows["partition"],
        f"{META_PREFIX}offset": rows["offset"],
        f"{META_PREFIX}timestamp": rows["timestamp"],
        f"{META_PREFIX}key": rows["key"],
        f"{META_PREFIX}headers": rows["headers"],
    }


def _decode_json(values: pa.ChunkedArray) -> pl.DataFrame:
    text = pl.from_arrow(values.cast(pa.string()))
    assert isinstance(text, pl.Series)
    decoded = text.str.json_decode(infer_schema_length=None)
    if decoded.dtype == pl.Null:  # every value null
        return pl.DataFrame({"_": [None] * len(text)}).drop("_")
    if not isinstance(decoded.dtype, pl.Struct):
        raise ValueError("values are not JSON objects")
    return decoded.struct.unnest()


def _to_json(rows: pa.Table, settings: TableSettings, merge_ids: bool = True) -> Converted:
    dead = DLQ_SCHEMA.empty_table()
    if settings.transform == "flatten_debezium":
        # Debezium follows a delete with a tombstone (null value) for log compaction: no row
        rows = rows.filter(pc.is_valid(rows["value"]))
    try:
        fields = _decode_json(rows["value"])
        good = rows
    except Exception:
        # tell the bad records apart one by one, then decode the good ones at once
        errors = [_json_error(v) for v in rows["value"].to_pylist()]
        bad_mask = pa.array([e is not None for e in errors], pa.bool_())
        dead = _dead(rows.filter(bad_mask), [e for e in errors if e is not None])
        good = rows.filter(pc.invert(bad_mask))
        fields = _decode_json(good["value"]) if good.num_rows else pl.DataFrame()
    _check_tolerance(dead, settings)
    return _shape(good, fields, dead, settings, merge_ids)


def _to_avro(rows: pa.Table, settings: TableSettings, merge_ids: bool = True) -> Converted:
    if settings.transform == "flatten_debezium":
        rows = rows.filter(pc.is_valid(rows["value"]))  # tombstones, as for JSON
    latest = settings.latest_schema_id if settings.convert == "by_latest_schema" else None
    try:
        decoded = avroconvert.decode(rows["value"].to_pylist(), settings.registry_url, latest, settings.value_message)
    except avroconvert.RegistryUnavailable as exc:
        raise ConversionError(str(exc)) from None
    dead = DLQ_SCHEMA.empty_table()
    good = rows
    if decoded.errors:
        good_mask = pa.array(decoded.good, pa.bool_())
        dead = _dead(rows.filter(pc.invert(good_mask)), decoded.errors)
        good = rows.filter(good_mask)
    _check_tolerance(dead, settings)
    fields: pl.DataFrame | pa.Table = decoded.fields
    if settings.transform != "none" and decoded.fields.num_columns:
        df = pl.from_arrow(decoded.fields)
        assert isinstance(df, pl.DataFrame)
        fields = df
    return _shape(good, fields, dead, settings, merge_ids)


def _shape(
    good: pa.Table, fields: pl.DataFrame | pa.Table, dead: pa.Table, settings: TableSettings, merge_ids: bool
) -> Converted:
    """The values' fields (one row per record of `good`) -> the table's rows: transforms,
    the Kafka metadata columns, upsert ids."""
    op: list[str | None] = []
    if isinstance(fields, pl.DataFrame):
        if settings.transform == "flatten_debezium":
            fields, op = _debezium(fields)
        if settings.transform in ("flatten", "flatten_debezium"):
            fields = _flatten(fields)
    elif settings.transform == "flatten_debezium":
        op = [None] * good.num_rows
    meta = pa.table(_meta(good))
    table = meta
    data = fields.to_arrow() if isinstance(fields, pl.DataFrame) else fields
    if data.num_columns:
        for name in data.column_names:
            if name in meta.column_names:
                continue
            table = table.append_column(name, data[name])
    deletes = None
    if settings.transform == "flatten_debezium":
        table = table.append_column(f"{META_PREFIX}op", pa.array(op, pa.string()))
        if settings.id_columns:
            table, no_id = _split_missing_ids(table, good, settings.id_columns)
            if no_id.num_rows:
                dead = pa.concat_tables([dead, no_id])
                _check_tolerance(dead, settings)
            if merge_ids and table.num_rows:  # (an id column no record has: no rows left)
                deletes = table.select(list(settings.id_columns))
                table = _latest_per_id(table, settings.id_columns)
    return Converted(table, dead, deletes)


def _split_missing_ids(table: pa.Table, source: pa.Table, id_columns: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
    """Upserts: rows whose image lacks an id column or has it null name no row to replace (and
    would all collapse into one "null id"): bad records, like undecodable ones. `source` is
    the data source's rows `table` was converted from, row for row. Returns (rows, dead)."""
    missing = [c for c in id_columns if c not in table.column_names]
    if missing:
        bad = pa.array([True] * table.num_rows, pa.bool_())
    else:
        bad = pc.is_null(table[id_columns[0]])
        for c in id_columns[1:]:
            bad = pc.or_(bad, pc.is_null(table[c]))
    if not table.num_rows or not pc.any(bad).as_py():
        return table, DLQ_SCHEMA.empty_table()
    what = ", ".join(repr(c) for c in id_columns)
    n = pc.sum(bad).as_py()
    errors = [f"automq.table.topic.id.columns: the record's image lacks id column(s) {what} or has them null"] * n
    return table.filter(pc.invert(bad)), _dead(source.filter(bad), errors)


def _flatten(df: pl.DataFrame) -> pl.DataFrame:
    """Nested objects become `parent_child` columns (recursively); lists stay lists."""
    while any(isinstance(dtype, pl.Struct) for dtype in df.dtypes):
        cols = []
        for name, dtype in zip(df.columns, df.dtypes, strict=True):
            if isinstance(dtype, pl.Struct):
                cols += [pl.col(name).struct.field(f.name).alias(f"{name}_{f.name}") for f in dtype.fields]
            else:
                cols.append(pl.col(name))
        df = df.select(cols)
    return df


def _debezium(df: pl.DataFrame) -> tuple[pl.DataFrame, list[str | None]]:
    """A Debezium envelope ({"before", "after", "op", ...}, optionally inside {"payload"})
    -> the row image (after; before for deletes) and the op (c, u, d, r)."""
    if "payload" in df.columns and isinstance(df.schema["payload"], pl.Struct):
        df = df.select(pl.col("payload").struct.unnest())
    if "op" not in df.columns:
        return df, [None] * df.height
    op = df["op"].cast(pl.String).to_list()
    parts = []
    for side in ("after", "before"):
        if side in df.columns and isinstance(df.schema[side], pl.Struct):
            parts.append(df[side])
    if not parts:
        return pl.DataFrame(), op
    after = parts[0]
    before = parts[1] if len(parts) > 1 else None
    before_df: pl.DataFrame | None
    if before is not None and before.dtype != after.dtype:
        # unify: fields of both sides, nulls where a side lacks one
        after_type, before_type = after.dtype, before.dtype
        assert isinstance(after_type, pl.Struct) and isinstance(before_type, pl.Struct)
        names = list(dict.fromkeys([f.name for f in after_type.fields] + [f.name for f in before_type.fields]))
        a = after.struct.unnest() if after_type.fields else pl.DataFrame(height=len(after))
        b = before.struct.unnest() if before_type.fields else pl.DataFrame(height=len(before))
        for n in names:
            if n not in a.columns:
                a = a.with_columns(pl.lit(None).alias(n))
            if n not in b.columns:
                b = b.with_columns(pl.lit(None).alias(n))
        after_df, before_df = a.select(names), b.select(names)
    else:
        after_df = after.struct.unnest()
        before_df = before.struct.unnest() if before is not None else None
    if before_df is None:
        return after_df, op
    is_delete = pl.Series([o == "d" for o in op])
    rows = pl.DataFrame(
        {
            n: pl.select(pl.when(is_delete).then(before_df[n]).otherwise(after_df[n])).to_series()
            for n in after_df.columns
        }
    )
    return rows, op


def _latest_per_id(table: pa.Table, id_columns: tuple[str, ...]) -> pa.Table:
    """Within one commit, only the latest image of each id counts (upsert)."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    df = df.sort(f"{META_PREFIX}partition", f"{META_PREFIX}offset").unique(
        subset=list(id_columns), keep="last", maintain_order=True
    )
    return df.to_arrow()
