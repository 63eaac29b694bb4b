"""Every configuration key of broker and controller processes, with its default: one place.

A node reads one YAML file (`automq broker --config FILE`, `automq controller --config FILE`).
The operator renders the same models into its ConfigMap and local mode writes them to disk,
so the three never disagree about a key. Unknown keys are errors (a typo must not silently
fall back to a default), and every error names the key.

Sizes accept integers (bytes) or strings with a unit: "512KiB", "64MiB", "2GiB".
Durations accept integers (milliseconds) or strings: "250ms", "60s", "5m".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "kb": 1000,
    "mib": 1 << 20,
    "mb": 1000**2,
    "gib": 1 << 30,
    "gb": 1000**3,
    "tib": 1 << 40,
}
_DURATION_UNITS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_size(value: Any) -> int:
    """Bytes from an int or a string like '64MiB'."""
    if isinstance(value, bool):
        raise ValueError("expected a size, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    raise ValueError(f"expected a size such as 1048576 or '64MiB', got {value!r}")


def parse_duration_ms(value: Any) -> int:
    """Milliseconds from an int or a string like '250ms', '60s', '5m'."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _DURATION_UNITS:
            return int(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    raise ValueError(f"expected a duration such as 250 (ms) or '60s', got {value!r}")


Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
DurationMs = Annotated[int, BeforeValidator(parse_duration_ms), Field(ge=0)]
ConnectionCount = Annotated[int, Field(ge=0)]
Micros = Annotated[int, Field(ge=50, le=100_000)]
# Kafka's class name is accepted too, so a server.properties value carries over
AuthorizerName = Literal["", "standard", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WalConfig(_Section):
    """The write-ahead log. `volume`: a preallocated file/block device used as a ring.
    `s3`: bulk objects in the object store (no volume needed, higher latency)."""

    kind: Literal["volume", "s3"] = "volume"
    path: str = "wal"  # volume WAL: file or block device; relative paths are under data_dir
    capacity: Size = 256 << 20  # volume WAL ring size
    s3_bulk_interval_ms: DurationMs = 250  # S3 WAL: a bulk waits at most this long (an idle WAL PUTs at once)
    s3_bulk_bytes: Size = 8 << 20  # S3 WAL: or at most this much is buffered
    group_commit_max_delay_ms: DurationMs = 0  # wait up to this long to batch more appends per sync


class StorageConfig(_Section):
    """Caches and uploads of the stream storage engine."""

    log_cache_bytes: Size = 256 << 20  # FIFO of recent appends, serves tail reads
    block_cache_bytes: Size = 128 << 20  # LRU of object data blocks, serves catch-up reads
    upload_block_bytes: Size = 64 << 20  # cut and upload a cache block at this size ...
    upload_interval_ms: DurationMs = 60_000  # ... or at this age
    stream_split_bytes: Size = 8 << 20  # a stream with this much in one upload gets its own object
    object_block_bytes: Size = 512 << 10  # data block size inside objects
    read_ahead_initial_bytes: Size = 512 << 10
    read_ahead_max_bytes: Size = 32 << 20
    object_gc_retention_ms: DurationMs = 60_000  # obsolete objects are deleted after this


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class Listener(_Section):
    name: str = "PLAINTEXT"
    host: str = "0.0.0.0"
    port: int = Field(9092, ge=0, le=65535)
    advertised_host: str | None = None  # what clients are told; defaults to host (or 127.0.0.1 for 0.0.0.0)
    advertised_port: int | None = None
    # Kafka's listener.security.protocol.map entry for this listener: SSL and SASL_SSL use the
    # `tls` section, SASL_* the `security.sasl_*` keys
    security_protocol: SecurityProtocol = "PLAINTEXT"  # Kafka's listener.security.protocol.map entry
    ssl_client_auth: Literal["none", "requested", "required"] | None = Field(
        None,
        description="This SSL / SASL_SSL listener's own `ssl.client.auth` (Kafka's "
        "`listener.name.<name>.ssl.client.auth`), so a `required` client-certificate listener stays strict "
        "next to a SASL_SSL listener whose clients have no certificate; unset: `tls.client_auth`",
    )


class TlsConfig(_Section):
    """TLS of SSL / SASL_SSL listeners (and of the controller API when `security.controller_tls`
    is on). PEM files; the certificate and key are re-read when they change on disk, so a
    rotated certificate is served to new connections without a restart."""

    cert_file: str | None = None  # PEM certificate chain of this node (leaf first)
    key_file: str | None = None  # PEM private key of cert_file (unencrypted, or see key_password_file)
    key_password_file: str | None = None  # file holding the key's passphrase
    ca_file: str | None = None  # PEM CA bundle that client certificates are verified against
    client_auth: Literal["none", "requested", "required"] = "none"  # Kafka's ssl.client.auth
    min_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.2"  # oldest protocol accepted (ssl.enabled.protocols)
    ciphers: str | None = None  # OpenSSL cipher list for TLS 1.2 (ssl.cipher.suites); default: Python's
    # Kafka's ssl.principal.mapping.rules: "RULE:pattern/replacement/[LU]" entries and DEFAULT,
    # applied in order to the client certificate's subject DN (RFC 2253)
    principal_mapping_rules: list[str] = Field(default_factory=lambda: ["DEFAULT"])  # ssl.principal.mapping.rules
    reload_check_interval_ms: DurationMs = 10_000  # how often cert_file/key_file/ca_file are checked for changes
    handshake_timeout_ms: DurationMs = Field(10_000, gt=0)  # a TLS handshake unfinished this long is dropped
    # Kafka's ssl.endpoint.identification.algorithm: "https" checks the other broker's certificate
    # names its advertised host (inter-broker connections); "" trusts any certificate of the CA
    endpoint_identification_algorithm: Literal["https", ""] = "https"  # ssl.endpoint.identification.algorithm


SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class SecurityConfig(_Section):
    """Authentication: SASL on SASL_* listeners, and the controller API's credentials."""

    sasl_enabled_mechanisms: list[SaslMechanism] = Field(
        default_factory=lambda: list[SaslMechanism](["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
        description="SASL mechanisms offered in SaslHandshake (`sasl.enabled.mechanisms`)",
    )
    sasl_plain_users_file: str | None = Field(
        None,
        description="PLAIN checks passwords against this YAML file (`{user: password}`, re-read when it changes); "
        "unset: against the SCRAM credentials stored in the controller",
    )
    connections_max_reauth_ms: DurationMs = 0  # KIP-368: a SASL session lasts this long; 0 = forever
    sasl_oauthbearer_jwks_file: str | None = None  # JSON Web Key Set the token signatures are checked against
    sasl_oauthbearer_expected_issuer: str | None = None  # the token's `iss` must be this (when set)
    sasl_oauthbearer_expected_audience: str | None = None  # the token's `aud` must hold this (when set)
    sasl_oauthbearer_sub_claim_name: str = "sub"  # claim naming the principal
    sasl_oauthbearer_clock_skew_ms: DurationMs = 30_000  # tolerance on exp / nbf / iat
    sasl_oauthbearer_allow_unsecured: bool = Field(
        False, description="Development only: accept unsigned (`alg: none`) tokens, as Kafka's unsecured validator"
    )
    sasl_mechanism_inter_broker_protocol: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None,
        description="SASL mechanism brokers authenticate to each other with on a SASL inter-broker listener "
        "(`sasl.mechanism.inter.broker.protocol`); unset: the first client-capable one of sasl_enabled_mechanisms",
    )
    sasl_inter_broker_jaas_config_file: str | None = Field(
        None,
        description="A file holding the broker's own SASL credentials in Kafka's `sasl.jaas.config` syntax "
        '(`... required username="broker" password="...";`), used on a SASL inter-broker listener; re-read '
        "for every new connection",
    )
    delegation_token_secret_key_file: str | None = Field(
        None,
        description="A file holding the key delegation tokens' HMACs are derived from, the same on every broker "
        "(`delegation.token.secret.key`); unset: delegation tokens are disabled",
    )
    delegation_token_max_lifetime_ms: DurationMs = Field(
        7 * 24 * 3_600_000,
        gt=0,
        description="A token cannot be renewed past this age (`delegation.token.max.lifetime.ms`)",
    )
    delegation_token_expiry_time_ms: DurationMs = Field(
        24 * 3_600_000,
        gt=0,
        description="A token expires this long after its creation or last renewal unless renewed "
        "(`delegation.token.expiry.time.ms`)",
    )
    controller_token_file: str | None = Field(
        None,
        description="A file holding the shared token every controller API call must carry (`Authorization: Bearer`); "
        "brokers, the operator and CLIs read the same file. Unset: no token required",
    )
    controller_tls: bool = False  # serve the controller API over https with the `tls` section; clients verify it
    controller_plain_http: bool = Field(
        False,
        description="With `security.controller_tls`: also serve plain http on the same port (the first byte "
        "tells a TLS handshake from an HTTP request). Only for the middle of a rolling switch between http "
        "and https, which the operator drives; otherwise a plain-http request gets one 400",
    )
    controller_ca_file: str | None = Field(
        None,
        description="PEM CA bundle an https controller's certificate is verified against by this node's "
        "controller client (re-read when it changes); unset: `tls.ca_file`, else the system store. The host "
        "name is checked unless `tls.endpoint_identification_algorithm` is empty",
    )
    controller_open_paths: list[str] = Field(
        default_factory=lambda: ["/healthz", "/readyz", "/metrics"],
        description="Controller HTTP paths that need no credentials (probes and scrapes)",
    )


class ControllerConfig(_Section):
    """The metadata controller (`automq controller`). Its state lives in the object store
    under `metadata_prefix`; nothing is kept on local disk."""

    advertised_url: str | None = None  # how brokers reach this controller; default http://<http_host>:<port>
    metadata_prefix: str = "controller/"  # key prefix of the metadata log and snapshots
    leadership: Literal["log", "lease"] = "log"  # "lease": a coordination.k8s.io Lease decides who tries to lead
    lease_name: str = "automq-controller"  # Kubernetes Lease name (leadership: lease)
    lease_namespace: str | None = None  # default: the pod's namespace
    lease_timeout_ms: DurationMs = 3_000  # a standby takes over after the leader wrote nothing this long
    renew_interval_ms: DurationMs = 500  # an idle leader writes a heartbeat entry this often
    poll_interval_ms: DurationMs = 100  # a standby looks for new log entries this often
    snapshot_interval_entries: int = Field(500, ge=1)  # write a snapshot after this many log entries
    gc_interval_ms: DurationMs = 5_000  # expire prepared ids / delete garbage objects this often
    max_batch_commands: int = Field(2_000, ge=1)  # group commit: at most this many requests per log entry
    schema_registry_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="The Confluent-compatible schema registry is served on the controller's HTTP port "
        "(`/subjects`, `/schemas`, `/config`, ...; docs/schema-registry.md); this port (Confluent's is 8081) "
        "serves the registry alone (not the controller API, so it can be open to every client), with the same "
        "TLS and token. None: no second listener",
    )


ConsumerAssignor = Literal["uniform", "range"]
CONSUMER_ASSIGNORS: tuple[ConsumerAssignor, ...] = ("uniform", "range")


def _assignors() -> list[ConsumerAssignor]:
    return list(CONSUMER_ASSIGNORS)


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


class KafkaConfig(_Section):
    """Broker defaults a Kafka user knows by their Kafka names (dots become underscores)."""

    auto_create_topics_enable: bool = True
    num_partitions: int = Field(1, ge=1)
    default_replication_factor: int = Field(1, ge=1)
    log_retention_ms: int = 7 * 24 * 3_600_000  # -1 = forever
    log_retention_bytes: int = -1
    log_retention_check_interval_ms: DurationMs = Field(300_000, gt=0)  # how often retention trims streams
    message_max_bytes: Size = 1_048_588  # Kafka's default max batch size
    socket_request_max_bytes: Size = 100 << 20
    group_initial_rebalance_delay_ms: DurationMs = 3_000  # Kafka's default: members joining together rebalance once
    group_min_session_timeout_ms: DurationMs = 6_000
    group_max_session_timeout_ms: DurationMs = 1_800_000
    group_consumer_session_timeout_ms: DurationMs = 45_000  # KIP-848 groups: a member silent this long is removed
    group_consumer_heartbeat_interval_ms: DurationMs = 5_000  # KIP-848 groups: told to members in every heartbeat
    group_consumer_assignors: list[ConsumerAssignor] = Field(
        default_factory=_assignors, min_length=1
    )  # KIP-848; 1st: default
    group_consumer_migration_policy: Annotated[
        Literal["bidirectional", "upgrade", "downgrade", "disabled"], BeforeValidator(_lower)
    ] = Field(
        "bidirectional",
        description="KIP-848 online migration of a non-empty group: `upgrade` lets a consumer-protocol member "
        "join a classic group (it becomes a consumer group that still serves its classic members), `downgrade` turns "
        "it back into a classic group when its last consumer-protocol member leaves; `bidirectional` both, "
        "`disabled` neither (a consumer-protocol member joining a non-empty classic group gets GROUP_ID_NOT_FOUND)",
    )
    group_share_enable: bool = True  # KIP-932 share groups; false: their APIs are not served (Kafka: share.version=0)
    group_share_session_timeout_ms: DurationMs = 45_000  # share groups: a member silent this long is removed
    group_share_heartbeat_interval_ms: DurationMs = 5_000  # share groups: told to members in every heartbeat
    group_share_max_size: int = Field(200, ge=1)  # share groups: members beyond this get GROUP_MAX_SIZE_REACHED
    group_share_record_lock_duration_ms: DurationMs = Field(30_000, gt=0)  # share groups: a record's acquisition lock
    group_share_delivery_count_limit: int = Field(5, ge=2, le=10)  # share groups: deliveries before archiving
    group_share_partition_max_record_locks: int = Field(2_000, ge=100)  # share groups: in-flight records per partition
    # Kafka's bounds of the per-group share.* configs (a group's value outside them is INVALID_CONFIG)
    group_share_min_record_lock_duration_ms: DurationMs = Field(
        15_000, ge=1_000, le=30_000, description="share groups: a group's share.record.lock.duration.ms at least"
    )
    group_share_max_record_lock_duration_ms: DurationMs = Field(
        60_000, ge=30_000, le=3_600_000, description="share groups: a group's share.record.lock.duration.ms at most"
    )
    group_share_min_session_timeout_ms: DurationMs = Field(
        45_000, gt=0, description="share groups: a group's share.session.timeout.ms at least"
    )
    group_share_max_session_timeout_ms: DurationMs = Field(
        60_000, gt=0, description="share groups: a group's share.session.timeout.ms at most"
    )
    group_share_min_heartbeat_interval_ms: DurationMs = Field(
        5_000, gt=0, description="share groups: a group's share.heartbeat.interval.ms at least"
    )
    group_share_max_heartbeat_interval_ms: DurationMs = Field(
        15_000, gt=0, description="share groups: a group's share.heartbeat.interval.ms at most"
    )
    group_share_max_share_sessions: int = Field(
        2_000, ge=1, description="share groups: share sessions (one per member and broker) this broker keeps at most"
    )
    group_share_min_delivery_count_limit: int = Field(
        2, ge=2, le=5, description="share groups: a group's share.delivery.count.limit at least (KIP-1240)"
    )
    group_share_max_delivery_count_limit: int = Field(
        10, ge=5, le=25, description="share groups: a group's share.delivery.count.limit at most (KIP-1240)"
    )
    group_share_min_partition_max_record_locks: int = Field(
        100, ge=100, le=2_000, description="share groups: a group's share.partition.max.record.locks at least"
    )
    group_share_max_partition_max_record_locks: int = Field(
        4_000, ge=2_000, le=10_000, description="share groups: a group's share.partition.max.record.locks at most"
    )
    offsets_retention_ms: int = 7 * 24 * 3_600_000
    transactional_id_expiration_ms: DurationMs = Field(7 * 24 * 3_600_000, gt=0)
    producer_id_expiration_ms: DurationMs = Field(24 * 3_600_000, gt=0)
    producer_id_expiration_check_interval_ms: DurationMs = Field(600_000, gt=0)  # how often idle producers go
    offsets_topic_num_partitions: int = Field(8, ge=1)  # partitions of the internal __consumer_offsets topic
    transaction_state_log_num_partitions: int = Field(8, ge=1)  # partitions of the internal __transaction_state topic
    transaction_max_timeout_ms: DurationMs = Field(
        900_000, gt=0
    )  # a producer's transaction.timeout.ms may not exceed it
    transaction_abort_timed_out_transaction_cleanup_interval_ms: DurationMs = Field(10_000, gt=0)  # timeout checks
    transaction_remove_expired_transaction_cleanup_interval_ms: DurationMs = Field(3_600_000, gt=0)  # id expiry
    transaction_partition_verification_enable: bool = True  # KIP-890: a txn's 1st batch per partition checked
    connections_max_idle_ms: DurationMs = 600_000  # close client connections idle this long (Kafka's default)
    max_connections: int = Field(10_000, ge=1)  # more client connections are closed at once (Kafka: unlimited)
    max_connections_per_ip: int = Field(2_147_483_647, ge=1)  # connections from one address beyond this are closed
    max_connections_per_ip_overrides: dict[str, ConnectionCount] = Field(default_factory=dict)  # {host or IP: limit}
    request_frame_timeout_ms: DurationMs = Field(60_000, gt=0)  # automq only: close a frame unfinished this long
    queued_max_request_bytes: Size = 256 << 20  # unfinished request frames of all connections hold at most this
    inter_broker_listener_name: str | None = None  # brokers reach each other here; default: first usable listener
    fetch_session_cache_slots: int = Field(1000, ge=0)  # incremental fetch sessions kept (KIP-227); 0 disables
    authorizer_class_name: AuthorizerName = ""  # "standard": every request is checked against ACLs; "": no authorizer
    super_users: str = ""  # "User:admin;User:ops": principals every check allows (Kafka's super.users)
    allow_everyone_if_no_acl_found: bool = False  # a resource without any ACL: allowed to all (else denied)
    authorizer_audit_log: bool = False  # log every authorization decision (denials are always logged at INFO)
    quota_window_num: int = Field(11, ge=2)  # client quotas: rates are measured over this many samples ...
    quota_window_size_seconds: int = Field(1, ge=1)  # ... of this many seconds each

    @model_validator(mode="after")
    def _check_share_bounds(self) -> KafkaConfig:
        # Kafka refuses to start when a bound pair is inverted or the broker's own value lies
        # outside bounds the operator set; the bounds' defaults (Kafka's) do not constrain the
        # broker value, so fast test clusters with short locks and sessions keep working
        for what in (
            "record_lock_duration_ms",
            "session_timeout_ms",
            "heartbeat_interval_ms",
            "delivery_count_limit",
            "partition_max_record_locks",
        ):
            lo_field, hi_field = f"group_share_min_{what}", f"group_share_max_{what}"
            lo, hi, value = getattr(self, lo_field), getattr(self, hi_field), getattr(self, f"group_share_{what}")
            if lo > hi:
                raise ValueError(f"{kafka_name(lo_field)} ({lo}) must be at most {kafka_name(hi_field)} ({hi})")
            if lo_field in self.model_fields_set and value < lo:
                raise ValueError(
                    f"group.share.{what.replace('_', '.')} ({value}) must be at least {kafka_name(lo_field)} ({lo})"
                )
            if hi_field in self.model_fields_set and value > hi:
                raise ValueError(
                    f"group.share.{what.replace('_', '.')} ({value}) must be at most {kafka_name(hi_field)} ({hi})"
                )
        return self


# Kafka's broker-config name of each `kafka.*` field: the field name with dots, except those
# listed here; None where Kafka has no key of that meaning and unit (an automq setting, or
# offsets.retention.minutes, which Kafka counts in minutes). The docs, DescribeConfigs and
# `automq local up --set NAME=...` all take Kafka names from here.
KAFKA_NAME_EXCEPTIONS: dict[str, str | None] = {
    "fetch_session_cache_slots": "max.incremental.fetch.session.cache.slots",
    "offsets_retention_ms": None,
    "request_frame_timeout_ms": None,
    "authorizer_audit_log": None,
}


def kafka_name(field: str) -> str | None:
    """Kafka's name of the `kafka.<field>` setting (None: Kafka has no such key)."""
    if field in KAFKA_NAME_EXCEPTIONS:
        return KAFKA_NAME_EXCEPTIONS[field]
    return field.replace("_", ".")


def kafka_field(name: str) -> str | None:
    """The `kafka.*` field a Kafka broker-config name sets, if this config has one."""
    for field in KafkaConfig.model_fields:
        if kafka_name(field) == name:
            return field
    return None


class NodeConfig(_Section):
    """A broker or controller process."""

    node_id: int = Field(..., ge=0)
    cluster_id: str = "automq-local"
    data_dir: str = "data"  # local scratch (WAL file); partition data never lives here
    object_store_url: str = "file:///var/lib/automq/objects"
    controller_urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9093"])
    rack: str | None = None
    listeners: list[Listener] = Field(default_factory=lambda: [Listener()])
    http_host: str = "0.0.0.0"
    http_port: int = Field(9094, ge=0, le=65535)  # /metrics, /healthz, /readyz (controller: + API)
    heartbeat_interval_ms: DurationMs = 1_000
    session_timeout_ms: DurationMs = 10_000
    shutdown_timeout_ms: DurationMs = 20_000  # SIGTERM: graceful stop this long at most (WAL keeps the rest)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] | None = None  # json: one object per line; unset: AUTOMQ_LOG_FORMAT, else text
    gil_switch_interval_us: Micros = 500  # a busy thread keeps the GIL this long before a waiting one (Python: 5000)
    wal: WalConfig = WalConfig()
    storage: StorageConfig = StorageConfig()
    kafka: KafkaConfig = KafkaConfig()
    controller: ControllerConfig = ControllerConfig()
    tls: TlsConfig = TlsConfig()  # TLS of SSL/SASL_SSL listeners and the controller API (section below)
    security: SecurityConfig = SecurityConfig()  # SASL and controller API credentials (section below)

    @model_validator(mode="after")
    def _check_urls(self) -> NodeConfig:
        if not re.match(r"^(s3|file)://", self.object_store_url):
            raise ValueError(f"object_store_url must start with s3:// or file://, got {self.object_store_url!r}")
        return self

    @model_validator(mode="after")
    def _check_security(self) -> NodeConfig:
        tls_users = [f"listeners[{lst.name}]" for lst in self.listeners if lst.security_protocol.endswith("SSL")]
        if self.security.controller_tls:
            tls_users.append("security.controller_tls")
        elif self.security.controller_plain_http:
            raise ValueError(
                "security.controller_plain_http only applies with security.controller_tls "
                "(without it the controller API is plain http anyway)"
            )
        if tls_users and not (self.tls.cert_file and self.tls.key_file):
            raise ValueError(f"tls.cert_file and tls.key_file are required by {', '.join(tls_users)}")
        if self.tls.client_auth != "none" and tls_users and not self.tls.ca_file:
            raise ValueError(f"tls.client_auth={self.tls.client_auth} needs tls.ca_file to verify client certificates")
        for lst in self.listeners:
            if lst.ssl_client_auth is not None and not lst.security_protocol.endswith("SSL"):
                raise ValueError(
                    f"listeners[{lst.name}].ssl_client_auth applies to SSL and SASL_SSL listeners only "
                    f"(this one is {lst.security_protocol})"
                )
            if lst.ssl_client_auth not in (None, "none") and not self.tls.ca_file:
                raise ValueError(
                    f"listeners[{lst.name}].ssl_client_auth={lst.ssl_client_auth} needs tls.ca_file "
                    "to verify client certificates"
                )
        sasl = any(lst.security_protocol.startswith("SASL") for lst in self.listeners)
        security = self.security
        if (
            sasl
            and "OAUTHBEARER" in security.sasl_enabled_mechanisms
            and not security.sasl_oauthbearer_jwks_file
            and not security.sasl_oauthbearer_allow_unsecured
        ):
            raise ValueError(
                "security.sasl_enabled_mechanisms has OAUTHBEARER but no token can pass: set "
                "security.sasl_oauthbearer_jwks_file (or sasl_oauthbearer_allow_unsecured for development)"
            )
        inter = self.kafka.inter_broker_listener_name
        if inter is not None:
            chosen = next((lst for lst in self.listeners if lst.name == inter), None)
            if chosen is None and self.listeners:
                raise ValueError(f"kafka.inter_broker_listener_name {inter!r} is not one of the listeners")
            if chosen is not None and chosen.security_protocol.startswith("SASL"):
                if not security.sasl_inter_broker_jaas_config_file:
                    raise ValueError(
                        f"kafka.inter_broker_listener_name {inter!r} is a {chosen.security_protocol} listener: set "
                        "security.sasl_inter_broker_jaas_config_file to the broker's own credentials"
                    )
                mechanism = security.sasl_mechanism_inter_broker_protocol
                if mechanism is not None and mechanism not in security.sasl_enabled_mechanisms:
                    raise ValueError(
                        f"security.sasl_mechanism_inter_broker_protocol {mechanism} must be one of "
                        f"security.sasl_enabled_mechanisms {security.sasl_enabled_mechanisms}"
                    )
        names = [lst.name for lst in self.listeners]
        if len(set(names)) != len(names):
            raise ValueError(f"listeners: names must be distinct, got {names}")
        return self

    def data_path(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else Path(self.data_dir) / p


class ConfigError(Exception):
    """Bad configuration. The message names the file, the key and the reason."""


WAL_RECORD_HEADER_BYTES = 64  # what the volume WAL adds to each batch (storage/wal/volume.py)


def check_broker_config(config: NodeConfig) -> None:
    """Rules across keys that only a broker needs; ConfigError naming the keys."""
    if config.wal.kind == "volume":
        # the ring takes a record only if it fits in half of it (so the writer never waits on
        # a trim that cannot come); a largest allowed batch must always fit
        needed = 2 * (config.kafka.message_max_bytes + WAL_RECORD_HEADER_BYTES)
        if config.wal.capacity < needed:
            raise ConfigError(
                f"wal.capacity ({config.wal.capacity} bytes) is too small for kafka.message_max_bytes "
                f"({config.kafka.message_max_bytes} bytes): a volume WAL must hold two batches of "
                f"message_max_bytes plus their {WAL_RECORD_HEADER_BYTES}-byte headers, at least {needed} bytes; "
                "raise wal.capacity or lower kafka.message_max_bytes"
            )


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"invalid configuration in {source}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> NodeConfig:
    """Read and validate a YAML config file; raise ConfigError naming every bad key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(raw).__name__}")
    raw.update(overrides or {})
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], source: str = "<config>") -> NodeConfig:
    try:
        return NodeConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from None


def dump_config(config: NodeConfig) -> str:
    """YAML that load_config reads back to an equal NodeConfig."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
