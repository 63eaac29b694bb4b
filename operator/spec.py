"""The AutoMQCluster custom resource: spec and status as pydantic models.

These models are the one place the resource is described. `automq.operator.crd` turns their
JSON schema into the CRD's openAPIV3Schema (so every `description=` here is what
`kubectl explain automqcluster.spec...` prints), and the operator validates every object it
reconciles through them again, because a CRD schema cannot express everything (cross-field
rules run as CEL in the API server where it supports them, and always here).

Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.
Autoscaling and balancing are real (see `automq.operator.elastic`), and so are the Spark jobs
(`compaction`, `lakeIngestion`: CronJobs, see `automq.operator.sparkjobs`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from automq.operator.security_spec import (
    ListenerSpec,
    SecuritySpec,
    legacy_default_listeners,
    secure_default_listeners,
)

GROUP = "automq.io"
VERSION = "v1alpha1"
KIND = "AutoMQCluster"
PLURAL = "automqclusters"
SINGULAR = "automqcluster"
SHORT_NAMES = ["amq"]
DEFAULT_IMAGE = "ghcr.io/automq-py/automq:0.1.0"  # placeholder registry until images are published

# Ports every node uses unless the spec says otherwise (see docs/operator.md).
KAFKA_PORT = 9092
CONTROLLER_PORT = 9093
BROKER_HTTP_PORT = 9094
REPLICATION_LISTENER = "REPLICATION"  # broker-to-broker calls when no internal listener can carry them
REPLICATION_PORT = 9091
# On the AutoMQCluster: "secure" or "legacy", which defaults apply to a spec that names no
# listener (see automq.operator.security_spec); written once by the operator, then sticky.
SECURITY_DEFAULTS_ANNOTATION = f"{GROUP}/security-defaults"
# On the AutoMQCluster: "http" when the cluster's nodes already called their controllers over
# plain http before the operator made https the default (spec.security.controllerApi.tls absent
# then means false: switching schemes under running pods would stall the roll), else "https".
CONTROLLER_SCHEME_ANNOTATION = f"{GROUP}/controller-api-scheme"
# On the AutoMQCluster: what its pods run now, "<serve>/<client>" (automq.operator.controller_scheme):
# controllers serve http, https or both; clients call them with http or https. Written by the
# operator before it renders a step of a switch between http and https, so a restart resumes it.
CONTROLLER_API_STATE_ANNOTATION = f"{GROUP}/controller-api-state"
CONTROLLER_API_STATES = ("http/http", "https/https", "both/http", "both/https")
DEFAULT_WAL_SIZE = "10Gi"  # each broker's WAL volume when spec.broker.wal is not given

# Kubernetes' own resource.Quantity grammar, without a sign: a negative size is never meant.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _quantity(value: Any) -> str:
    if isinstance(value, bool):
        raise ValueError("expected a Kubernetes quantity such as '2Gi' or '500m', got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a quantity cannot be negative, got {value}")
        return str(value)
    if isinstance(value, float):
        if value < 0:
            raise ValueError(f"a quantity cannot be negative, got {value}")
        return repr(value)
    if isinstance(value, str) and _QUANTITY_RE.match(value):
        return value
    raise ValueError(f"expected a Kubernetes quantity such as '2Gi', '512Mi', '1' or '500m', got {value!r}")


# Stored as the string the user wrote; the CRD marks it int-or-string like core quantities.
Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
    )


# ---------------------------------------------------------------------------------------------
# Building blocks shared by both roles


class Resources(_Model):
    """Compute resources of one node's container, as in a Pod spec."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Minimum resources the scheduler reserves, e.g. {cpu: '1', memory: 2Gi}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Maximum resources the container may use, e.g. {memory: 2Gi}. Memory limit = request is recommended.",
    )

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> Resources:
        from kubernetes.utils.quantity import parse_quantity

        for name, limit in self.limits.items():
            request = self.requests.get(name)
            if request is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(f"requests.{name} ({request}) is larger than limits.{name} ({limit})")
        return self


class Toleration(_Model):
    """A taint this role's pods tolerate (same fields as a Pod toleration)."""

    key: str | None = Field(None, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value to match when operator is Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches every effect."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


class Scheduling(_Model):
    """Where this role's pods may run."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels a node must carry to run these pods."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints these pods tolerate.")
    affinity: dict[str, Any] | None = Field(
        None,
        description="A core/v1 Affinity, passed through to the pod unchanged (nodeAffinity, podAffinity, podAntiAffinity).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    priority_class_name: str | None = Field(None, description="PriorityClass of the pods.")

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(_LABEL_KEY, key):
                raise ValueError(f"nodeSelector key {key!r} is not a valid label key")
        return value


class RackAwareness(_Model):
    """Spread brokers over failure domains and tell each broker its rack (zone).

    The rack is read from the pod's `topology.kubernetes.io/zone` label through the downward API;
    Kubernetes 1.33+ copies the node's zone label onto the pod when it is bound."""

    enabled: bool = Field(
        False, description="Spread brokers across topologyKey values and report the zone as the broker's rack."
    )
    topology_key: str = Field(
        "topology.kubernetes.io/zone",
        pattern=_LABEL_KEY,
        description="Node label whose values are the failure domains brokers are spread over.",
    )


class WalSpec(_Model):
    """The broker's write-ahead log: acknowledged writes live here until uploaded to the object store."""

    kind: Literal["volume", "s3"] = Field(
        "volume",
        description="volume: a ring buffer on a PersistentVolume per broker (low latency). "
        "s3: bulk objects in the object store (no volume; ~100s of ms per acknowledged write).",
    )
    size: Quantity | None = Field(
        None, description="Size of each broker's WAL volume, e.g. 10Gi. Required when kind is volume."
    )
    storage_class_name: str | None = Field(
        None, description="StorageClass of the WAL volume; the cluster's default class when empty."
    )
    failover: Literal["forceDetach", "multiAttach"] = Field(
        "forceDetach",
        description="Volume WAL, when a broker's node is lost (after fencing the broker). forceDetach (any storage): "
        "force-delete the stuck pod and release the volume from the lost node, so the broker restarts elsewhere "
        "and recovers its own WAL. multiAttach (storage classes whose volumes can attach to a second node, e.g. "
        "io2 Multi-Attach): a recovery Job on another node mounts the volume and replays the WAL at once.",
    )
    out_of_service_taint: bool = Field(
        True,
        description="forceDetach: taint the lost node node.kubernetes.io/out-of-service (Kubernetes then detaches "
        "its volumes); false: delete the volume's VolumeAttachment instead.",
    )

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.kind != 'volume' || has(self.size)",
                    "message": "spec.broker.wal.size is required when spec.broker.wal.kind is volume (e.g. size: 10Gi)",
                }
            ]
        }
    )

    @model_validator(mode="after")
    def _volume_needs_size(self) -> WalSpec:
        if self.kind == "volume" and self.size is None:
            raise ValueError("spec.broker.wal.size is required when spec.broker.wal.kind is volume (e.g. size: 10Gi)")
        if self.kind == "s3" and self.storage_class_name is not None:
            raise ValueError("spec.broker.wal.storageClassName only applies when spec.broker.wal.kind is volume")
        return self


ConfigOverrides = Annotated[
    dict[str, str],
    Field(
        default_factory=dict,
        description="Node configuration keys (dotted paths into the node config file, e.g. "
        "'kafka.num_partitions': '3', 'storage.log_cache_bytes': '512MiB'). Keys the operator "
        "sets itself (node_id, listeners, ports, object store, WAL kind) are rejected.",
    ),
]


# ---------------------------------------------------------------------------------------------
# Roles


class ControllerSpec(_Model):
    """The metadata controllers: one active, the others standing by (a Lease decides)."""

    replicas: int = Field(
        1, ge=1, le=9, description="Number of controller pods; 3 for production (one active, two standbys)."
    )
    resources: Resources = Field(default_factory=Resources, description="Compute resources of each controller.")
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Placement of controller pods.")
    schema_registry_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="Also serve the Confluent-compatible schema registry alone on this port (8081 is Confluent's): "
        "a container port and a port of the controllers' Service, open to security.networkPolicies.kafkaFrom "
        "(the Kafka clients) when network policies are on. The registry is on the controller port too "
        "(docs/schema-registry.md).",
    )
    config: ConfigOverrides

    @field_validator("schema_registry_port")
    @classmethod
    def _registry_port_free(cls, v: int | None) -> int | None:
        if v == CONTROLLER_PORT:
            raise ValueError(f"{CONTROLLER_PORT} is the controller port; the registry is already served there")
        return v


class BrokerSpec(_Model):
    """The Kafka-protocol brokers. They keep no partition data: any broker can serve any partition."""

    replicas: int = Field(
        1, ge=0, le=1000, description="Number of broker pods. Also the scale subresource (kubectl scale, HPA, KEDA)."
    )
    resources: Resources = Field(default_factory=Resources, description="Compute resources of each broker.")
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Placement of broker pods.")
    rack: RackAwareness = Field(default_factory=RackAwareness, description="Zone awareness.")
    node_loss_grace_period: int = Field(
        20,
        ge=0,
        le=3600,
        description="Seconds a broker's node must be NotReady, Unknown or gone (and the controller must have "
        "stopped hearing the broker) before the operator fences the broker and recovers its WAL elsewhere.",
    )
    wal: WalSpec = Field(
        default_factory=lambda: WalSpec(kind="volume", size=DEFAULT_WAL_SIZE),
        description="Where each broker's write-ahead log lives.",
    )
    config: ConfigOverrides


# ---------------------------------------------------------------------------------------------
# Cluster-wide settings


class SecretKeyRef(_Model):
    """Object store credentials in a Secret of the cluster's namespace."""

    name: str = Field(..., pattern=_DNS_SUBDOMAIN, description="Secret name.")
    access_key_id_key: str = Field("AWS_ACCESS_KEY_ID", description="Key of the access key id in the Secret.")
    secret_access_key_key: str = Field(
        "AWS_SECRET_ACCESS_KEY", description="Key of the secret access key in the Secret."
    )


class ObjectStoreSpec(_Model):
    """The S3-compatible bucket that holds all partition data and the controller's metadata log."""

    bucket: str = Field(
        ...,
        min_length=3,
        max_length=63,
        pattern=r"^[a-z0-9][a-z0-9.\-]*[a-z0-9]$",
        description="Bucket name. It must exist; the operator does not create buckets.",
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="S3 endpoint URL (http:// or https://); AWS when empty.",
    )
    region: str = Field("us-east-1", min_length=1, description="Bucket region.")
    path_style: bool = Field(
        False, description="Address the bucket in the path (MinIO, SeaweedFS, Ceph) instead of the host name."
    )
    credentials_secret: SecretKeyRef | None = Field(
        None,
        description="Secret holding the access keys; when empty the pods rely on the environment (e.g. IRSA, workload identity).",
    )

    def url(self) -> str:
        """The node config's object_store_url for this bucket."""
        query = [f"region={self.region}"]
        if self.endpoint:
            query.insert(0, f"endpoint={self.endpoint}")
        if self.path_style:
            query.append("path_style=true")
        return f"s3://{self.bucket}?{'&'.join(query)}"


class MetricsSpec(_Model):
    """Prometheus metrics every node serves on its HTTP port at /metrics."""

    enabled: bool = Field(
        True, description="Annotate pods for Prometheus scraping (prometheus.io/scrape, /port, /path)."
    )


def _cel_default(model: type[BaseModel], field: str) -> str:
    """`self.<field>` with the model's default when the field is absent, as a CEL expression.

    The API server fills scalar defaults before it runs CEL rules, but a rule must not depend
    on that (a rule over an absent field is an error): spell the default out."""
    info = model.model_fields[field]
    alias = info.alias or field
    return f"(has(self.{alias}) ? self.{alias} : {info.default!r})"


class AutoscalingSpec(_Model):
    """Metric-driven broker scaling: the operator sets spec.broker.replicas from the brokers' load.

    Desired brokers = ceil(total load / per-broker target), for each target given (the largest
    wins), clamped to [minReplicas, maxReplicas] and to maxStep per decision. Scale-up follows
    the highest recommendation of the last scaleUpStabilizationSeconds (default 0: at once),
    scale-down the highest of the last scaleDownStabilizationSeconds (default 300), so a broker is
    removed only after load stayed low for the whole window; nothing is scaled while brokers are
    not Ready, partitions are moving or a previous scale is in flight. Scale-in drains the leaving
    brokers first. While enabled, the operator owns spec.broker.replicas."""

    enabled: bool = Field(
        False, description="Scale brokers from their load (spec.broker.replicas is then set by the operator)."
    )
    min_replicas: int = Field(1, ge=1, le=1000, description="Fewest brokers the autoscaler keeps.")
    max_replicas: int = Field(3, ge=1, le=1000, description="Most brokers the autoscaler runs.")
    target_bytes_in_mib_per_second: float | None = Field(
        None,
        gt=0,
        alias="targetBytesInMiBPerSecond",
        description="Produce traffic one broker should carry, in MiB/s (records appended, summed over brokers).",
    )
    target_cpu_percent: int | None = Field(
        None, ge=1, le=100, description="Average broker process CPU, in percent of one core, to aim for."
    )
    tolerance_percent: int = Field(
        10, ge=0, le=50, description="No scaling while load per broker is within this percent of the target."
    )
    interval_seconds: int = Field(15, ge=1, le=3600, description="How often load is evaluated for scaling.")
    scale_up_stabilization_seconds: int = Field(
        0, ge=0, le=3600, description="Scale up to the lowest recommendation of this window (0: at once)."
    )
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, le=3600, description="Scale down only to the highest recommendation of this window."
    )
    cooldown_seconds: int = Field(60, ge=0, le=3600, description="Minimum time between two scaling decisions.")
    max_step: int = Field(4, ge=1, le=100, description="Most brokers added or removed by one decision.")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"spec.autoscaling.minReplicas ({self.min_replicas}) exceeds maxReplicas ({self.max_replicas})"
            )
        if self.enabled and self.target_bytes_in_mib_per_second is None and self.target_cpu_percent is None:
            raise ValueError(
                "spec.autoscaling: set targetBytesInMiBPerSecond and/or targetCpuPercent when enabled is true"
            )
        return self


AutoscalingSpec.model_config["json_schema_extra"] = {
    "x-kubernetes-validations": [
        {
            "rule": f"{_cel_default(AutoscalingSpec, 'min_replicas')} <= {_cel_default(AutoscalingSpec, 'max_replicas')}",
            "message": "spec.autoscaling.minReplicas must not exceed maxReplicas",
        },
        {
            "rule": "!(has(self.enabled) && self.enabled) || has(self.targetBytesInMiBPerSecond) "
            "|| has(self.targetCpuPercent)",
            "message": "spec.autoscaling: set targetBytesInMiBPerSecond and/or targetCpuPercent when enabled is true",
        },
    ]
}
AutoscalingSpec.model_rebuild(force=True)


class BalancingSpec(_Model):
    """Continuous partition balancing: the operator moves partitions so every broker carries its share.

    Every intervalSeconds it scrapes each broker's /metrics, and when a broker's bytes-in or
    bytes-out is off the mean by more than tolerancePercent (or partitions or leaders are
    unevenly spread) it moves partitions through the controller's reassignment path, at most
    maxConcurrentMoves at a time, never the same partition twice within partitionCooldownSeconds,
    never while a scale operation is in flight. A broker that just became Ready is given its
    share at once. The annotation automq.io/rebalance: now (or dry-run) asks for one evaluation
    whether or not balancing is enabled."""

    enabled: bool = Field(False, description="Move partitions continuously to keep broker load even.")
    tolerance_percent: int = Field(
        10, ge=1, le=100, description="Allowed deviation of a broker's bytes-in/out from the mean, in percent."
    )
    interval_seconds: int = Field(60, ge=1, le=3600, description="How often load is evaluated.")
    max_concurrent_moves: int = Field(4, ge=1, le=100, description="Most partition moves in flight at once.")
    partition_cooldown_seconds: int = Field(
        300, ge=0, le=86400, description="A moved partition is not moved again within this time."
    )


def _schedule(value: Any) -> Any:
    from automq.operator.cron import check_schedule

    return check_schedule(value) if isinstance(value, str) else value


def _duration(value: Any) -> Any:
    from automq.broker.config import parse_duration_ms

    if isinstance(value, str):
        parse_duration_ms(value)
    return value


def _size(value: Any) -> Any:
    from automq.broker.config import parse_size

    if isinstance(value, str):
        parse_size(value)
    return value


def _schedule_schema() -> dict[str, Any]:
    from automq.operator.cron import SCHEDULE_PATTERN

    return {"type": "string", "pattern": SCHEDULE_PATTERN}


Schedule = Annotated[str, BeforeValidator(_schedule), WithJsonSchema(_schedule_schema())]
# The job's own flags take these (`automq spark compact --min-age 5m`): validated the same way.
Duration = Annotated[
    str, BeforeValidator(_duration), WithJsonSchema({"type": "string", "pattern": r"^[0-9]+ *(ms|s|m|h|d)?$"})
]
Size = Annotated[
    str,
    BeforeValidator(_size),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+ *([kKmMgGtT]i?[bB]?|[bB])?$"}),
]
DEFAULT_SPARK_IMAGE = "ghcr.io/automq-py/automq-spark:0.1.0"  # the Dockerfile's `spark` target


class SecretKeySelector(_Model):
    """One key of a Secret in the cluster's namespace."""

    name: str = Field(..., pattern=_DNS_SUBDOMAIN, description="Secret name.")
    key: str = Field(..., min_length=1, pattern=r"^[-._a-zA-Z0-9]+$", description="Key in the Secret.")


class SparkJobSpec(_Model):
    """What every Spark CronJob shares: when it runs, with which image and how much of a node.

    The job's pod runs spark-submit in client mode with the driver in the pod and local
    executors (`local[cores]`), or with `executors > 0` executor pods the driver asks the API
    server for (Spark on Kubernetes); it reads and writes the object store with the brokers'
    credentials (spec.objectStore.credentialsSecret)."""

    enabled: bool = Field(False, description="Run this job on its schedule (the CronJob is removed when false).")
    schedule: Schedule = Field("*/5 * * * *", description="Cron schedule (5 fields or @hourly, @daily, ...).")
    time_zone: str | None = Field(
        None,
        pattern=r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$",
        description="IANA time zone of the schedule, e.g. Europe/Berlin; the controller manager's zone when empty.",
    )
    suspend: bool = Field(False, description="Keep the CronJob but start no new runs.")
    image: str | None = Field(
        None,
        min_length=1,
        description=f"Image with the Spark jobs (the Dockerfile's spark target); default {DEFAULT_SPARK_IMAGE}.",
    )
    cores: int = Field(2, ge=1, le=64, description="Spark local executor threads (local[cores]) in the job's pod.")
    driver_memory: str = Field(
        "1g",
        pattern=r"^[1-9][0-9]*[kmgKMG]$",
        description="JVM heap of the Spark driver (spark-submit --driver-memory); keep it below the memory limit.",
    )
    executors: int = Field(
        0,
        ge=0,
        le=200,
        description="Executor pods (Spark on Kubernetes: the driver in the job's pod creates them through the API "
        "server, they connect back to it); 0 runs local executors in the job's pod (local[cores]).",
    )
    executor_cores: int = Field(1, ge=1, le=64, description="Cores of each executor pod (spark.executor.cores).")
    executor_memory: str = Field(
        "2g",
        pattern=r"^[1-9][0-9]*[kmgKMG]$",
        description="JVM heap of each executor pod (spark.executor.memory); the pod requests it plus Spark's "
        "memory overhead (10 %, at least 384 MiB).",
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="Compute resources of the job's pod; default requests cpu 1, memory 2Gi, limit memory 2Gi.",
    )
    scheduling: Scheduling = Field(default_factory=Scheduling, description="Placement of the job's pods.")
    backoff_limit: int = Field(1, ge=0, le=10, description="Retries of a failed run before the Job fails.")
    active_deadline_seconds: int = Field(
        3600, ge=60, le=604800, description="A run still going after this long is stopped and counted as failed."
    )
    starting_deadline_seconds: int = Field(
        300, ge=10, le=86400, description="A run that could not start within this long of its time is skipped."
    )
    successful_jobs_history_limit: int = Field(3, ge=0, le=100, description="Finished Jobs kept for inspection.")
    failed_jobs_history_limit: int = Field(3, ge=0, le=100, description="Failed Jobs kept for inspection.")


class KeyCompactionSpec(_Model):
    """Key compaction of cleanup.policy=compact topics (`automq spark compact --keys`): the
    latest record per key survives, tombstones go after delete.retention.ms."""

    enabled: bool = Field(True, description="Run key compaction too (a CronJob of its own) when compaction is enabled.")
    schedule: Schedule = Field(
        "*/30 * * * *", description="Cron schedule; more often than the topics' max.compaction.lag.ms."
    )


class CompactionSpec(SparkJobSpec):
    """Object compaction as a Spark CronJob (`automq spark compact`): small stream-set and stream
    objects are rewritten into large per-stream objects, committed through the controller."""

    enabled: bool = Field(False, description="Run object compaction on its schedule.")
    schedule: Schedule = Field("*/5 * * * *", description="Cron schedule of object compaction.")
    min_age: Duration = Field("5m", description="Objects younger than this are left alone (--min-age).")
    target_size: Size = Field("256MiB", description="Size of the objects written (--target-size).")
    small_size: Size = Field("16MiB", description="Stream objects below this are merged (--small-size).")
    force_split_age: Duration = Field(
        "2h", description="A lone stream-set object older than this is split into stream objects (--force-split-age)."
    )
    max_objects: int = Field(500, ge=2, le=100000, description="Source objects per run (--max-objects).")
    keys: KeyCompactionSpec = Field(
        default_factory=KeyCompactionSpec, description="Key compaction of compacted topics."
    )


class LakeIngestionSpec(SparkJobSpec):
    """Topics to Apache Iceberg tables as a Spark CronJob (`automq spark ingest`), exactly once."""

    enabled: bool = Field(False, description="Run lake ingestion on its schedule.")
    schedule: Schedule = Field("*/10 * * * *", description="Cron schedule of the ingestion job.")
    topics: list[Annotated[str, Field(pattern=r"^[a-zA-Z0-9._-]{1,249}$")]] = Field(
        default_factory=list,
        description="Topics ingested besides those with the topic config automq.table.topic.enable=true.",
    )
    only_listed_topics: bool = Field(
        False, description="Ingest only `topics`, not every topic with automq.table.topic.enable=true."
    )
    catalog_uri: str | None = Field(
        None,
        pattern=r"^(sqlite|postgresql(\+[a-z0-9]+)?|mysql(\+[a-z0-9]+)?|https?)://\S+$",
        description="Iceberg catalog: http(s):// (REST) or a SQLAlchemy URL (postgresql+psycopg://...). "
        "Use catalogUriSecret when it holds a password.",
    )
    catalog_uri_secret: SecretKeySelector | None = Field(
        None, description="A Secret key holding the catalog URI (instead of catalogUri)."
    )
    catalog_token_secret: SecretKeySelector | None = Field(
        None,
        description="A Secret key holding a REST catalog's bearer token (passed to the job as "
        "PYICEBERG_CATALOG__AUTOMQ__TOKEN, never on its command line; executors do not get it).",
    )
    warehouse: str | None = Field(
        None,
        pattern=r"^(s3|file)://\S+$",
        description="Warehouse location of new tables; default s3://<objectStore.bucket>/warehouse (same credentials).",
    )
    expire_snapshots_older_than: Duration | None = Field(
        None, description="After each run drop table snapshots older than this, e.g. 168h (the current one stays)."
    )
    compact_files_below: Size | None = Field(
        None,
        description="After each run rewrite each table's data files smaller than this (e.g. 32MiB) into large "
        "ones, in one commit that keeps the table's offsets (upsert tables too: their deletes are copy-on-write); "
        "tables with merge-on-read delete files (written by another engine) are left alone.",
    )
    remove_orphans_older_than: Duration | None = Field(
        None,
        description="After each run delete files under each table's location that nothing references and that "
        "are older than this, e.g. 72h: what a killed run left. Keep it well above activeDeadlineSeconds.",
    )

    @model_validator(mode="after")
    def _one_catalog(self) -> LakeIngestionSpec:
        if self.catalog_uri is not None and self.catalog_uri_secret is not None:
            raise ValueError("spec.lakeIngestion: set catalogUri or catalogUriSecret, not both")
        if self.enabled and self.catalog_uri is None and self.catalog_uri_secret is None:
            raise ValueError("spec.lakeIngestion: enabled needs catalogUri or catalogUriSecret (the Iceberg catalog)")
        if self.only_listed_topics and not self.topics:
            raise ValueError("spec.lakeIngestion: onlyListedTopics needs topics")
        return self


LakeIngestionSpec.model_config["json_schema_extra"] = {
    "x-kubernetes-validations": [
        {
            "rule": "!(has(self.catalogUri) && has(self.catalogUriSecret))",
            "message": "spec.lakeIngestion: set catalogUri or catalogUriSecret, not both",
        },
        {
            "rule": "!(has(self.enabled) && self.enabled) || has(self.catalogUri) || has(self.catalogUriSecret)",
            "message": "spec.lakeIngestion: enabled needs catalogUri or catalogUriSecret (the Iceberg catalog)",
        },
        {
            "rule": "!(has(self.onlyListedTopics) && self.onlyListedTopics) || (has(self.topics) && size(self.topics) > 0)",
            "message": "spec.lakeIngestion: onlyListedTopics needs topics",
        },
    ]
}
LakeIngestionSpec.model_rebuild(force=True)


# Node config keys the operator derives from the spec or the pod; an override would break the
# cluster (pods could not find each other) or contradict another spec field.
OPERATOR_OWNED_KEYS = {
    "node_id": "derived from the pod ordinal",
    "cluster_id": "set by spec.clusterId",
    "data_dir": "set by the operator to the pod's data volume",
    "object_store_url": "set by spec.objectStore",
    "controller_urls": "set by the operator from the controller Service",
    "rack": "set by spec.broker.rack",
    "listeners": "set by spec.listeners",
    "kafka.inter_broker_listener_name": "set by the operator from spec.listeners",
    "security.controller_token_file": "set by spec.security.controllerApi",
    "security.controller_tls": "set by spec.security.controllerApi.tls",
    "security.controller_ca_file": "set by spec.security.controllerApi.tls",
    "http_host": "set by the operator",
    "http_port": "set by the operator",
    "wal.kind": "set by spec.broker.wal.kind",
    "wal.path": "set by the operator to the WAL volume",
    "wal.capacity": "derived from spec.broker.wal.size",
    "controller.advertised_url": "set per pod from the controller's stable DNS name",
    "controller.leadership": "always a Lease on Kubernetes",
    "controller.lease_name": "set by the operator (<cluster>-controller)",
    "controller.lease_namespace": "the cluster's namespace",
}


def nest_overrides(overrides: dict[str, str]) -> dict[str, Any]:
    """{'kafka.num_partitions': '3'} -> {'kafka': {'num_partitions': '3'}} for NodeConfig."""
    nested: dict[str, Any] = {}
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"config key {dotted!r} conflicts with key {part!r}")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise ValueError(f"config key {dotted!r} conflicts with a longer key under it")
        node[parts[-1]] = value
    return nested


def check_wal_size(spec: AutoMQClusterSpec) -> None:
    """A volume WAL must hold two of the largest batches a broker accepts (the broker's own start
    check, broker.config.check_broker_config): refuse the spec here, naming both settings,
    instead of rendering brokers that crash-loop on start."""
    from automq.broker.config import WAL_RECORD_HEADER_BYTES, ConfigError, NodeConfig, check_broker_config
    from automq.operator.quantity import wal_capacity_bytes

    wal = spec.broker.wal
    if wal.kind != "volume" or wal.size is None:
        return
    try:
        capacity = wal_capacity_bytes(wal.size)
    except (ValueError, TypeError, ArithmeticError):
        return  # the Quantity type reports a malformed size
    config = NodeConfig.model_validate(
        {
            "node_id": 0,
            **nest_overrides({**spec.config, **spec.broker.config}),
            "wal": {"kind": "volume", "capacity": capacity},
        }
    )
    try:
        check_broker_config(config)
    except ConfigError:
        largest = config.kafka.message_max_bytes
        needed_mib = -(-2 * (largest + WAL_RECORD_HEADER_BYTES) // (1 << 20))
        smallest = -(-needed_mib * 10 // 9)  # the ring is 90 % of the volume, whole MiB
        raise ValueError(
            f"spec.broker.wal.size {wal.size} is too small: its WAL ring ({capacity} bytes, 90 % of the volume) must "
            f"hold two batches of kafka.message_max_bytes ({largest} bytes) plus their {WAL_RECORD_HEADER_BYTES}-byte "
            f"record headers; set spec.broker.wal.size to at least {smallest}Mi or lower kafka.message_max_bytes"
        ) from None


def check_overrides(overrides: dict[str, str], where: str) -> None:
    """Raise ValueError naming the first key that the node config would reject."""
    from automq.broker.config import NodeConfig

    for key in overrides:
        if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", key):
            raise ValueError(
                f"{where}[{key!r}]: keys are dotted snake_case node config paths, e.g. 'kafka.num_partitions'"
            )
        for owned, why in OPERATOR_OWNED_KEYS.items():
            if key == owned or key.startswith(owned + "."):
                raise ValueError(f"{where}[{key!r}]: cannot be overridden ({why})")
    try:
        NodeConfig.model_validate({"node_id": 0, **nest_overrides(overrides)})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = "unknown node config key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ValueError(f"{where}[{key!r}]: {msg}") from None


def _immutable_rules() -> list[Any]:
    """CEL transition rules (`oldSelf` is the stored spec) for fields a running cluster cannot
    change: the API server refuses such an update with the message, instead of the operator
    finding out later and reporting the cluster Degraded. Evaluated on the whole spec so that
    adding or removing an optional section, which changes the effective value, is caught too."""

    def wal(s: str, field: str, default: str) -> str:
        return f"(has({s}.broker) && has({s}.broker.wal) ? (has({s}.broker.wal.{field}) ? string({s}.broker.wal.{field}) : '') : '{default}')"

    def cluster_id(s: str) -> str:
        return f"(has({s}.clusterId) ? {s}.clusterId : '')"

    new_size, old_size = wal("self", "size", DEFAULT_WAL_SIZE), wal("oldSelf", "size", DEFAULT_WAL_SIZE)
    kind = WalSpec.model_fields["kind"].default
    # Size and class only matter while the kind stays (a kind change is refused on its own).
    kind_changed = f"{wal('self', 'kind', kind)} != {wal('oldSelf', 'kind', kind)} || "
    fixed = "it is fixed when the cluster is created; create a new cluster to change it"
    return [
        {
            "rule": f"{cluster_id('self')} == {cluster_id('oldSelf')}",
            "message": f"spec.clusterId cannot change: Kafka clients and the stored metadata know the cluster by it ({fixed})",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "self.objectStore.bucket == oldSelf.objectStore.bucket",
            "message": f"spec.objectStore.bucket cannot change: every partition's data and the metadata log are in it ({fixed})",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": f"{wal('self', 'kind', kind)} == {wal('oldSelf', 'kind', kind)}",
            "message": f"spec.broker.wal.kind cannot change: brokers' unuploaded writes are in the current WAL ({fixed})",
            "reason": "FieldValueForbidden",
        },
        {
            # By value: 10240Mi and 10Gi are the same size (the API server may store either).
            "rule": f"{kind_changed}{new_size} == {old_size} || ({new_size} != '' && {old_size} != '' && "
            f"quantity({new_size}).compareTo(quantity({old_size})) == 0)",
            "message": f"spec.broker.wal.size cannot change: each broker's WAL volume was created with it ({fixed})",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": f"{kind_changed}{wal('self', 'storageClassName', '')} == {wal('oldSelf', 'storageClassName', '')}",
            "message": f"spec.broker.wal.storageClassName cannot change: each broker's WAL volume was created with it ({fixed})",
            "reason": "FieldValueForbidden",
        },
    ]


class AutoMQClusterSpec(_Model):
    """Desired state of an AutoMQ cluster: controllers, brokers and the bucket they share."""

    # cast: pydantic types json_schema_extra values as JsonValue, which list[dict[str, str]] is.
    model_config = ConfigDict(json_schema_extra=cast(JsonDict, {"x-kubernetes-validations": _immutable_rules()}))

    image: str = Field(DEFAULT_IMAGE, min_length=1, description="Container image of controllers and brokers.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the image."
    )
    image_pull_secrets: list[str] = Field(default_factory=list, description="Names of Secrets used to pull the image.")
    cluster_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="Cluster id reported to Kafka clients; defaults to <namespace>-<name>. Never change it on a running cluster.",
    )
    controller: ControllerSpec = Field(default_factory=ControllerSpec, description="Metadata controllers.")
    broker: BrokerSpec = Field(
        default_factory=BrokerSpec,
        description="Kafka-protocol brokers.",
        # An empty-object default in the CRD makes the API server fill broker.replicas (1) when
        # spec.broker is omitted: the scale subresource reads .spec.broker.replicas and answers
        # an error without it.
        json_schema_extra={"default": {}},
    )
    object_store: ObjectStoreSpec = Field(..., description="Object storage holding all data and metadata.")
    listeners: list[ListenerSpec] = Field(
        default_factory=secure_default_listeners,
        min_length=1,
        max_length=8,
        description="Kafka listeners of every broker; the first internal one is the bootstrap Service's port. "
        "Absent: one INTERNAL listener on 9092 with TLS and SCRAM-SHA-512 (clusters created before these "
        "defaults keep PLAINTEXT on 9092, see docs/security.md).",
    )
    security: SecuritySpec = Field(
        default_factory=SecuritySpec,
        description="Certificates (operator CA or cert-manager), controller API credentials, NetworkPolicies.",
    )
    config: ConfigOverrides
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus metrics.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description="Metric-driven broker scaling (off by default): the operator sets spec.broker.replicas to "
        "ceil(total load / per-broker target) within [minReplicas, maxReplicas], up at once, down only after load "
        "stayed low for scaleDownStabilizationSeconds, draining leaving brokers first.",
    )
    balancing: BalancingSpec = Field(
        default_factory=BalancingSpec,
        description="Continuous partition balancing (off by default): every intervalSeconds, partitions move "
        "(through the controller, maxConcurrentMoves at a time) until every broker's bytes in/out is within "
        "tolerancePercent of the mean; a new broker gets its share as soon as it is Ready. Annotation "
        "automq.io/rebalance: now | dry-run asks for one evaluation.",
    )
    compaction: CompactionSpec = Field(
        default_factory=CompactionSpec,
        description="Object compaction (and key compaction of compacted topics) as Spark CronJobs.",
    )
    lake_ingestion: LakeIngestionSpec = Field(
        default_factory=LakeIngestionSpec,
        description="Topics to Apache Iceberg tables, exactly once, as a Spark CronJob.",
    )
    deletion_policy: Literal["Retain", "Delete"] = Field(
        "Retain",
        description="What happens to data when the AutoMQCluster is deleted. Retain: WAL volumes (PVCs) and "
        "bucket objects stay. Delete: the WAL PVCs are deleted too (bucket objects are never deleted by the operator).",
    )

    @model_validator(mode="before")
    @classmethod
    def _security_defaults(cls, data: Any, info: ValidationInfo) -> Any:
        """Fill what "secure by default" means for this cluster (see security_spec): the
        validation context's `legacy` flag says the cluster predates those defaults."""
        if not isinstance(data, dict):
            return data
        legacy = bool((info.context or {}).get("legacy"))
        data = dict(data)
        if "listeners" not in data:
            data["listeners"] = [
                lst.model_dump(by_alias=True, exclude_defaults=True)
                for lst in (legacy_default_listeners() if legacy else secure_default_listeners())
            ]
        security = dict(data.get("security") or {})
        api = dict(security.get("controllerApi") or {})
        api.setdefault("authentication", "none" if legacy else "token")
        if api.get("tls") is None:
            api["tls"] = not (legacy or (info.context or {}).get("controller_http"))
        policies = dict(security.get("networkPolicies") or {})
        if policies.get("enabled") is None:
            policies["enabled"] = not legacy
        data["security"] = {**security, "controllerApi": api, "networkPolicies": policies}
        return data

    @field_validator("listeners")
    @classmethod
    def _distinct_listeners(cls, value: list[ListenerSpec]) -> list[ListenerSpec]:
        names = [listener.name for listener in value]
        ports = [listener.port for listener in value]
        if len(set(names)) != len(names):
            raise ValueError(f"listener names must be distinct, got {names}")
        if len(set(ports)) != len(ports):
            raise ValueError(f"listener ports must be distinct, got {ports}")
        taken = {BROKER_HTTP_PORT: "the broker HTTP port (metrics, health)"}
        for port in ports:
            if port in taken:
                raise ValueError(f"listener port {port} is {taken[port]}")
        if not any(listener.type == "internal" for listener in value):
            raise ValueError(
                "at least one listener must be of type internal (the bootstrap Service and the operator use it)"
            )
        if inter_broker_listener(value) is None and (REPLICATION_LISTENER in names or REPLICATION_PORT in ports):
            raise ValueError(
                f"listener name {REPLICATION_LISTENER} and port {REPLICATION_PORT} are the brokers' own "
                "(broker-to-broker calls) when only OAUTHBEARER listeners are internal"
            )
        return value

    @model_validator(mode="after")
    def _oauth_settings(self) -> AutoMQClusterSpec:
        # One JWKS / issuer / audience per broker (the node config's security section).
        oauth = [lst for lst in self.listeners if lst.sasl_mechanism() == "OAUTHBEARER"]
        settings = {lst.authentication.oauth_settings() for lst in oauth if lst.authentication is not None}
        if len(settings) > 1:
            raise ValueError(
                "spec.listeners: every oauthbearer listener must name the same jwksSecret and issuer/audience"
            )
        unsecured = {**self.config, **self.broker.config}.get("security.sasl_oauthbearer_allow_unsecured", "")
        for lst in oauth:
            if (
                lst.authentication is not None
                and lst.authentication.jwks_secret is None
                and unsecured.lower() != "true"
            ):
                raise ValueError(
                    f"spec.listeners: {lst.name}: oauthbearer needs authentication.jwksSecret (the identity "
                    "provider's keys), or security.sasl_oauthbearer_allow_unsecured: 'true' in spec.config for development"
                )
        return self

    @model_validator(mode="after")
    def _node_ports_fit(self) -> AutoMQClusterSpec:
        most = max(self.broker.replicas, self.autoscaling.max_replicas if self.autoscaling.enabled else 0)
        for listener in self.listeners:
            base = listener.node_port_base
            if base is not None and base + most - 1 > 32767:
                raise ValueError(
                    f"spec.listeners: {listener.name}.nodePortBase {base} + {most} brokers goes past node port 32767"
                )
        return self

    def controller_token(self) -> bool:
        """Whether the controller API requires the cluster's token."""
        return self.security.controller_api.authentication == "token"

    def network_policies(self) -> bool:
        return bool(self.security.network_policies.enabled)

    def needs_tls(self) -> bool:
        return any(listener.tls for listener in self.listeners)

    # What the pods run now while a switch between http and https rolls (serve, client); None:
    # what the spec asks for. Set from CONTROLLER_API_STATE_ANNOTATION (parse_cluster, the reconciler).
    _controller_api_state: tuple[str, str] | None = PrivateAttr(None)

    def set_controller_api_state(self, serve: str, client: str) -> None:
        self._controller_api_state = (serve, client)

    def controller_tls_target(self) -> bool:
        """Whether the spec asks for an https controller API (where a switch ends)."""
        return bool(self.security.controller_api.tls)

    def controller_tls(self) -> bool:
        """Whether the controllers serve https now (a certificate of the cluster CA), alone or,
        mid-switch, together with plain http."""
        if self._controller_api_state is None:
            return self.controller_tls_target()
        return self._controller_api_state[0] != "http"

    def controller_plain_http(self) -> bool:
        """Whether https controllers also serve plain http (the middle of a switch)."""
        return self._controller_api_state is not None and self._controller_api_state[0] == "both"

    def controller_client_tls(self) -> bool:
        """Whether brokers, the operator and Jobs call the controllers with https now."""
        if self._controller_api_state is None:
            return self.controller_tls_target()
        return self._controller_api_state[1] == "https"

    def needs_certificates(self) -> bool:
        """Whether the cluster needs a CA and node certificates: TLS listeners or https controllers."""
        return self.needs_tls() or self.controller_tls()

    def internal_listeners(self) -> list[ListenerSpec]:
        return [listener for listener in self.listeners if listener.type == "internal"]

    @model_validator(mode="after")
    def _overrides_are_node_config(self) -> AutoMQClusterSpec:
        check_overrides(self.config, "spec.config")
        check_overrides(self.controller.config, "spec.controller.config")
        check_overrides(self.broker.config, "spec.broker.config")
        check_overrides({**self.config, **self.broker.config}, "spec.broker.config")
        check_wal_size(self)
        return self


# ---------------------------------------------------------------------------------------------
# Status


class Condition(_Model):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: Literal["Ready", "Progressing", "Degraded", "Balancing", "Autoscaling"] = Field(
        ...,
        description="Ready, Progressing or Degraded; Balancing and Autoscaling say whether those loops act "
        "(False with the reason when they pause: metrics missing, controller unreachable, an HPA, ...).",
    )
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str = Field(
        ..., pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", description="CamelCase reason for the machine."
    )
    message: str = Field("", description="What happened, for a person.")
    last_transition_time: str = Field(..., description="When status last changed (RFC 3339).")
    observed_generation: int = Field(0, ge=0, description="metadata.generation this condition was computed for.")


class RoleStatus(_Model):
    """Replica counts of one role."""

    desired: int = Field(0, ge=0, description="Replicas the spec asks for.")
    replicas: int = Field(
        0, ge=0, description="Pods that exist now (the scale subresource's status.replicas for brokers)."
    )
    ready: int = Field(0, ge=0, description="Pods that are Ready.")
    updated: int = Field(0, ge=0, description="Pods running the current pod template.")
    summary: str = Field("0/0", description="ready/desired, for `kubectl get`.")


class ProposalSummary(_Model):
    """The last set of partition moves the balancer proposed."""

    time: str = Field(..., description="When it was computed (RFC 3339).")
    trigger: str = Field(..., description="interval, scale-out, drain, annotation or dry-run.")
    dry_run: bool = Field(False, description="Proposed only (automq.io/rebalance: dry-run): nothing moved.")
    moves: list[str] = Field(default_factory=list, description="topic-partition: from -> to (why), at most 50 listed.")
    move_count: int = Field(0, ge=0, description="Number of moves proposed.")
    imbalance_before: dict[str, float] = Field(default_factory=dict, description="Imbalance per goal before.")
    imbalance_after: dict[str, float] = Field(default_factory=dict, description="Imbalance per goal expected after.")


class BalancingStatus(_Model):
    """Observed by the balancer."""

    last_evaluation_time: str | None = Field(None, description="When load was last evaluated (RFC 3339).")
    imbalance: dict[str, float] = Field(
        default_factory=dict,
        description="Per goal, the largest deviation of a broker from the mean in percent (bytesIn, bytesOut, ...).",
    )
    broker_load: dict[str, str] = Field(
        default_factory=dict, description="Per broker id: bytes-in/out MiB/s and partitions led, as last scraped."
    )
    moves_in_flight: int = Field(0, ge=0, description="Partition moves started and not finished.")
    moves_total: int = Field(0, ge=0, description="Partition moves finished since the operator started.")
    failed_moves_total: int = Field(0, ge=0, description="Partition moves that failed (retried later).")
    last_rebalance_time: str | None = Field(None, description="When partitions were last moved (RFC 3339).")
    last_proposal: ProposalSummary | None = Field(None, description="The last proposal, executed or dry-run.")


class AutoscalingStatus(_Model):
    """Observed and decided by the autoscaler."""

    current_bytes_in_mib_per_second: float | None = Field(
        None, alias="currentBytesInMiBPerSecond", description="Produce traffic of all brokers, MiB/s."
    )
    current_cpu_percent: float | None = Field(None, description="Average broker CPU, percent of one core.")
    current_replicas: int = Field(0, ge=0, description="Brokers when the decision was made.")
    desired_replicas: int = Field(0, ge=0, description="Brokers the autoscaler wants.")
    last_decision: str = Field("", description="The last decision and why, with the numbers.")
    last_scale_time: str | None = Field(None, description="When the autoscaler last changed replicas (RFC 3339).")
    last_scale_reason: str | None = Field(None, description="Why it last changed replicas.")


class SparkJobStatus(_Model):
    """What the operator last saw of one Spark CronJob and its Jobs."""

    cron_job: str = Field(..., description="The CronJob's name.")
    schedule: str = Field(..., description="Its schedule.")
    suspended: bool = Field(False, description="No new runs start while true.")
    active: int = Field(0, ge=0, description="Runs in progress.")
    last_schedule_time: str | None = Field(None, description="When a run was last started (RFC 3339).")
    last_successful_time: str | None = Field(None, description="When a run last succeeded (RFC 3339).")
    last_failure_time: str | None = Field(None, description="When a run last failed (RFC 3339).")
    last_failed_job: str | None = Field(None, description="The Job of the last failed run.")
    last_failure_message: str | None = Field(None, description="Why it failed (the Job's condition).")


class ListenerStatus(_Model):
    """One listener as a client sees it."""

    name: str = Field(..., description="Listener name.")
    type: str = Field(..., description="internal, nodeport or loadbalancer.")
    security_protocol: str = Field(..., description="The client's security.protocol.")
    sasl_mechanism: str | None = Field(None, description="The client's sasl.mechanism, for SASL listeners.")
    bootstrap_servers: str | None = Field(
        None, description="bootstrap.servers (internal: the bootstrap Service; loadbalancer: the brokers' names)."
    )
    service: str | None = Field(None, description="The listener's bootstrap Service.")
    ca_secret: str | None = Field(
        None, description="TLS listeners: the Secret whose ca.crt clients trust (ssl.ca.location)."
    )


class AutoMQClusterStatus(_Model):
    """Observed state, written by the operator."""

    observed_generation: int = Field(0, ge=0, description="The metadata.generation the operator last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing and Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    controllers: RoleStatus = Field(default_factory=RoleStatus, description="Controller replicas.")
    brokers: RoleStatus = Field(default_factory=RoleStatus, description="Broker replicas.")
    bootstrap: str | None = Field(None, description="Kafka bootstrap address inside the cluster (host:port).")
    controller_endpoint: str | None = Field(None, description="Controller API base URL inside the cluster.")
    controller_api: str | None = Field(
        None,
        description="What the controllers serve and their clients use now (differs from spec.security.controllerApi.tls "
        "while a switch between http and https rolls; the automq.io/controller-api-state annotation records it).",
    )
    listeners: list[ListenerStatus] = Field(
        default_factory=list, description="How clients reach each listener (what a client config needs)."
    )
    broker_selector: str = Field(
        "", description="Label selector of broker pods (the scale subresource's labelSelectorPath)."
    )
    drained_brokers: list[int] = Field(
        default_factory=list,
        description="Broker node ids the operator drained for a restart or scale-in and will undrain once they are back.",
    )
    spark_jobs: dict[str, SparkJobStatus] = Field(
        default_factory=dict,
        description="Per enabled Spark job (compaction, keyCompaction, lakeIngestion): its CronJob's last runs.",
    )
    balancing: BalancingStatus | None = Field(None, description="What the balancer saw and did last.")
    autoscaling: AutoscalingStatus | None = Field(None, description="What the autoscaler saw and decided last.")


# Service names must be DNS-1035 labels (start with a letter), and the longest derived name,
# pod `<name>-controller-NNN` with its StatefulSet's revision label, must stay within 63 characters.
CLUSTER_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
CLUSTER_NAME_MAX = 40


def check_cluster_name(name: str) -> None:
    """Raise InvalidSpec when objects derived from this name would be invalid."""
    if len(name) > CLUSTER_NAME_MAX:
        raise InvalidSpec(
            f"metadata.name: at most {CLUSTER_NAME_MAX} characters (Service and pod names derive from it), got {len(name)}"
        )
    if not re.match(CLUSTER_NAME_PATTERN, name):
        raise InvalidSpec(
            f"metadata.name: must start with a letter and contain only a-z, 0-9 and '-' (it names Services), got {name!r}"
        )


def explain_validation_error(exc: ValidationError, prefix: str = "spec") -> str:
    """One line per problem, each naming the field by its wire (camelCase) path."""
    lines = []
    for err in exc.errors():
        path = ".".join([prefix, *(str(p) for p in err["loc"])])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        # Cross-field checks already name their own field(s) in the message.
        lines.append(msg if msg.startswith(prefix + ".") else f"{path}: {msg}")
    return "; ".join(lines)


def inter_broker_listener(listeners: list[ListenerSpec]) -> ListenerSpec | None:
    """The internal listener brokers also use to call each other (transaction markers), by
    preference: PLAINTEXT (what the listener allows anyway), client certificates (the broker
    presents its own), SCRAM or PLAIN (the brokers' own SCRAM user), TLS without authentication.
    None when only OAUTHBEARER listeners are internal: the operator then adds REPLICATION."""
    internal = [lst for lst in listeners if lst.type == "internal"]
    for wanted in (
        lambda lst: lst.security_protocol() == "PLAINTEXT",
        lambda lst: lst.client_certificates(),
        lambda lst: lst.sasl_mechanism() in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"),
        lambda lst: lst.security_protocol() == "SSL",
    ):
        found = next((lst for lst in internal if wanted(lst)), None)
        if found is not None:
            return found
    return None


BROKER_USER = "__automq-broker"  # the brokers' SCRAM user (no AutoMQUser can have this name)


def broker_principal(name: str, listener: ListenerSpec | None) -> str | None:
    """The principal brokers have when calling each other on `listener` (None: anonymous)."""
    if listener is None or listener.security_protocol() == "PLAINTEXT":
        return None
    if listener.client_certificates():
        return f"User:CN={name}-broker,O=automq-cluster"  # the broker certificate's subject
    if listener.sasl_mechanism() is not None:
        return f"User:{BROKER_USER}"
    return None


def parse_spec(raw: dict[str, Any], *, legacy: bool = False, controller_http: bool = False) -> AutoMQClusterSpec:
    """Validate an object's spec; ValueError with every problem named by path otherwise.
    `legacy`: the cluster predates secure defaults (PLAINTEXT, no controller token);
    `controller_http`: it predates https controllers (CONTROLLER_SCHEME_ANNOTATION)."""
    try:
        return AutoMQClusterSpec.model_validate(raw, context={"legacy": legacy, "controller_http": controller_http})
    except ValidationError as exc:
        raise InvalidSpec(explain_validation_error(exc)) from None


def is_legacy(obj: dict[str, Any]) -> bool:
    """Whether an AutoMQCluster object was pinned to the pre-secure defaults."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(SECURITY_DEFAULTS_ANNOTATION) == "legacy"


def is_controller_http(obj: dict[str, Any]) -> bool:
    """Whether an AutoMQCluster object was pinned to plain-http controllers by default."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(CONTROLLER_SCHEME_ANNOTATION) == "http"


def parse_cluster(obj: dict[str, Any]) -> AutoMQClusterSpec:
    """The spec of a live AutoMQCluster object, with the defaults its annotations pin."""
    spec = parse_spec(dict(obj.get("spec") or {}), legacy=is_legacy(obj), controller_http=is_controller_http(obj))
    state = ((obj.get("metadata") or {}).get("annotations") or {}).get(CONTROLLER_API_STATE_ANNOTATION)
    if state in CONTROLLER_API_STATES:
        serve, client = state.split("/")
        spec.set_controller_api_state(serve, client)
    return spec


class InvalidSpec(ValueError):
    """The AutoMQCluster's spec is invalid; the message names each field and why."""
