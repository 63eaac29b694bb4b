"""The Spark jobs of one AutoMQCluster as CronJobs: pure builders and the status they report.

Per enabled job (`spec.compaction`, its `keys`, `spec.lakeIngestion`) one CronJob, for a
cluster `demo`:
    demo-compact        automq spark compact          (object compaction)
    demo-keycompact     automq spark compact --keys   (cleanup.policy=compact topics)
    demo-ingest         automq spark ingest           (topics -> Iceberg)
    demo-spark          ServiceAccount of their pods (and Role + RoleBinding, see below)
    demo-spark-executors  ConfigMap: the executor pod template of each job with executors

Each run is spark-submit in client mode with the driver in the Job's pod, through the spark
image's entrypoint (`spark-entrypoint.sh driver ...`), on `SPARK_JOB_FILE` (spark-submit needs a
Python file, not a module). The pod talks to the controllers over HTTP and to the object store
with the brokers' credentials (the same Secret).

Executors: `executors: 0` (default) runs them as threads of the driver's pod (`local[cores]`);
that pod never calls the Kubernetes API, mounts no token, and the Role `demo-spark` grants
nothing. `executors: N` is Spark on Kubernetes in client mode: the driver asks the API server
(in-cluster token of `demo-spark`, which the Role then lets create/watch/delete pods and
ConfigMaps in the namespace) for N executor pods of the same image, built from a pod template
(`demo-spark-executors`: non-root, read-only root filesystem, the object-store credentials,
the job's scheduling, no token); they connect back to the driver at its pod IP on fixed ports
(DRIVER_PORT, BLOCK_MANAGER_PORT) and are owned by the driver's pod, so they go with it.

`concurrencyPolicy: Forbid`: two runs of one job never overlap (a racing pair is safe, the
controller or the Iceberg commit refuses the loser, but it is wasted work).

Status: `job_status` turns the CronJob and its Jobs into `status.sparkJobs.<job>`: last run,
last success (the CronJob's `lastSuccessfulTime`, or the newest Complete Job), and the newest
Failed Job with its reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from automq.operator.builders import (
    USER_ID,
    ClusterRef,
    _credentials_env,
    _metadata,
    _scheduling,
    common_labels,
    controller_client_env,
    controller_client_mounts,
    controller_client_volumes,
    controller_urls,
)
from automq.operator.rbac import SPARK_DRIVER_RULES
from automq.operator.spec import (
    DEFAULT_SPARK_IMAGE,
    GROUP,
    AutoMQClusterSpec,
    CompactionSpec,
    LakeIngestionSpec,
    Resources,
    SparkJobSpec,
    SparkJobStatus,
)

JobName = Literal["compaction", "keyCompaction", "lakeIngestion"]
JOBS: tuple[JobName, ...] = ("compaction", "keyCompaction", "lakeIngestion")
JOB_LABEL = f"{GROUP}/spark-job"  # on CronJobs, their Jobs and pods: which job this is

# Paths inside the spark image (Dockerfile `spark` target): tini and the entrypoint, and the
# file spark-submit runs (a link the Dockerfile makes to automq/spark/submit.py wherever pip
# installed it).
ENTRYPOINT = ["/usr/bin/tini", "--", "/usr/local/bin/spark-entrypoint.sh"]
SPARK_JOB_FILE = "/opt/automq/spark-job.py"
SCRATCH_DIR = "/tmp"  # Spark's local dir and HOME: the root filesystem is read-only
CATALOG_ENV = "AUTOMQ_SPARK_CATALOG"  # read by `automq spark ingest --catalog`
# pyiceberg's environment configuration of the job's catalog (named `automq`): a REST token
CATALOG_TOKEN_ENV = "PYICEBERG_CATALOG__AUTOMQ__TOKEN"

# Spark on Kubernetes (executors > 0): the API server as seen from a pod, the in-cluster
# credentials, the driver's fixed ports (executors connect back to them) and where the
# executor pod templates are mounted in the driver's pod.
K8S_MASTER = "k8s://https://kubernetes.default.svc:443"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
EXECUTOR_TEMPLATE_DIR = "/opt/automq/executor-templates"
EXECUTOR_CONTAINER = "spark-executor"

DEFAULT_JOB_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
_SUFFIX: dict[JobName, str] = {"compaction": "compact", "keyCompaction": "keycompact", "lakeIngestion": "ingest"}


def cron_job_name(ref: ClusterRef, job: JobName) -> str:
    # CronJob names are at most 52 characters (Job names add 11); cluster names at most 40.
    return f"{ref.name}-{_SUFFIX[job]}"


def service_account_name(ref: ClusterRef) -> str:
    return f"{ref.name}-spark"


def executor_templates_name(ref: ClusterRef) -> str:
    return f"{ref.name}-spark-executors"


def job_labels(ref: ClusterRef, job: JobName) -> dict[str, str]:
    return {**common_labels(ref), "app.kubernetes.io/component": "spark-job", JOB_LABEL: job}


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job's settings: its section of the spec, its schedule and the CLI arguments."""

    name: JobName
    section: SparkJobSpec
    schedule: str
    args: list[str]
    env: list[dict[str, Any]]


def enabled_jobs(spec: AutoMQClusterSpec, ref: ClusterRef) -> list[JobPlan]:
    """The jobs the spec turns on, each with what `automq spark ...` gets."""
    location = ["--controller", ",".join(controller_urls(spec, ref)), "--object-store", spec.object_store.url()]
    plans: list[JobPlan] = []
    compaction = spec.compaction
    if compaction.enabled:
        plans.append(
            JobPlan(
                "compaction", compaction, compaction.schedule, ["compact", *location, *_compact_args(compaction)], []
            )
        )
        if compaction.keys.enabled:
            plans.append(
                JobPlan(
                    "keyCompaction",
                    compaction,
                    compaction.keys.schedule,
                    ["compact", "--keys", *location, "--min-age", compaction.min_age],
                    [],
                )
            )
    lake = spec.lake_ingestion
    if lake.enabled:
        args, env = _ingest_args(spec, lake)
        plans.append(JobPlan("lakeIngestion", lake, lake.schedule, ["ingest", *location, *args], env))
    return plans


def _compact_args(c: CompactionSpec) -> list[str]:
    return [
        "--min-age",
        c.min_age,
        "--target-size",
        c.target_size,
        "--small-size",
        c.small_size,
        "--force-split-age",
        c.force_split_age,
        "--max-objects",
        str(c.max_objects),
    ]


def _ingest_args(spec: AutoMQClusterSpec, lake: LakeIngestionSpec) -> tuple[list[str], list[dict[str, Any]]]:
    args: list[str] = []
    env: list[dict[str, Any]] = []
    if lake.catalog_uri is not None:
        args += ["--catalog", lake.catalog_uri]
    elif lake.catalog_uri_secret is not None:
        # Kept out of the pod spec (it may carry a password): the CLI reads it from the environment.
        ref = lake.catalog_uri_secret
        env.append({"name": CATALOG_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if lake.catalog_token_secret is not None:
        ref = lake.catalog_token_secret
        env.append({"name": CATALOG_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    store = spec.object_store
    warehouse = lake.warehouse or f"s3://{store.bucket}/warehouse"
    args += ["--warehouse", warehouse]
    if warehouse.startswith("s3://"):
        # pyiceberg's S3 file IO: same endpoint and region as the brokers; keys from the environment.
        if store.endpoint:
            args += ["--catalog-property", f"s3.endpoint={store.endpoint}"]
        args += ["--catalog-property", f"s3.region={store.region}"]
        if store.path_style:
            args += ["--catalog-property", "s3.force-virtual-addressing=false"]
    for topic in lake.topics:
        args += ["--topic", topic]
    if lake.only_listed_topics:
        args.append("--only")
    if lake.expire_snapshots_older_than:
        args += ["--expire-snapshots-older-than", lake.expire_snapshots_older_than]
    if lake.compact_files_below:
        args += ["--compact-files-below", lake.compact_files_below]
    if lake.remove_orphans_older_than:
        args += ["--remove-orphans-older-than", lake.remove_orphans_older_than]
    return args, env


def _resources(resources: Resources) -> dict[str, Any]:
    requests = dict(resources.requests) or dict(DEFAULT_JOB_RESOURCES["requests"])
    limits = dict(resources.limits)
    if not resources.requests and not resources.limits:
        limits = dict(DEFAULT_JOB_RESOURCES["limits"])
    out: dict[str, Any] = {"requests": dict(sorted(requests.items()))}
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def submit_args(plan: JobPlan, ref: ClusterRef, spec: AutoMQClusterSpec | None = None) -> list[str]:
    """The container's args: the entrypoint's `driver` mode (spark-submit, client mode)."""
    section = plan.section
    head = ["driver", "--master", f"local[{section.cores}]"]
    executors: list[str] = []
    if section.executors > 0:
        assert spec is not None, "executor pods need the cluster spec (image, namespace, pull secrets)"
        head = ["driver", "--master", K8S_MASTER]
        confs = {
            "spark.executor.instances": str(section.executors),
            "spark.executor.cores": str(section.executor_cores),
            "spark.executor.memory": section.executor_memory,
            "spark.kubernetes.namespace": ref.namespace,
            "spark.kubernetes.container.image": section.image or DEFAULT_SPARK_IMAGE,
            "spark.kubernetes.container.image.pullPolicy": spec.image_pull_policy,
            "spark.kubernetes.authenticate.caCertFile": f"{SA_DIR}/ca.crt",
            "spark.kubernetes.authenticate.oauthTokenFile": f"{SA_DIR}/token",
            # $(VAR) is expanded by the kubelet from the container's env (downward API)
            "spark.kubernetes.driver.pod.name": "$(POD_NAME)",  # executors are owned by it
            "spark.driver.host": "$(POD_IP)",
            "spark.driver.port": str(DRIVER_PORT),
            "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
            "spark.kubernetes.executor.podTemplateFile": f"{EXECUTOR_TEMPLATE_DIR}/{plan.name}.json",
            "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        }
        if spec.image_pull_secrets:
            confs["spark.kubernetes.container.image.pullSecrets"] = ",".join(spec.image_pull_secrets)
        for key, value in confs.items():
            executors += ["--conf", f"{key}={value}"]
    return [
        *head,
        "--name",
        f"{ref.name}-{_SUFFIX[plan.name]}",
        "--driver-memory",
        section.driver_memory,
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        f"spark.local.dir={SCRATCH_DIR}",
        *executors,
        SPARK_JOB_FILE,
        *plan.args,
    ]


def _pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "runAsGroup": USER_ID,
        "fsGroup": USER_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def executor_pod_template(spec: AutoMQClusterSpec, ref: ClusterRef, plan: JobPlan) -> dict[str, Any]:
    """What Spark starts each executor pod from; Spark adds image, command, resources, its own
    env and labels, and the owner reference to the driver's pod."""
    section = plan.section
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # executors never call the API server
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "containers": [
            {
                "name": EXECUTOR_CONTAINER,
                "env": [{"name": "HOME", "value": SCRATCH_DIR}, *_credentials_env(spec)],
                "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH_DIR}],
                "securityContext": _container_security(),
            }
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        **_scheduling(section.scheduling),
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    labels = {**job_labels(ref, plan.name), "app.kubernetes.io/component": "spark-executor"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": labels}, "spec": pod_spec}


def executor_templates(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any] | None:
    """The ConfigMap of executor pod templates (JSON, which Spark reads as YAML), one key per
    job with executors; None when no job has any."""
    data = {
        f"{plan.name}.json": json.dumps(executor_pod_template(spec, ref, plan), indent=2, sort_keys=True)
        for plan in enabled_jobs(spec, ref)
        if plan.section.executors > 0
    }
    if not data:
        return None
    meta = _metadata(ref, executor_templates_name(ref))
    meta["labels"] = {**common_labels(ref), "app.kubernetes.io/component": "spark-job"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def uses_executor_pods(spec: AutoMQClusterSpec, ref: ClusterRef) -> bool:
    return any(plan.section.executors > 0 for plan in enabled_jobs(spec, ref))


def driver_role(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[str, Any]:
    """What the jobs' ServiceAccount may do: executor pods while some job has them, else nothing."""
    meta = _metadata(ref, service_account_name(ref))
    meta["labels"] = {**common_labels(ref), "app.kubernetes.io/component": "spark-job"}
    rules = [dict(rule) for rule in SPARK_DRIVER_RULES] if uses_executor_pods(spec, ref) else []
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules}


def driver_role_binding(ref: ClusterRef) -> dict[str, Any]:
    meta = _metadata(ref, service_account_name(ref))
    meta["labels"] = {**common_labels(ref), "app.kubernetes.io/component": "spark-job"}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account_name(ref)},
        "subjects": [{"kind": "ServiceAccount", "name": service_account_name(ref), "namespace": ref.namespace}],
    }


def cron_job(spec: AutoMQClusterSpec, ref: ClusterRef, plan: JobPlan) -> dict[str, Any]:
    section = plan.section
    labels = job_labels(ref, plan.name)
    container: dict[str, Any] = {
        "name": "spark",
        "image": section.image or DEFAULT_SPARK_IMAGE,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(ENTRYPOINT),
        "args": submit_args(plan, ref, spec),
        "env": [
            {"name": "HOME", "value": SCRATCH_DIR},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            *_credentials_env(spec),
            # a job calls the controller API (plans, commits): the token and the controllers' CA
            *controller_client_env(spec),
            *plan.env,
        ],
        "resources": _resources(section.resources),
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH_DIR}, *controller_client_mounts(spec)],
        "securityContext": _container_security(),
    }
    pod_executors = section.executors > 0
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account_name(ref),
        # only a driver that creates executor pods needs the API server (and so a token)
        "automountServiceAccountToken": pod_executors,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {}}, *controller_client_volumes(spec, ref)],
        **_scheduling(section.scheduling),
    }
    if pod_executors:
        container["ports"] = [
            {"name": "driver-rpc", "containerPort": DRIVER_PORT, "protocol": "TCP"},
            {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"},
        ]
        container["volumeMounts"].append(
            {"name": "executor-templates", "mountPath": EXECUTOR_TEMPLATE_DIR, "readOnly": True}
        )
        pod_spec["volumes"].append({"name": "executor-templates", "configMap": {"name": executor_templates_name(ref)}})
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    cron_spec: dict[str, Any] = {
        "schedule": plan.schedule,
        "suspend": section.suspend,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": section.starting_deadline_seconds,
        "successfulJobsHistoryLimit": section.successful_jobs_history_limit,
        "failedJobsHistoryLimit": section.failed_jobs_history_limit,
        "jobTemplate": {
            "metadata": {"labels": labels},
            "spec": {
                "backoffLimit": section.backoff_limit,
                "activeDeadlineSeconds": section.active_deadline_seconds,
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        },
    }
    if section.time_zone:
        cron_spec["timeZone"] = section.time_zone
    meta = _metadata(ref, cron_job_name(ref, plan.name))
    meta["labels"] = labels
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta, "spec": cron_spec}


def service_account(ref: ClusterRef) -> dict[str, Any]:
    meta = _metadata(ref, service_account_name(ref))
    meta["labels"] = {**common_labels(ref), "app.kubernetes.io/component": "spark-job"}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}


def desired_cron_jobs(spec: AutoMQClusterSpec, ref: ClusterRef) -> dict[JobName, dict[str, Any]]:
    return {plan.name: cron_job(spec, ref, plan) for plan in enabled_jobs(spec, ref)}


# ---------------------------------------------------------------------------------------------
# Status


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _finished_at(job: dict[str, Any], cond: dict[str, Any]) -> str:
    status = job.get("status") or {}
    return str(cond.get("lastTransitionTime") or status.get("completionTime") or status.get("startTime") or "")


def job_status(cron: dict[str, Any], jobs: list[dict[str, Any]]) -> SparkJobStatus:
    """What `status.sparkJobs.<job>` says, from the CronJob and the Jobs it started."""
    status = cron.get("status") or {}
    last_success = status.get("lastSuccessfulTime")
    failure: tuple[str, str, str] | None = None  # (time, job, message)
    for job in jobs:
        done = _condition(job, "Complete")
        if done is not None:
            at = _finished_at(job, done)
            if last_success is None or at > last_success:
                last_success = at
        failed = _condition(job, "Failed")
        if failed is not None:
            at = _finished_at(job, failed)
            if failure is None or at > failure[0]:
                reason = failed.get("reason") or "Failed"
                message = f"{reason}: {failed['message']}" if failed.get("message") else reason
                failure = (at, job["metadata"]["name"], message)
    return SparkJobStatus(
        cron_job=cron["metadata"]["name"],
        schedule=cron["spec"]["schedule"],
        suspended=bool(cron["spec"].get("suspend")),
        active=len(status.get("active") or []),
        last_schedule_time=status.get("lastScheduleTime"),
        last_successful_time=last_success,
        last_failure_time=failure[0] if failure else None,
        last_failed_job=failure[1] if failure else None,
        last_failure_message=failure[2] if failure else None,
    )
