"""The operator's permissions: narrow, and covering what node loss needs."""

from __future__ import annotations

from automq.operator.rbac import OPERATOR_RULES, SPARK_DRIVER_RULES


def _grants(rules: list | None = None) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in OPERATOR_RULES if rules is None else rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_no_wildcards_and_no_put() -> None:
    for rule in OPERATOR_RULES:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
    # Only Leases are updated (the controllers' election, which the operator must hold to grant).
    updated = {key for key, verbs in _grants().items() if "update" in verbs}
    assert updated == {("coordination.k8s.io", "leases")}


def test_node_loss_permissions() -> None:
    grants = _grants()
    assert {"get", "list", "watch", "patch"} <= grants[("", "nodes")]
    assert grants[("storage.k8s.io", "volumeattachments")] == {"get", "list", "delete"}
    assert "delete" in grants[("", "pods")]
    assert {"create", "get", "list", "delete"} <= grants[("batch", "jobs")]


def test_owned_objects_are_never_deleted_by_the_operator() -> None:
    # what it holds only to grant it to Spark drivers (executor pods) is not its own use
    own = [r for r in OPERATOR_RULES if r not in SPARK_DRIVER_RULES]
    grants = _grants(own)
    for key in [("", "configmaps"), ("apps", "statefulsets"), ("policy", "poddisruptionbudgets")]:
        assert grants[key] == {"get", "create", "patch"}, key
    # The exception: a scaled-away broker's own Service of an external listener (a cloud load
    # balancer costs money) is listed and deleted; the reconcile deletes only Services carrying
    # the automq.io/listener label (tests/operator/test_security.py).
    assert grants[("", "services")] == {"get", "list", "create", "patch", "delete"}


def test_the_operator_holds_what_it_grants_spark_drivers() -> None:
    grants = _grants()
    for key, verbs in _grants(SPARK_DRIVER_RULES).items():
        assert verbs <= grants[key], key
