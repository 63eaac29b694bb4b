"""The operator's permissions: narrow, and covering what node loss needs."""

from __future__ import annotations

from automq.operator.rbac import OPERATOR_RULES


def _grants() -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in OPERATOR_RULES:
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
    grants = _grants()
    for key in [("", "configmaps"), ("apps", "statefulsets"), ("policy", "poddisruptionbudgets")]:
        assert grants[key] == {"get", "create", "patch"}, key
    # The exception: a scaled-away broker's own Service of an external listener (a cloud load
    # balancer costs money) is listed and deleted; the reconcile deletes only Services carrying
    # the automq.io/listener label (tests/operator/test_security.py).
    assert grants[("", "services")] == {"get", "list", "create", "patch", "delete"}
