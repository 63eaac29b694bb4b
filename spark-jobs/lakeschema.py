"""The schema of a JSON lake table when executors infer it piecewise.

Each executor task decodes its own records and so infers its own Arrow schema. A task whose
schema the table already holds (every column there, with the same type or one the table's
type takes losslessly) writes its data files at once; any other reports its schema and
writes nothing. The driver then widens the table ONCE with the union of the reported
schemas (Iceberg `union_by_name`: columns are only added, types only promoted) and the
reporting tasks run again against the widened table. So a run that meets no new field reads
and converts its records once; the tasks that met one pay twice.

Why not infer on the driver or in a separate pass: a separate pass reads and decodes every
record twice, always; the driver has one core.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update.schema import UpdateSchema


def fit(schema: pa.Schema, table: pa.Schema) -> pa.Schema:
    """`schema` with the columns the table's type takes without loss typed as the table's:
    integers of a floating-point column (a JSON field that is 1 here and 1.5 elsewhere:
    Iceberg cannot turn a double column into long), and numbers or booleans of a string
    column (a field that is 7 here and "7a" elsewhere; decoding the two together gives
    strings too, "7")."""
    by_name = {f.name: f for f in table}
    return pa.schema([_fit_field(f, by_name.get(f.name)) for f in schema])


def _fit_field(field: pa.Field, target: pa.Field | None) -> pa.Field:
    if target is None:
        return field
    if pa.types.is_integer(field.type) and pa.types.is_floating(target.type):
        return field.with_type(target.type)
    if _is_scalar(field.type) and _is_text(target.type) and not _is_text(field.type):
        return field.with_type(target.type)
    if pa.types.is_struct(field.type) and pa.types.is_struct(target.type):
        inner = {target.type.field(i).name: target.type.field(i) for i in range(target.type.num_fields)}
        children = [field.type.field(i) for i in range(field.type.num_fields)]
        return field.with_type(pa.struct([_fit_field(c, inner.get(c.name)) for c in children]))
    return field


def needs_evolution(table_schema: Schema, rows: pa.Schema) -> bool:
    """Whether rows of this Arrow schema need the table's schema widened first: a column (or
    nested field) it lacks, or a type it must promote. A conflict Iceberg cannot resolve
    counts too: the driver's union then fails the run with Iceberg's message."""
    update = UpdateSchema(None, schema=table_schema)  # type: ignore[arg-type]  # a dry run, never committed
    try:
        update.union_by_name(fit(rows, table_schema.as_arrow()))
    except Exception:  # e.g. ValidationError: the driver widening the table reports it
        return True
    return bool(update._adds or update._updates)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_scalar(t: pa.DataType) -> bool:
    return _is_text(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def unify(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema holding every column of `schemas` (first appearance decides the order),
    every field nullable, with the types one decode of all the records together would give:
    int and double of one field become double, a string and a number or boolean of one field
    string. Other conflicts (an object here, a number there) raise ArrowTypeError."""
    unique = list(dict.fromkeys(schemas))
    if len(unique) > 1:
        text = {
            f.name
            for s in unique
            for f in s
            if _is_text(f.type) and all(_is_scalar(g.type) for o in unique for g in o if g.name == f.name)
        }
        if text:
            unique = [pa.schema([f.with_type(pa.large_string()) if f.name in text else f for f in s]) for s in unique]
    merged = unique[0] if len(unique) == 1 else pa.unify_schemas(unique, promote_options="permissive")
    return pa.schema([f.with_nullable(True) for f in merged])


def evolve(table: Table, schemas: list[pa.Schema]) -> None:
    """Widen `table` to hold rows of every schema in `schemas`, in one metadata commit
    (`table` is refreshed to it)."""
    merged = fit(unify(schemas), table.schema().as_arrow())
    with table.update_schema() as update:
        update.union_by_name(merged)
