"""The linters and the type checker run with the tests, so CI keeps them at zero findings.

Rules and settings live in pyproject.toml ([tool.ruff], [tool.mypy]); CONTRIBUTING.md says how
to run them by hand and .pre-commit-config.yaml runs the same checks before a commit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint_has_no_findings() -> None:
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_unchanged() -> None:
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_no_error() -> None:
    # broker/, operator/ and spark-jobs/ through .namespace/ (see [tool.mypy]); strict on the pure cores
    result = _run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr
