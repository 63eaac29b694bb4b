"""Small-file compaction of the lake tables: every ingestion commit adds at least one data file,
so a table ingested every few minutes soon has thousands of small files, and every scan pays
one open (and one GET) per file. This rewrites the small data files of each partition of the
table into large ones, in one atomic commit.

The commit is an Iceberg `overwrite` snapshot that deletes the small files and adds the
rewritten ones, carrying the table's current `automq.offsets` forward, so the exactly-once
state (the next offset per Kafka partition) is exactly what it was. It is based on the
snapshot it read: a concurrent ingestion commit makes it lose (`CommitFailedException`, the
table unchanged, tried again on the next run), never the ingestion's data.

Tables with delete files (merge-on-read, written by another engine; this job's upserts are
copy-on-write and have none) are left alone: rewriting their data files
would need the deletes applied or rewritten too.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.table import FileScanTask, Table

from automq.spark.iceberg import OFFSETS_PROPERTY

log = logging.getLogger(__name__)

COMPACTION_PROPERTY = "automq.compaction"  # in the rewrite's snapshot summary: what it replaced


@dataclass(slots=True)
class FileCompaction:
    status: str  # "compacted" | "nothing-to-do" | "skipped" | "lost"
    files_before: int = 0  # small files replaced
    files_after: int = 0  # files written
    rows: int = 0
    message: str = ""


def compact_files(table: Table, small_bytes: int) -> FileCompaction:
    """Rewrite each partition's data files below `small_bytes` (two or more of them) into as
    few files as the table's write.target-file-size-bytes allows, in one commit."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return FileCompaction("nothing-to-do")
    tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
    if any(t.delete_files for t in tasks):
        return FileCompaction(
            "skipped", message="the table has delete files (merge-on-read, another engine wrote them)"
        )
    by_partition: dict[tuple[int, str], list[FileScanTask]] = defaultdict(list)
    for t in tasks:
        if t.file.file_size_in_bytes < small_bytes:
            by_partition[(t.file.spec_id, repr(t.file.partition))].append(t)
    small = [t for group in by_partition.values() if len(group) >= 2 for t in group]
    if not small:
        return FileCompaction("nothing-to-do")
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    props = {COMPACTION_PROPERTY: f"rewrote {len(small)} small files"}
    if OFFSETS_PROPERTY in summary:
        props[OFFSETS_PROPERTY] = summary[OFFSETS_PROPERTY]
    txn = table.transaction()
    metadata = txn.table_metadata
    rows = ArrowScan(metadata, table.io, metadata.schema(), AlwaysTrue()).to_table(small)
    written = list(_dataframe_to_data_files(table_metadata=metadata, df=rows, io=table.io))
    with txn.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
        for t in small:
            overwrite.delete_data_file(t.file)
        for data_file in written:
            overwrite.append_data_file(data_file)
    try:
        txn.commit_transaction()
    except CommitFailedException as exc:
        # The files written are unreferenced; the table is as the concurrent commit left it.
        log.info("%s: file compaction lost to a concurrent commit (%s)", table.name(), exc)
        return FileCompaction("lost", len(small), 0, rows.num_rows, str(exc))
    return FileCompaction("compacted", len(small), len(written), rows.num_rows)
