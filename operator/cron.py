"""Cron schedules as Kubernetes CronJobs accept them: five fields or an @macro.

The CRD carries `SCHEDULE_PATTERN` (the grammar with each field's numeric range, so the API
server refuses `61 * * * *` at `kubectl apply`); `check_schedule` is the same check with a
message naming the field, run by the operator's spec model, plus what a regular expression
cannot say (a range's start after its end, a zero step). Time zones go in the CronJob's
`timeZone`, never as a `CRON_TZ=`/`TZ=` prefix, which Kubernetes refuses.
"""

from __future__ import annotations

import re

MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")

# (name, lowest, highest, names): day of week 7 is Sunday too, as in Kubernetes' parser.
FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 7, DAYS),
)

_NUMBER = {
    "minute": "[1-5]?[0-9]",
    "hour": "(1?[0-9]|2[0-3])",
    "day of month": "([1-9]|[12][0-9]|3[01])",
    "month": "([1-9]|1[0-2])",
    "day of week": "[0-7]",
}


def _field_pattern(name: str, names: tuple[str, ...]) -> str:
    value = _NUMBER[name] if not names else f"({_NUMBER[name]}|{'|'.join(names)}|{'|'.join(n.lower() for n in names)})"
    wildcard = r"[*?]" if name in ("day of month", "day of week") else r"\*"
    item = rf"({wildcard}|{value}(-{value})?)(/[0-9]+)?"
    return rf"{item}(,{item})*"


SCHEDULE_PATTERN = (
    "^(" + "|".join(MACROS) + "|" + " +".join(_field_pattern(n, names) for n, _, _, names in FIELDS) + ")$"
)
_SCHEDULE_RE = re.compile(SCHEDULE_PATTERN)


def _value(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.upper() in names:
        index = names.index(text.upper())
        return index + 1 if name == "month" else index
    if not text.isdigit():
        raise ValueError(f"{name} {text!r} is not a number{' or a name like ' + names[0] if names else ''}")
    number = int(text)
    if not low <= number <= high:
        raise ValueError(f"{name} {number} is outside {low}-{high}")
    return number


def check_schedule(schedule: str) -> str:
    """The schedule unchanged, or ValueError saying which field is wrong and why."""
    text = schedule.strip()
    if text != schedule or not text:
        raise ValueError(f"schedule {schedule!r}: no leading or trailing spaces, not empty")
    if text.upper().startswith(("CRON_TZ=", "TZ=")):
        raise ValueError(
            f"schedule {schedule!r}: put the time zone in timeZone (e.g. Europe/Berlin), not in the schedule"
        )
    if text.startswith("@"):
        if text not in MACROS:
            raise ValueError(f"schedule {schedule!r}: unknown macro, use one of {', '.join(MACROS)}")
        return schedule
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"schedule {schedule!r}: expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
        )
    try:
        _check_fields(parts)
    except ValueError as exc:
        raise ValueError(f"schedule {schedule!r}: {exc}") from None
    if not _SCHEDULE_RE.match(text):  # the CRD's pattern must accept what passed the checks above
        raise ValueError(f"schedule {schedule!r} is not a cron schedule")
    return schedule


def _check_fields(parts: list[str]) -> None:
    for part, (name, low, high, names) in zip(parts, FIELDS, strict=True):
        for item in part.split(","):
            body, _, step = item.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                raise ValueError(f"{name} step {step!r} must be a positive number")
            if body == "*" or (body == "?" and name in ("day of month", "day of week")):
                continue
            start, dash, end = body.partition("-")
            first = _value(start, name, low, high, names)
            if dash and first > _value(end, name, low, high, names):
                raise ValueError(f"{name} range {body} starts after it ends")
