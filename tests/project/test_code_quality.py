"""The linters and the type checker run with the tests, so CI keeps them at zero findings.

Rules and settings live in pyproject.toml ([tool.ruff], [tool.mypy]); CONTRIBUTING.md says how
to run them by hand and .pre-commit-config.yaml runs the same checks before a commit. The
commands are in conftest.py (CHECKS), which starts them in the background once collection is
done; each test waits for its check and asserts on its outcome.
"""

from __future__ import annotations


def test_ruff_lint_has_no_findings(code_check) -> None:
    result = code_check("ruff_lint")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_unchanged(code_check) -> None:
    result = code_check("ruff_format")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_no_error(code_check) -> None:
    result = code_check("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
