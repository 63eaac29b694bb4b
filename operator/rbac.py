"""The Kubernetes permissions the operator and the clusters it runs need, as PolicyRules.

`OPERATOR_RULES` is what the operator's own ServiceAccount must be granted (the chart's
ClusterRole/Role is rendered from exactly this list; a packaging test compares them).
`CLUSTER_RULES` is what each AutoMQCluster's pods get through the Role the operator creates:
the controllers elect the active one with a coordination Lease and need nothing else.

Kubernetes forbids granting permissions one does not hold (RBAC escalation prevention), so
OPERATOR_RULES includes CLUSTER_RULES' verbs on Leases and SPARK_DRIVER_RULES (what the Spark
jobs' drivers get when they run executor pods).
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

# A Spark job with executor pods (spec.<job>.executors > 0): its driver, in the CronJob's pod,
# creates, watches and deletes the executor pods and the ConfigMap of their Spark conf (Spark on
# Kubernetes; the deletes at shutdown are by label selector: deletecollection). Granted by a Role
# bound to the jobs' ServiceAccount only while some job has executors.
SPARK_DRIVER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete", "deletecollection"],
    },
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"],
    },
]

# In the operator's own namespace: replicas elect the active one with the Lease
# `automq-operator` (automq.operator.leadership). Cluster-wide, OPERATOR_RULES covers it; with
# watched namespaces the chart grants it by a Role in the release namespace.
LEADER_ELECTION_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "patch"]},
]

OPERATOR_RULES: list[dict[str, Any]] = [
    # The custom resource: watch it, add/remove kopf's finalizer and progress annotations
    # (kopf and the reconciler only ever PATCH, never PUT).
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]},
    # AutoMQUser: the operator keeps each user's ACLs and quotas in its cluster (kopf patches
    # finalizers and status; nothing is created or deleted from here).
    {"apiGroups": [GROUP], "resources": ["automqusers"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": ["automqusers/status"], "verbs": ["patch"]},
    # An AutoMQUser with SCRAM authentication gets a Secret (owned by it, so deleted with it)
    # holding its generated password: read back on every pass, created once, patched when the
    # cluster's bootstrap address or the mechanism changes.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]},
    # kopf rescans resources when CRDs appear and, for namespace patterns, follows namespaces.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    # What a person should see: kopf posts core/v1 Events.
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # Objects the operator owns: idempotent apply is get, then create or merge-patch; they go
    # with the AutoMQCluster through owner references (garbage collection), never deleted here.
    {
        "apiGroups": [""],
        "resources": ["configmaps", "serviceaccounts"],
        "verbs": ["get", "create", "patch"],
    },
    # Services: also list and delete, for the per-broker Services of external listeners
    # (nodeport/loadbalancer) of brokers scaled away or listeners removed.
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "create", "patch", "delete"]},
    # spec.security: NetworkPolicies (deleted when disabled), and cert-manager's Issuers and
    # Certificates when certificates.issuer is cert-manager (the CAs, broker certificates and
    # controller token of the operator's own CA are Secrets, covered above).
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "patch", "delete"],
    },
    {"apiGroups": ["cert-manager.io"], "resources": ["issuers", "certificates"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "create", "patch"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["get", "create", "patch"],
    },
    # Rolling restarts delete pods one at a time; status reads their readiness and crash loops;
    # node loss watches broker pods and force-deletes (grace 0) the one stuck on a lost node.
    # A bound broker pod gets its node's zone label (patch) when Kubernetes did not copy it.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "delete"]},
    # deletionPolicy: Delete removes the WAL volume claims; node loss reads the lost broker's.
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "delete"]},
    # Node loss: notice NotReady nodes, taint a lost one node.kubernetes.io/out-of-service
    # (forceDetach), or release its volume by deleting the VolumeAttachment.
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"], "verbs": ["get", "list", "delete"]},
    # Node loss with multiAttach: the WAL-recovery Job that replays the lost broker's volume.
    # Spark jobs: their status reads the Jobs (list) of the CronJobs it owns.
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "create", "delete"]},
    # The Spark jobs' CronJobs: applied like every owned object; deleted when a job is disabled.
    {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["get", "create", "patch", "delete"]},
    # The autoscaler stands down while an HPA (KEDA makes one too) targets the same cluster.
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["list"]},
    *CLUSTER_RULES,
    # Held only so that it may grant them to Spark drivers (escalation prevention); the
    # operator itself never creates pods or deletes ConfigMaps.
    *SPARK_DRIVER_RULES,
]
