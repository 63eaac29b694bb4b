"""The autoscaler's decision: a pure function from a history of load observations to a broker count.

No I/O and no clock: the caller passes `now` and what it observed, so every rule is unit-tested
on synthetic series (tests/operator/test_autoscaler.py). The rules, HPA-like:

  - one recommendation per observation: for each target given (bytes-in MiB/s per broker, CPU %
    per broker), ceil(total load / target); the largest wins; clamped to [minReplicas,
    maxReplicas]. Within `tolerancePercent` of the target at the current size, the
    recommendation is the current size (noise around the target does not move anything);
  - scale up to the *lowest* recommendation of the scale-up window (default 0 s: the latest),
    scale down to the *highest* of the scale-down window (default 300 s), and only once the
    history covers that whole window: a broker is removed only after load stayed low for it;
  - at most `maxStep` brokers per decision, nothing within `cooldownSeconds` of the last change;
  - scale-down never while something else is in flight (moves, a broker not Ready, a previous
    scale): the caller says what in `blocked`. Scale-up is allowed then: the count it computes
    from total load does not grow with the brokers that are still starting.
  - replicas outside [min, max] (a person edited them) are brought back within at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from automq.operator.spec import AutoscalingSpec


@dataclass(frozen=True, slots=True)
class Observation:
    """Cluster load at one instant, from the same scrape the balancer uses."""

    at: float  # seconds, any monotonic origin (the caller's clock)
    bytes_in_mib_per_s: float | None  # produce traffic summed over brokers
    cpu_percent: float | None  # average broker process CPU, percent of one core
    brokers: int  # brokers the numbers were taken from


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int  # what spec.broker.replicas should be (== current: no change)
    current: int
    recommendation: int  # from the latest observation alone, before windows and steps
    reason: str  # for events and status, with the numbers

    @property
    def change(self) -> int:
        return self.replicas - self.current


def recommend(policy: AutoscalingSpec, obs: Observation, current: int) -> tuple[int, str]:
    """Brokers wanted for one observation, and the arithmetic that says why."""
    wanted: list[tuple[int, str]] = []
    tolerance = policy.tolerance_percent / 100
    metrics: list[tuple[str, float | None, float | None, str]] = [
        ("bytes-in", obs.bytes_in_mib_per_s, policy.target_bytes_in_mib_per_second, "MiB/s"),
        (
            "cpu",
            None if obs.cpu_percent is None else obs.cpu_percent * max(obs.brokers, 1),
            policy.target_cpu_percent,
            "%",
        ),
    ]
    for name, total, target, unit in metrics:
        if target is None or total is None:
            continue
        per_broker = total / current if current > 0 else math.inf
        if current > 0 and abs(per_broker / target - 1) <= tolerance:
            count = current
            why = f"{name} {total:.2f}{unit} = {per_broker:.2f}{unit}/broker, within {policy.tolerance_percent}% of target {target:g}{unit}"
        else:
            # A hair over a multiple of the target is float noise, not a reason for one more broker.
            count = max(1, math.ceil(total / target - 1e-9))
            why = f"{name} {total:.2f}{unit} / target {target:g}{unit} per broker = {total / target:.2f} brokers"
        wanted.append((count, why))
    if not wanted:
        return current, "no load figure for the configured targets"
    count, why = max(wanted, key=lambda w: w[0])
    clamped = min(max(count, policy.min_replicas), policy.max_replicas)
    if clamped != count:
        why += f", clamped to [{policy.min_replicas}, {policy.max_replicas}]"
    return clamped, why


def decide(
    policy: AutoscalingSpec,
    history: Sequence[Observation],
    current: int,
    now: float,
    *,
    last_scale_at: float | None = None,
    blocked: str | None = None,
) -> Decision:
    """The broker count to run now; `history` oldest first, observations of good data only."""
    if current < policy.min_replicas or current > policy.max_replicas:
        target = min(max(current, policy.min_replicas), policy.max_replicas)
        bound = "minReplicas" if current < policy.min_replicas else "maxReplicas"
        if target < current and blocked:
            return Decision(current, current, target, f"above maxReplicas but not scaling down while {blocked}")
        return Decision(target, current, target, f"{current} brokers is outside {bound}; setting {target}")
    if not history:
        return Decision(current, current, current, "no load observed yet")
    latest = history[-1]
    rec, why = recommend(policy, latest, current)
    if last_scale_at is not None and now - last_scale_at < policy.cooldown_seconds:
        left = policy.cooldown_seconds - (now - last_scale_at)
        return Decision(current, current, rec, f"cooldown: {left:.0f}s left after the last change ({why})")

    def window(seconds: float) -> list[int]:
        return [recommend(policy, o, current)[0] for o in history if o.at >= now - seconds]

    up = min(window(policy.scale_up_stabilization_seconds) or [rec])
    if up > current:
        target = min(up, current + policy.max_step)
        step = f", limited to +{policy.max_step} per decision" if target < up else ""
        return Decision(target, current, rec, f"scale up {current} -> {target}: {why}{step}")
    down_window = policy.scale_down_stabilization_seconds
    recent = window(down_window)
    down = max(recent or [rec])
    if down < current:
        covered = now - history[0].at
        if covered < down_window:
            return Decision(
                current,
                current,
                rec,
                f"load is low ({why}) but only {covered:.0f}s of the {down_window}s scale-down window observed",
            )
        if blocked:
            return Decision(current, current, rec, f"would scale down to {down} ({why}) but not while {blocked}")
        target = max(down, current - policy.max_step)
        step = f", limited to -{policy.max_step} per decision" if target > down else ""
        return Decision(target, current, rec, f"scale down {current} -> {target}: low for {down_window}s ({why}){step}")
    if rec < current:
        return Decision(current, current, rec, f"holding {current}: load was higher within the last {down_window}s")
    return Decision(current, current, rec, f"holding {current}: {why}")


def trim(history: list[Observation], policy: AutoscalingSpec, now: float) -> None:
    """Drop observations older than any window needs (keep one older, it proves coverage)."""
    keep = max(policy.scale_up_stabilization_seconds, policy.scale_down_stabilization_seconds)
    while len(history) > 1 and history[1].at < now - keep:
        del history[0]
