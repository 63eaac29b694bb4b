"""Pure parts of reconcile: reading pod state, conditions."""

from __future__ import annotations

from automq.operator.reconcile import _condition, is_ready, ordinal, pod_hash, stuck_reason


def pod(name: str = "demo-broker-2", **status: object) -> dict:
    return {"metadata": {"name": name, "annotations": {"automq.io/template-hash": "abc"}}, "status": status}


def test_ready_and_ordinal() -> None:
    assert is_ready(pod(conditions=[{"type": "Ready", "status": "True"}]))
    assert not is_ready(pod(conditions=[{"type": "Ready", "status": "False"}]))
    assert not is_ready(pod())  # no status yet
    terminating = pod(conditions=[{"type": "Ready", "status": "True"}])
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not is_ready(terminating)
    assert ordinal(pod("demo-broker-12")) == 12
    assert pod_hash(pod()) == "abc" and pod_hash({"metadata": {"name": "x"}}) is None


def test_crash_loop_is_stuck_and_names_the_container() -> None:
    note = stuck_reason(
        pod(
            containerStatuses=[
                {
                    "name": "broker",
                    "restartCount": 7,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m"}},
                }
            ]
        )
    )
    assert note is not None and note.reason == "CrashLoopBackOff"
    assert note.message == "pod demo-broker-2 container broker: CrashLoopBackOff (restarts: 7): back-off 5m"


def test_init_container_image_pull_is_stuck() -> None:
    note = stuck_reason(
        pod(initContainerStatuses=[{"name": "node-config", "state": {"waiting": {"reason": "ImagePullBackOff"}}}])
    )
    assert note is not None and note.reason == "ImagePullBackOff" and "node-config" in note.message


def test_unschedulable_is_stuck() -> None:
    note = stuck_reason(
        pod(
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                }
            ]
        )
    )
    assert note is not None and note.reason == "Unschedulable"
    assert note.message == "pod demo-broker-2 cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu."


def test_starting_pods_are_not_stuck() -> None:
    assert (
        stuck_reason(pod(containerStatuses=[{"name": "broker", "state": {"waiting": {"reason": "ContainerCreating"}}}]))
        is None
    )
    assert (
        stuck_reason(pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}])) is None
    )
    assert stuck_reason(pod()) is None


def test_condition_keeps_its_transition_time_while_unchanged() -> None:
    previous = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    same = _condition(previous, "Ready", True, "Ready", "fine", 3, "2026-06-01T00:00:00Z")
    assert same.last_transition_time == "2026-01-01T00:00:00Z" and same.observed_generation == 3
    flipped = _condition(previous, "Ready", False, "RollingUpdate", "restarting", 4, "2026-06-01T00:00:00Z")
    assert flipped.last_transition_time == "2026-06-01T00:00:00Z" and flipped.status == "False"
