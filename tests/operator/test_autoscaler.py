"""The autoscaler's pure decision on synthetic load series: no clock, no I/O."""

from __future__ import annotations

import itertools
import random

from automq.operator.autoscaler import Observation, decide, recommend, trim
from automq.operator.spec import AutoscalingSpec


def policy(**kw: object) -> AutoscalingSpec:
    base = {"enabled": True, "minReplicas": 1, "maxReplicas": 10, "targetBytesInMiBPerSecond": 10.0}
    return AutoscalingSpec.model_validate({**base, **kw})


def run(p: AutoscalingSpec, load: list[float], *, start: int, step_s: float = 15.0, cpu: list[float] | None = None):
    """Feed one observation per step; apply every decision; return the replica count after each."""
    history: list[Observation] = []
    replicas, last_scale, counts, reasons = start, None, [], []
    for i, mib in enumerate(load):
        now = i * step_s
        history.append(Observation(now, mib, None if cpu is None else cpu[i], replicas))
        trim(history, p, now)
        d = decide(p, history, replicas, now, last_scale_at=last_scale)
        if d.replicas != replicas:
            replicas, last_scale = d.replicas, now
        counts.append(replicas)
        reasons.append(d.reason)
    return counts, reasons


def test_recommendation_is_total_over_target_not_plus_one() -> None:
    p = policy()
    assert recommend(p, Observation(0, 35.0, None, 1), current=1)[0] == 4
    assert recommend(p, Observation(0, 0.0, None, 4), current=4)[0] == 1  # never below one broker
    assert recommend(p, Observation(0, 500.0, None, 1), current=1)[0] == 10  # clamped to max
    _, why = recommend(p, Observation(0, 500.0, None, 1), current=1)
    assert "clamped to [1, 10]" in why and "50.00 brokers" in why


def test_tolerance_band_keeps_the_current_size() -> None:
    p = policy(tolerancePercent=10)
    assert recommend(p, Observation(0, 31.0, None, 3), current=3)[0] == 3  # 10.3/broker: within 10%
    assert recommend(p, Observation(0, 34.0, None, 3), current=3)[0] == 4  # 11.3/broker: out
    assert recommend(p, Observation(0, 20.0, None, 3), current=3)[0] == 2


def test_largest_of_bytes_and_cpu_wins() -> None:
    p = policy(targetCpuPercent=50)
    # 12 MiB/s needs 2 brokers; 3 brokers at 80% CPU = 240% needs 5 at 50%.
    count, why = recommend(p, Observation(0, 12.0, 80.0, 3), current=3)
    assert count == 5 and why.startswith("cpu")
    cpu_only = AutoscalingSpec(enabled=True, target_cpu_percent=60, max_replicas=10)
    assert recommend(cpu_only, Observation(0, None, 90.0, 2), current=2)[0] == 3


def test_ramp_scales_up_at_once_to_what_the_load_needs() -> None:
    counts, reasons = run(policy(cooldownSeconds=0), [5, 5, 28, 28, 28], start=1)
    assert counts == [1, 1, 3, 3, 3]  # 1 -> 3 in one decision, not +1 per cycle
    assert "scale up 1 -> 3" in reasons[2]


def test_max_step_limits_one_decision() -> None:
    counts, reasons = run(policy(maxStep=2, cooldownSeconds=0), [95, 95, 95, 95], start=1)
    assert counts == [3, 5, 7, 9]
    assert "limited to +2" in reasons[0]


def test_scale_down_waits_for_the_whole_window_then_drops_to_the_window_max() -> None:
    p = policy(scaleDownStabilizationSeconds=300, cooldownSeconds=0)
    load = [28.0] * 4 + [8.0] * 30  # 15 s steps: low from t=60 s on
    counts, reasons = run(p, load, start=3)
    first_down = counts.index(1)
    # The window covers [now-300, now] and must hold only low recommendations: t >= 60 + 300.
    assert first_down * 15 >= 360, counts
    assert counts[:first_down] == [3] * first_down
    assert any("load was higher within the last 300s" in r for r in reasons[:first_down])


def test_scale_down_needs_history_covering_the_window() -> None:
    p = policy(scaleDownStabilizationSeconds=300)
    history = [Observation(0, 1.0, None, 3), Observation(100, 1.0, None, 3)]
    d = decide(p, history, 3, 100)
    assert d.replicas == 3 and "only 100s of the 300s" in d.reason


def test_no_flapping_under_steady_load_with_noise() -> None:
    rng = random.Random(7)
    p = policy(scaleDownStabilizationSeconds=300, cooldownSeconds=60, tolerancePercent=10)
    # Around 2.5 brokers' worth of load (25 MiB/s at 10 MiB/s per broker), +/-15 % noise.
    load = [25.0 * (1 + rng.uniform(-0.15, 0.15)) for _ in range(400)]
    counts, _ = run(p, load, start=1)
    changes = sum(1 for a, b in itertools.pairwise(counts) if a != b)
    assert counts[-1] == 3
    assert changes <= 1, counts  # one scale-up, then steady for 100 minutes


def test_noise_around_an_exact_multiple_does_not_flap() -> None:
    rng = random.Random(11)
    p = policy(scaleDownStabilizationSeconds=300, cooldownSeconds=60)
    load = [30.0 + rng.uniform(-2.5, 2.5) for _ in range(400)]  # 3 brokers' worth, +/-8 %
    counts, _ = run(p, load, start=3)
    assert set(counts) == {3}


def test_cooldown_holds_after_a_change() -> None:
    p = policy(cooldownSeconds=120)
    history = [Observation(0, 80.0, None, 2)]
    d = decide(p, history, 2, 60, last_scale_at=0)
    assert d.replicas == 2 and d.recommendation == 8 and "cooldown" in d.reason
    assert decide(p, history, 2, 121, last_scale_at=0).replicas == 6  # 2 + maxStep 4


def test_scale_down_is_blocked_while_something_is_in_flight_but_scale_up_is_not() -> None:
    p = policy(scaleDownStabilizationSeconds=0)
    low = [Observation(0, 5.0, None, 3)]
    d = decide(p, low, 3, 0, blocked="2 partition moves are in flight")
    assert d.replicas == 3 and "not while 2 partition moves are in flight" in d.reason
    assert decide(p, low, 3, 0).replicas == 1
    high = [Observation(0, 50.0, None, 3)]
    assert decide(p, high, 3, 0, blocked="broker 2 is not Ready").replicas == 5


def test_replicas_outside_the_bounds_are_corrected_at_once() -> None:
    p = policy(minReplicas=2, maxReplicas=4)
    assert decide(p, [], 1, 0).replicas == 2
    assert decide(p, [], 7, 0).replicas == 4
    assert decide(p, [], 7, 0, blocked="moves in flight").replicas == 7


def test_trim_keeps_one_observation_older_than_the_window() -> None:
    p = policy(scaleDownStabilizationSeconds=60)
    history = [Observation(t, 1.0, None, 1) for t in range(0, 200, 10)]
    trim(history, p, 200)
    assert history[0].at < 140 <= history[1].at  # 130 kept: it proves the window is covered
