"""Deleting lake-table files no snapshot needs (lakefiles.py) on a real pyiceberg table (sqlite
catalog, local warehouse), no Spark: what an expiry drops goes, what the current snapshot reads
stays, orphans go only past their age, metadata files are never touched."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.expressions import In

from automq.spark import iceberg, lakefiles
from automq.spark.lakecompact import compact_files


def _files(table) -> set[str]:
    return {str(p) for p in Path(table.location().removeprefix("file://")).rglob("*") if p.is_file()}


def _rows(table) -> list[tuple]:
    return sorted((r["id"], r["v"]) for r in table.scan().to_arrow().to_pylist())


def test_expired_and_replaced_files_go_orphans_only_past_their_age(tmp_path):
    cat = iceberg.open_catalog(f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse")
    cat.create_namespace("lake")
    table = cat.create_table("lake.t", pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())]))
    for i in range(4):  # upserts as ingestion writes them: copy-on-write delete + append
        txn = table.transaction()
        txn.delete(In("id", [1, 2]))
        txn.append(pa.table({"id": pa.array([1, 2, 10 + i], pa.int64()), "v": [f"u{i}"] * 3}))
        txn.commit_transaction()
        table = table.refresh()
    expected = _rows(table)
    assert expected == [(1, "u3"), (2, "u3"), (10, "u0"), (11, "u1"), (12, "u2"), (13, "u3")]
    assert compact_files(table, 64 << 20).status == "compacted"
    table = table.refresh()
    before = lakefiles.reachable_files(table)
    on_disk = _files(table)
    assert iceberg.expire_snapshots(table, int(time.time() * 1000) + 1) >= 4
    removed = lakefiles.remove_unreferenced(table, before)
    table = table.refresh()
    assert removed.files > 0 and removed.failed == 0
    left = _files(table)

    def not_json(files: set[str]) -> set[str]:
        return {f for f in files if not f.endswith(".metadata.json")}

    assert not_json(left) < not_json(on_disk) and _rows(table) == expected
    live = {p.removeprefix("file://") for p in lakefiles.reachable_files(table)}
    assert not_json(left) == live  # all that is left is used
    assert any(f.endswith(".metadata.json") for f in left)

    data_dir = Path(table.location().removeprefix("file://")) / "data"
    old, fresh = data_dir / "old-orphan.parquet", data_dir / "fresh-orphan.parquet"
    old.write_bytes(b"x" * 10)
    fresh.write_bytes(b"y" * 10)
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    report = lakefiles.remove_orphans(table, int(time.time() * 1000) - 60_000)  # older than a minute
    assert (report.files, report.bytes) == (1, 10)
    assert not old.exists() and fresh.exists()  # a run still writing is not robbed of its files
    assert _rows(table.refresh()) == expected
