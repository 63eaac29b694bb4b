"""The repository's promises to a newcomer: one namespace, two README commands, CI runs one of them."""

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_folders_import_under_one_namespace_without_shadowing_stdlib():
    import operator as stdlib_operator

    assert hasattr(stdlib_operator, "itemgetter"), "stdlib operator must stay importable"
    for name, folder in {
        "automq.broker": "broker",
        "automq.operator": "operator",
        "automq.spark": "spark-jobs",
    }.items():
        module = importlib.import_module(name)
        assert Path(next(iter(module.__path__))).resolve() == ROOT / folder


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"<!-- (main|test)-command -->\n```bash\n(.+?)\n```", readme)
    assert [kind for kind, _ in blocks] == ["main", "test"]
    main_cmd, test_cmd = (cmd for _, cmd in blocks)
    # both install into a virtual environment (a stock Debian/Ubuntu Python refuses pip otherwise)
    assert "automq local up" in main_cmd and "scripts/setup-venv.sh" in main_cmd
    assert "pytest" in test_cmd and "scripts/setup-venv.sh dev" in test_cmd
    setup = (ROOT / "scripts" / "setup-venv.sh").read_text()
    assert "-m venv .venv" in setup and "pip install" in setup
    extracted = subprocess.run(
        [
            "bash",
            "-c",
            "awk '/<!-- test-command -->/{f=1;next} f && /^```/ {if (++n==2) exit; next} f && n==1' README.md",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted == test_cmd
    assert "README.md" in (ROOT / ".ci" / "run").read_text()


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("broker", "controller", "operator", "local"):
        assert command in out.stdout


def test_repo_root_on_sys_path_does_not_shadow_stdlib_operator():
    # `python -m pip ...` and `python -m pytest` put the current directory first on sys.path.
    # A regular package operator/ there would replace the stdlib module for every import of
    # `collections` that follows (a fresh venv imports it late), so operator/ must stay a
    # namespace portion (no __init__.py): namespace portions always lose to regular modules.
    assert not (ROOT / "operator" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-S", "-c", "import operator, collections; print(operator.eq.__module__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "_operator"


def test_each_package_is_marked_typed_and_ships_the_marker():
    # PEP 561: users' type checkers read our annotations (and the wheel carries the marker)
    for folder in ("broker", "operator", "spark-jobs"):
        assert (ROOT / folder / "py.typed").is_file()
    assert '"py.typed"' in (ROOT / "setup.py").read_text()


SHELL_SCRIPTS = sorted([*ROOT.glob("scripts/*.sh"), ROOT / ".ci" / "run"])


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_scripts_pass_shellcheck(script: Path):
    """Warnings and errors (an unchecked cd, an unquoted expansion) fail; shellcheck's info
    notes do not (build-base-image.sh's hooks are single-quoted on purpose: mmdebstrap expands
    them). scripts/install-system-deps.sh installs shellcheck."""
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck is not installed (bash scripts/install-system-deps.sh installs it)")
    result = subprocess.run([shellcheck, "--severity=warning", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
