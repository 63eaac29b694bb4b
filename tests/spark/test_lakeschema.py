"""JSON tables' piecewise schemas without Spark: which task schemas the table already holds,
and the one widening of a real (sqlite catalog) table from several tasks' schemas."""

from __future__ import annotations

import pyarrow as pa
import pytest

from automq.spark import iceberg, lakeschema

TABLE = pa.schema(
    [
        pa.field("_kafka_offset", pa.int64()),
        pa.field("id", pa.int64()),
        pa.field("score", pa.float64()),
        pa.field("geo", pa.struct([pa.field("lat", pa.float64())])),
        pa.field("name", pa.large_string()),
    ]
)


@pytest.fixture
def table(tmp_path):
    catalog = iceberg.open_catalog(f"sqlite:///{tmp_path}/catalog.db")
    return iceberg.create_table(catalog, "lake.t", TABLE, "t")


def test_a_task_writes_at_once_only_when_the_table_holds_its_columns(table):
    schema = table.schema()
    held = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    assert not lakeschema.needs_evolution(schema, held)
    # ints of a double column, nested too: the table's type takes them without loss
    ints = pa.schema([pa.field("score", pa.int64()), pa.field("geo", pa.struct([pa.field("lat", pa.int64())]))])
    assert not lakeschema.needs_evolution(schema, ints)
    assert lakeschema.needs_evolution(schema, pa.schema([pa.field("extra", pa.bool_())]))
    assert lakeschema.needs_evolution(schema, pa.schema([pa.field("geo", pa.struct([pa.field("lon", pa.float64())]))]))
    # a conflict the table cannot take is the driver's to report
    assert lakeschema.needs_evolution(schema, pa.schema([pa.field("id", pa.string())]))


def test_the_table_widens_once_with_every_task_s_columns(table):
    versions = len(table.metadata.schemas)
    tasks = [
        pa.schema([pa.field("id", pa.int64()), pa.field("n", pa.int64())]),
        pa.schema([pa.field("n", pa.float64()), pa.field("geo", pa.struct([pa.field("lon", pa.float64())]))]),
        pa.schema([pa.field("tags", pa.list_(pa.string())), pa.field("score", pa.int64())]),
    ]
    lakeschema.evolve(table, tasks)
    assert len(table.metadata.schemas) == versions + 1  # one commit
    fields = {f.name: str(f.field_type) for f in table.schema().fields}
    assert fields["n"] == "double" and fields["score"] == "double" and fields["tags"] == "list<string>"
    geo = table.schema().find_field("geo").field_type
    assert [(f.name, str(f.field_type)) for f in geo.fields] == [("lat", "double"), ("lon", "double")]
    assert not any(lakeschema.needs_evolution(table.schema(), s) for s in tasks)


def test_a_field_that_is_a_number_in_one_task_and_text_in_another_becomes_text(table):
    # as one decode of all the records would type it (polars: 7 and "7a" -> "7", "7a")
    lakeschema.evolve(table, [pa.schema([pa.field("x", pa.int64())]), pa.schema([pa.field("x", pa.string())])])
    assert str(table.schema().find_field("x").field_type) == "string"
    # and later tasks with numbers or booleans there write at once (cast to text)
    assert not lakeschema.needs_evolution(table.schema(), pa.schema([pa.field("x", pa.int64())]))
    assert not lakeschema.needs_evolution(table.schema(), pa.schema([pa.field("name", pa.bool_())]))


def test_types_no_table_can_hold_fail_the_widening_by_name(table):
    nested = pa.struct([pa.field("a", pa.int64())])
    with pytest.raises(pa.ArrowTypeError, match="y"):
        lakeschema.evolve(table, [pa.schema([pa.field("y", pa.int64())]), pa.schema([pa.field("y", nested)])])
