"""The code-quality checks (ruff lint, ruff format, mypy: test_code_quality.py) start in the
background as soon as collection is done, when those tests are selected, instead of when
their tests come up: mypy alone is ~20 s of one core, and on CI's 2-core machine the suite
before them mostly waits on processes and clients, so the checks overlap with that waiting.
Each test then waits for its own check's result; what runs and what is asserted is unchanged.
Under pytest-xdist a worker starts a check only when one of its tests asks for it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUALITY_MODULE = "test_code_quality.py"
TIMEOUT_S = 300.0

# name -> `python -m` arguments, run in the repository root
CHECKS: dict[str, tuple[str, ...]] = {
    "ruff_lint": ("ruff", "check", "--no-cache", "."),
    "ruff_format": ("ruff", "format", "--check", "--no-cache", "."),
    # broker/, operator/ and spark-jobs/ through .namespace/ (see [tool.mypy]); strict on the pure cores
    "mypy": ("mypy", "--no-incremental"),
}


@dataclass
class _Check:
    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    result: subprocess.CompletedProcess[str] | None = None

    def wait(self) -> subprocess.CompletedProcess[str]:
        if self.result is None:
            try:
                self.process.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
            self.stdout.seek(0)
            self.stderr.seek(0)
            self.result = subprocess.CompletedProcess(
                self.process.args,
                self.process.returncode,
                self.stdout.read().decode(errors="replace"),
                self.stderr.read().decode(errors="replace"),
            )
            self.stdout.close()
            self.stderr.close()
        return self.result


_started: dict[str, _Check] = {}


def _start(name: str) -> _Check:
    if name not in _started:
        # files, not pipes: nobody reads until the test comes up, and a full pipe would block
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        process = subprocess.Popen([sys.executable, "-m", *CHECKS[name]], cwd=ROOT, stdout=out, stderr=err)
        _started[name] = _Check(process, out, err)
    return _started[name]


def pytest_collection_finish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: start on demand only
        return
    if any(item.path.name == QUALITY_MODULE and item.path.parent == Path(__file__).parent for item in session.items):
        for name in CHECKS:
            _start(name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for check in _started.values():  # e.g. -x stopped the run before the tests that wait on them
        if check.process.poll() is None:
            check.process.kill()
            check.process.wait()


@pytest.fixture(scope="session")
def code_check():
    """code_check(name) -> the CompletedProcess (text) of CHECKS[name], started now if not yet."""
    return lambda name: _start(name).wait()
