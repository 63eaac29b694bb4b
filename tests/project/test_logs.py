"""Process logging (automq.broker.logs): JSON lines, repeated warnings collapsed with a count.

Unit tests drive the repeat filter with a fake clock (no sleeps); the last test runs a real
controller process whose object store is unreachable, in JSON mode, and reads its stderr.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from automq.broker.logs import (
    FORMAT_ENV,
    REPEAT_WINDOW_ENV,
    JsonFormatter,
    LogSettingError,
    RepeatFilter,
    configure_logging,
)

FIELDS = {"time", "level", "logger", "message", "pid"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_logger(window_s: float = 10.0) -> tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]:
    clock = Clock()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(process="broker", node_id=3))
    repeat = RepeatFilter(window_s=window_s, clock=clock)
    repeat.handler = handler
    handler.addFilter(repeat)
    logger = logging.getLogger(f"automq.test.{id(stream)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG)
    return logger, stream, repeat, clock


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def failing_call(logger: logging.Logger, attempt: int) -> None:
    logger.warning("object store unreachable: %s (attempt %d)", "Connection refused", attempt)


def test_json_lines_carry_the_fields_a_pipeline_indexes():
    logger, stream, _, _ = make_logger()
    logger.info("hello %s", "world")
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("it failed")
    first, second = lines(stream)
    assert set(first) >= FIELDS
    assert first["message"] == "hello world" and first["level"] == "INFO"
    assert first["process"] == "broker" and first["node_id"] == 3 and first["pid"] == os.getpid()
    assert first["time"].endswith("Z") and first["time"][10] == "T" and len(first["time"]) == 24
    assert second["level"] == "ERROR" and "ValueError: bad\nvalue" in second["exception"]
    assert len(stream.getvalue().splitlines()) == 2, "a traceback must not break the one-line-per-record rule"


def test_ten_identical_warnings_a_second_become_one_line_and_a_count():
    logger, stream, repeat, clock = make_logger(window_s=10.0)
    for attempt in range(100):  # 10 s at 10 lines a second
        failing_call(logger, attempt)
        clock.now += 0.1
    assert [e["message"] for e in lines(stream)] == ["object store unreachable: Connection refused (attempt 0)"]
    clock.now += 0.5
    repeat.flush_expired()  # what the daemon thread does every second
    first, summary = lines(stream)
    assert summary["repeated"] == 99
    assert summary["message"].startswith("object store unreachable: Connection refused (attempt 99) [repeated 99")
    assert "repeated" not in first


def test_the_next_window_starts_with_a_line_again_and_a_quiet_call_flushes_at_exit():
    logger, stream, repeat, clock = make_logger(window_s=5.0)
    failing_call(logger, 1)
    failing_call(logger, 2)
    clock.now += 6
    failing_call(logger, 3)  # a new window: the summary of the old one comes first, then this
    failing_call(logger, 4)
    assert [(e["message"].split(" [")[0], e.get("repeated")) for e in lines(stream)] == [
        ("object store unreachable: Connection refused (attempt 1)", None),
        ("object store unreachable: Connection refused (attempt 2)", 1),
        ("object store unreachable: Connection refused (attempt 3)", None),
    ]
    repeat.flush_all()  # at exit, whether or not the window ended
    assert lines(stream)[-1]["repeated"] == 1 and "(attempt 4)" in lines(stream)[-1]["message"]


def test_exit_flush_skips_a_handler_whose_stream_is_already_closed(monkeypatch, capsys):
    """A test runner closes its captured stderr while the process (and the flusher thread)
    still runs: neither the exit flush nor the thread's flush may write to it (that printed
    "--- Logging error ---" with a traceback)."""
    from automq.broker import logs

    logger, stream, repeat, _ = make_logger()
    failing_call(logger, 1)
    failing_call(logger, 2)  # one repeat pending
    monkeypatch.setattr(logs, "_filters", {repeat})
    monkeypatch.setattr(logging, "raiseExceptions", True)
    stream.close()
    logs._flush_at_exit()
    repeat.flush_expired()  # the flusher thread's call, after its window ended
    assert "Logging error" not in capsys.readouterr().err
    assert not repeat.windows  # the counts were due; with nowhere to write them they are dropped


def test_different_calls_levels_and_info_lines_are_never_merged():
    logger, stream, _, _ = make_logger()
    for partition in range(5):
        logger.info("opened partition %d", partition)  # INFO: every event stays
    logger.warning("disk slow")
    logger.error("disk slow")  # another level
    logger.warning("disk slow")  # same text, another call site: another event
    messages = [(e["level"], e["message"]) for e in lines(stream)]
    assert messages[:5] == [("INFO", f"opened partition {p}") for p in range(5)]
    assert messages[5:] == [("WARNING", "disk slow"), ("ERROR", "disk slow"), ("WARNING", "disk slow")]


def test_a_zero_window_turns_collapsing_off():
    logger, stream, _, _ = make_logger(window_s=0)
    for attempt in range(3):
        failing_call(logger, attempt)
    assert len(lines(stream)) == 3


def test_bad_environment_values_name_the_variable(monkeypatch):
    monkeypatch.setenv(FORMAT_ENV, "yaml")
    with pytest.raises(LogSettingError, match=f"{FORMAT_ENV}='yaml'"):
        configure_logging()
    monkeypatch.setenv(FORMAT_ENV, "json")
    monkeypatch.setenv(REPEAT_WINDOW_ENV, "soon")
    with pytest.raises(LogSettingError, match=REPEAT_WINDOW_ENV):
        configure_logging()


def test_configure_logging_installs_one_json_handler_on_the_root(monkeypatch):
    monkeypatch.setenv(FORMAT_ENV, "JSON")
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        handler = configure_logging(logging.INFO, process="operator")
        assert root.handlers == [handler]
        assert isinstance(handler.formatter, JsonFormatter)
        assert handler.formatter.static == {"process": "operator"}
    finally:
        root.handlers, _ = saved
        root.setLevel(saved[1])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_controller_that_cannot_reach_its_store_logs_json_with_counts(tmp_path: Path):
    """A real controller process: every stderr line is one JSON object, and its retry warnings
    (about ten a second) come out as a first line plus summaries with counts."""
    http_port = _closed_port()
    config = tmp_path / "controller.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node_id": 0,
                "data_dir": str(tmp_path / "data"),
                "object_store_url": f"s3://logs-test?endpoint=http://127.0.0.1:{_closed_port()}&region=us-east-1",
                "controller_urls": [f"http://127.0.0.1:{http_port}"],
                "listeners": [],
                "http_host": "127.0.0.1",
                "http_port": http_port,
            }
        )
    )
    env = {
        **os.environ,
        FORMAT_ENV: "json",
        REPEAT_WINDOW_ENV: "5",  # the controller retries about once a second here (busy machine)
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "automq.broker.cli", "controller", "--config", str(config)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    seen: list[dict] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(json.loads(line))  # fails on any line that is not one JSON object
            if any(entry.get("repeated", 0) >= 2 for entry in seen):
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, rest = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, rest = proc.communicate()
    seen += [json.loads(line) for line in rest.splitlines() if line.strip()]
    assert all(set(entry) >= FIELDS for entry in seen), seen[:3]
    assert {entry["process"] for entry in seen} == {"controller"} and {e["node_id"] for e in seen} == {0}
    summaries = [entry for entry in seen if "repeated" in entry]
    assert summaries, f"no collapsed repeats in {len(seen)} lines: {[e['message'] for e in seen][:10]}"
    warning = summaries[0]["message"].split(" [repeated")[0]
    emitted = [entry for entry in seen if entry["message"].split(" [repeated")[0] == warning]
    attempts = len([e for e in emitted if "repeated" not in e]) + sum(e["repeated"] for e in emitted if "repeated" in e)
    assert summaries[0]["level"] in {"WARNING", "ERROR"}
    assert len(emitted) < attempts, "repeats were written line by line"


def test_a_cluster_spec_switches_its_nodes_to_json_logs():
    """On Kubernetes, `spec.config` of an AutoMQCluster reaches every node's config file."""
    from automq.operator import builders
    from automq.operator.builders import ClusterRef
    from automq.operator.spec import InvalidSpec, parse_spec

    ref = ClusterRef(name="demo", namespace="streaming", uid="0b7d7c1e-1111-4c4c-8888-000000000001")
    spec = parse_spec({"objectStore": {"bucket": "automq-data"}, "config": {"log_format": "json"}})
    assert builders.node_config(spec, ref, "controller").log_format == "json"
    assert builders.node_config(spec, ref, "broker").log_format == "json"
    default = parse_spec({"objectStore": {"bucket": "automq-data"}})
    assert builders.node_config(default, ref, "broker").log_format is None  # AUTOMQ_LOG_FORMAT, else text
    with pytest.raises(InvalidSpec, match="log_format"):
        parse_spec({"objectStore": {"bucket": "automq-data"}, "config": {"log_format": "yaml"}})
