"""Deleting the files of a lake table that no snapshot needs any more.

Expiring snapshots (iceberg.expire_snapshots) only drops them from the table metadata, and a
small-file compaction only marks the files it replaced as deleted in its new snapshot: the
bytes stay in the warehouse until something deletes them. pyiceberg has no such job, so:

- `remove_unreferenced(table, before)`: after an expiry, the data files, manifests and
  manifest lists that were reachable from the snapshots in `before` (collected just before
  the expiry) and are not reachable from any snapshot left. Only files this table itself
  referenced are touched, so it is safe at any age.
- `remove_orphans(table, older_than_ms)`: files under the table's location that no snapshot
  and no metadata file references, last modified before `older_than_ms`: what a run killed
  between writing files and committing left, or a commit that lost a race (its written files
  were never referenced). The age guard is what makes it safe next to a run that is writing
  files right now and has not committed them yet: keep it well above the longest run.

"Reachable" counts a data file only through its live manifest entries (added or existing), the
rule Iceberg's own expiry uses: a file a retained snapshot lists as deleted is gone from it.
Metadata JSON files (the current one and those in the metadata log) are never deleted here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlparse

from pyarrow.fs import FileSelector, FileSystem, FileType
from pyiceberg.table import Table

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FileRemoval:
    files: int = 0  # deleted
    bytes: int = 0  # of those that were listed with a size (orphans)
    failed: int = 0


def reachable_files(table: Table) -> set[str]:
    """Every data file, delete file, manifest and manifest list the table's snapshots reach."""
    out: set[str] = set()
    io = table.io
    for snapshot in table.snapshots():
        out.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            out.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                out.add(entry.data_file.file_path)
    for stats in table.metadata.statistics:
        out.add(stats.statistics_path)
    return out


def _metadata_files(table: Table) -> set[str]:
    out = {entry.metadata_file for entry in table.metadata.metadata_log}
    if table.metadata_location:
        out.add(table.metadata_location)
    return out


def _delete(table: Table, paths: list[str], report: FileRemoval) -> None:
    for path in paths:
        try:
            table.io.delete(path)
        except FileNotFoundError:
            continue  # already gone (a second cleaner, or never written)
        except OSError as exc:
            report.failed += 1
            log.warning("%s: could not delete %s: %s", table.name(), path, exc)
        else:
            report.files += 1


def remove_unreferenced(table: Table, before: set[str]) -> FileRemoval:
    """Delete what `before` (reachable_files of the table before an expiry) reached and the
    table's snapshots no longer do."""
    report = FileRemoval()
    table = table.refresh()
    _delete(table, sorted(before - reachable_files(table) - _metadata_files(table)), report)
    return report


def _key(uri: str) -> str:
    """A file's identity independent of how it is spelled: scheme-less bucket/key or path."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return parsed.path
    return f"{parsed.netloc}{parsed.path}"


def _filesystem(table: Table) -> tuple[FileSystem, str]:
    """The pyarrow filesystem of the table's FileIO and the location as that filesystem names it."""
    location = table.location()
    parsed = urlparse(location)
    fs_by_scheme = getattr(table.io, "fs_by_scheme", None)
    if fs_by_scheme is None:
        raise ValueError(
            f"{table.name()}: orphan removal needs pyiceberg's PyArrowFileIO, not {type(table.io).__name__}"
        )
    fs = fs_by_scheme(parsed.scheme or "file", parsed.netloc)
    return fs, _key(location).rstrip("/")


def remove_orphans(table: Table, older_than_ms: int) -> FileRemoval:
    """Delete files under the table's location that nothing references, modified before
    `older_than_ms` (epoch ms)."""
    report = FileRemoval()
    table = table.refresh()
    known = {_key(p) for p in reachable_files(table) | _metadata_files(table)}
    fs, root = _filesystem(table)
    scheme = urlparse(table.location()).scheme
    doomed: list[str] = []
    sizes = 0
    try:
        infos = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return report
    for info in infos:
        # local paths come back absolute, S3 ones as bucket/key: what _key makes of a URI
        if info.type != FileType.File or info.path in known or info.path.endswith(".metadata.json"):
            continue  # metadata files: a commit in flight writes one before swapping it in
        if info.mtime is None or info.mtime.timestamp() * 1000 >= older_than_ms:
            continue
        doomed.append(f"file://{info.path}" if scheme in ("", "file") else f"{scheme}://{info.path}")
        sizes += info.size or 0
    _delete(table, doomed, report)
    report.bytes = sizes
    return report
