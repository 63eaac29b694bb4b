"""Shared fixtures: a real SeaweedFS S3 server for the session, a fresh bucket or local
object-store directory per test.

- `seaweedfs` (session, synchronous, started only by tests that ask for it): the running
  server (`.endpoint`, `.access_key`, `.secret_key`, `.stop()`, `.start()` to restart on the
  same ports and data). Its credentials are exported to os.environ (AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION) so every backend and subprocess finds them.
- `s3_url`: `s3://<fresh bucket>?endpoint=...&region=us-east-1&path_style=true`.
- `file_url`: `file://<tmp_path>/objects`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from automq.broker.objectstore.seaweedfs import SeaweedFS, SeaweedFSStartError

# Test-only helpers shared across folders (kmock emulator, kubelet harness): `import kubelet_harness`.
sys.path.insert(0, str(Path(__file__).parent / "support"))

# Directories of session-scoped fixtures start with this; everything else a module's tests
# and fixtures make under the session's base temp dir is removed when the module is done.
SESSION_DIR_PREFIX = "session-"


# --- running on several workers (pytest-xdist, `-n 2` in the README's test command) ----------
#
# Most of the suite waits on real processes, sockets and disks, not on this process's CPU, so a
# second worker nearly halves the wall time on a 2-core machine. What is shared is kept shared:
# - a test module runs whole on one worker (its module fixtures start once);
# - the Spark tests run on one worker together (ONE Spark session, Spark cluster and PostgreSQL
#   server per run, tests/spark/conftest.py), and so do the image tests (one podman build);
# - each worker has its own SeaweedFS (the `seaweedfs` fixture is per process): fault tests stop
#   and kill -9 theirs, which must not take the other worker's store away mid-test.
# The two directories above go first, then modules holding slow tests, then the rest: the run
# does not end with one worker alone on a long unit it picked up last.
WHOLE_DIRECTORIES = ("tests/spark/", "tests/image/")


def work_unit(nodeid: str) -> str:
    """What one worker runs as a whole: the test's module, or its directory if listed above."""
    path = nodeid.split("::", 1)[0]
    for directory in WHOLE_DIRECTORIES:
        if path.startswith(directory):
            return directory
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems made
    return WorkUnitScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after the folders' hooks that add `slow` (tests/faults)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # one process: keep the files' order
    slow = {work_unit(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        unit = work_unit(item.nodeid)
        return 0 if unit in WHOLE_DIRECTORIES else 1 if unit in slow else 2

    items.sort(key=rank)  # stable, and the same for a unit's every test: units stay contiguous


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """A test that runs a CLI in-process (`configure_logging`) replaces the root logger's
    handlers with one writing to that test's captured stderr; once pytest closes it, every
    later log record printed "--- Logging error --- I/O operation on closed file" tracebacks
    into the run's output. Such handlers are removed after the test (pytest's own capturing
    handlers come and go with each test phase and are left alone), and the root level reset."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers and not type(h).__module__.startswith("_pytest"):
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture(scope="module", autouse=True)
def _remove_a_passed_modules_directories(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Every broker's data dir holds a preallocated volume WAL (256 MiB by default), and the
    suite starts some 150 of them: kept to the session's end they took 18 GB of disk, and a CI
    machine with less free space failed every later test that writes. Function-level
    `tmp_path` dirs go right after a passing test (tmp_path_retention_policy in pyproject);
    this removes the `tmp_path_factory.mktemp` dirs of module-scoped fixtures once the module's
    fixtures are torn down, unless one of its tests failed (then all stay, to be looked at)."""
    base = tmp_path_factory.getbasetemp()
    before = set(os.listdir(base))
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed != failed_before:
        return
    for name in set(os.listdir(base)) - before:
        if not name.startswith(SESSION_DIR_PREFIX):
            shutil.rmtree(base / name, ignore_errors=True)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(data_dir=tmp_path_factory.mktemp(SESSION_DIR_PREFIX + "seaweedfs"))
    try:
        server.start()
    except SeaweedFSStartError as exc:
        pytest.fail(f"could not start SeaweedFS: {exc}", pytrace=False)
    saved = {
        key: os.environ.get(key)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED")
    }
    server.export_environment()
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_url(seaweedfs: SeaweedFS) -> Iterator[str]:
    if not seaweedfs.running:  # a previous fault test left it stopped
        seaweedfs.start()
    bucket = seaweedfs.create_bucket()
    yield seaweedfs.url_for(bucket)
    # Each bucket holds SeaweedFS volumes; drop it so long sessions do not run out.
    if seaweedfs.running:
        try:
            seaweedfs.delete_bucket(bucket)
        except Exception:
            pass


@pytest.fixture
def file_url(tmp_path) -> str:
    return f"file://{tmp_path}/objects"
