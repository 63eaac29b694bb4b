"""The Kubernetes permissions the operator and the clusters it runs need, as PolicyRules.

`OPERATOR_RULES` is what the operator's own ServiceAccount must be granted (the chart's
ClusterRole/Role is rendered from exactly this list; a packaging test compares them).
`CLUSTER_RULES` is what each AutoMQCluster's pods get through the Role the operator creates:
the controllers elect the active one with a coordination Lease and need nothing else.

Kubernetes forbids granting permissions one does not hold (RBAC escalation prevention), so
OPERATOR_RULES includes CLUSTER_RULES' verbs on Leases.
"""

from __future__ import annotations

from typing import Any

from automq.operator.spec import GROUP, PLURAL

CLUSTER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "watch", "create", "update", "patch"],
    },
]

OPERATOR_RULES: list[dict[str, Any]] = [
    # The custom resource: watch it, add/remove kopf's finalizer and progress annotations.
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch", "update"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch", "update"]},
    # kopf rescans resources when CRDs appear and, for namespace patterns, follows namespaces.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    # What a person should see: kopf posts core/v1 Events.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    # Objects the operator owns (idempotent apply = get, then create or merge-patch).
    {
        "apiGroups": [""],
        "resources": ["configmaps", "services", "serviceaccounts"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["apps"],
        "resources": ["statefulsets"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    # Rolling restarts delete pods one at a time; status reads their readiness and crash loops.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    # deletionPolicy: Delete removes the WAL volume claims; scale-in keeps them otherwise.
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "delete"]},
    *CLUSTER_RULES,
]
