"""How every automq process logs: text or JSON lines, and repeated warnings collapsed.

`configure_logging` is called once at the start of each process (broker, controller, operator,
`local up`, Spark jobs, `wal recover`). Two behaviours:

- **Format.** `text` (the default: `time LEVEL logger: message`) or `json`: one JSON object per
  line on stderr with the fields a log pipeline (Loki, Elasticsearch, Cloud Logging) indexes:
  `time` (RFC 3339, UTC, milliseconds), `level`, `logger`, `message`, `process` (role:
  broker/controller/operator/...), `node_id` when the process has one, `pid`, and `exception`
  (the formatted traceback) when there is one. `AUTOMQ_LOG_FORMAT=json` switches every process,
  including the ones `local up` starts; a node config's `log_format` does the same for one node.
- **Repeats.** A WARNING or worse from the same logging call (logger, level, message template)
  is written once per window (`AUTOMQ_LOG_REPEAT_WINDOW_S`, default 10 s, 0 turns this off);
  the repeats inside the window are counted, and when the window ends one line (the last
  repeat's message with `[repeated N more times in 10s; last one shown]`, and `repeated: N` in
  JSON) says how many there were. Windows end on the next log record, on a daemon thread's
  check every second, and at exit. A controller that cannot reach its object
  store then logs one line per 10 s with a count instead of ten identical lines a second.
  INFO and DEBUG are never collapsed: per-partition start-up lines are different events.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMAT_ENV = "AUTOMQ_LOG_FORMAT"
REPEAT_WINDOW_ENV = "AUTOMQ_LOG_REPEAT_WINDOW_S"
DEFAULT_REPEAT_WINDOW_S = 10.0


class LogSettingError(ValueError):
    """An environment variable of this module holds a value it cannot use."""


def log_format_from_env(default: LogFormat = "text") -> LogFormat:
    value = os.environ.get(FORMAT_ENV, "").strip().lower()
    if not value:
        return default
    if value not in ("text", "json"):
        raise LogSettingError(f"{FORMAT_ENV}={value!r}: use 'text' or 'json'")
    return "json" if value == "json" else "text"


def repeat_window_from_env() -> float:
    value = os.environ.get(REPEAT_WINDOW_ENV, "").strip()
    if not value:
        return DEFAULT_REPEAT_WINDOW_S
    try:
        window = float(value)
    except ValueError:
        raise LogSettingError(f"{REPEAT_WINDOW_ENV}={value!r}: a number of seconds (0 turns it off)") from None
    if window < 0:
        raise LogSettingError(f"{REPEAT_WINDOW_ENV}={value!r}: must not be negative")
    return window


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages and tracebacks escaped)."""

    def __init__(self, process: str | None = None, node_id: int | None = None) -> None:
        super().__init__()
        self.static: dict[str, Any] = {}
        if process is not None:
            self.static["process"] = process
        if node_id is not None:
            self.static["node_id"] = node_id

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, Any] = {
            "time": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.static,
            "pid": record.process,
        }
        repeated = getattr(record, "repeated", None)
        if repeated is not None:
            entry["repeated"] = repeated
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


@dataclass
class _Window:
    opened: float
    suppressed: int = 0
    last: logging.LogRecord | None = None


class RepeatFilter(logging.Filter):
    """Collapses repeats of one logging call (WARNING and worse) into one line per window.

    Attached to a handler, it lets the first record of a call through, counts the repeats that
    arrive within `window_s`, and emits one summary record (the last repeat's message, with
    `repeated=N`) once the window is over. `clock` is injectable so tests need no sleeps."""

    def __init__(
        self,
        window_s: float = DEFAULT_REPEAT_WINDOW_S,
        min_level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.window_s = window_s
        self.min_level = min_level
        self.clock = clock
        self.windows: dict[tuple[str, int, str, str, int], _Window] = {}
        self.lock = threading.Lock()
        self.handler: logging.Handler | None = None

    @staticmethod
    def _key(record: logging.LogRecord) -> tuple[str, int, str, str, int]:
        return (record.name, record.levelno, str(record.msg), record.pathname, record.lineno)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level or self.window_s <= 0 or getattr(record, "repeated", None) is not None:
            return True
        now = self.clock()
        key = self._key(record)
        with self.lock:
            # An ended window's summary (this call's too) goes out before this record.
            due = self._take_expired(now)
            window = self.windows.get(key)
            if window is not None:
                window.suppressed += 1
                window.last = record
                passed = False
            else:
                self.windows[key] = _Window(opened=now)
                passed = True
        self._emit(due)
        return passed

    def flush_expired(self) -> None:
        """Emit the summary of every window that has ended with repeats in it."""
        with self.lock:
            due = self._take_expired(self.clock())
        self._emit(due)

    def flush_all(self) -> None:
        """At exit: the pending counts, whether or not their window has ended."""
        with self.lock:
            due = self._take_expired(float("inf"))
        self._emit(due)

    def _take_expired(self, now: float) -> list[logging.LogRecord]:
        due: list[logging.LogRecord] = []
        for key, window in list(self.windows.items()):
            if now - window.opened < self.window_s:
                continue
            del self.windows[key]
            if window.suppressed and window.last is not None:
                due.append(self._summary(window, now))
        return due

    def _summary(self, window: _Window, now: float) -> logging.LogRecord:
        last = window.last
        assert last is not None
        elapsed = min(now, window.opened + self.window_s) - window.opened
        summary = logging.makeLogRecord(last.__dict__)
        summary.msg = f"{last.getMessage()} [repeated {window.suppressed} more times in {elapsed:.0f}s; last one shown]"
        summary.args = None
        summary.repeated = window.suppressed
        summary.exc_info = None  # the first line of the window carried the traceback
        summary.exc_text = None
        return summary

    def _emit(self, records: list[logging.LogRecord]) -> None:
        if self.handler is None or getattr(getattr(self.handler, "stream", None), "closed", False):
            # nowhere to write: e.g. a test runner's captured stderr, closed while this process
            # (or the flusher thread) still runs; writing printed "--- Logging error ---"
            return
        for record in records:
            self.handler.handle(record)


_flusher_started = False
_filters: weakref.WeakSet[RepeatFilter] = weakref.WeakSet()


def _flush_loop() -> None:
    while True:
        time.sleep(1.0)
        for repeat_filter in list(_filters):
            repeat_filter.flush_expired()


def _flush_at_exit() -> None:
    for repeat_filter in list(_filters):
        repeat_filter.flush_all()


def configure_logging(
    level: int | str = logging.INFO,
    *,
    process: str | None = None,
    node_id: int | None = None,
    log_format: LogFormat | None = None,
) -> logging.Handler:
    """Replace the root logger's handlers with one stderr handler in the chosen format.

    `log_format=None` reads AUTOMQ_LOG_FORMAT (default text); a bad value of either variable
    raises LogSettingError naming it. Returns the handler (tests attach to it)."""
    global _flusher_started
    chosen = log_format or log_format_from_env()
    window = repeat_window_from_env()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(process, node_id) if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    repeat_filter = RepeatFilter(window_s=window)
    repeat_filter.handler = handler
    handler.addFilter(repeat_filter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    if window > 0:
        _filters.add(repeat_filter)
        if not _flusher_started:
            _flusher_started = True
            threading.Thread(target=_flush_loop, name="log-repeat-flush", daemon=True).start()
            atexit.register(_flush_at_exit)
    return handler
