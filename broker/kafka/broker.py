"""The Broker object: everything a request handler may need, wired together in one place.

Handlers reach the rest of the system through `ctx.broker`:

- `config`, `node_id`, `node_epoch`
- `cluster`: the controller (ClusterClient), `storage`: the stream storage engine (StreamClient)
- `metadata`: latest MetadataImage, `partitions`: PartitionManager (led partitions)
- `groups`: GroupCoordinator (`await start()` / `await close()`), `transactions`:
  TransactionCoordinator (the same), `producer_ids`: ProducerIdAllocator
- `registry`: the prometheus CollectorRegistry, `metrics`: KafkaMetrics
- `authorizer`: the ACL Authorizer, or None when authorization is off
- `quotas`: ClientQuotas (client quotas from the metadata image; `active` once one exists)
- `share_partitions`: SharePartitionManager (KIP-932 share-partitions led here), `share_sessions`
"""

from __future__ import annotations

import asyncio
import logging
from base64 import b64decode

from prometheus_client import CollectorRegistry

from automq.broker.config import NodeConfig
from automq.broker.controller.protocol import ClusterClient, Endpoint, MetadataImage, TopicExistsError, TopicInfo
from automq.broker.kafka.authorizer import Authorizer
from automq.broker.kafka.groups import GroupCoordinator
from automq.broker.kafka.metrics import KafkaMetrics
from automq.broker.kafka.partition_manager import PartitionManager
from automq.broker.kafka.producers import ProducerIdAllocator
from automq.broker.kafka.quotas import ClientQuotas
from automq.broker.kafka.share.manager import SharePartitionManager
from automq.broker.kafka.share.sessions import ShareSessionCache
from automq.broker.kafka.transactions.coordinator import TXN_TOPIC, TransactionCoordinator
from automq.broker.kafka.transactions.verification import TxnVerifier
from automq.broker.security.client import inter_broker_listener
from automq.broker.security.sasl import SaslMechanisms
from automq.broker.security.scram import ScramCredential
from automq.broker.security.tokens import DelegationTokens
from automq.broker.storage.api import StreamClient

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_TOPIC})


def advertised_endpoints(config: NodeConfig, bound_ports: dict[str, int] | None = None) -> list[Endpoint]:
    """What clients are told to connect to, per listener (bound_ports: actual ports when 0 was asked)."""
    endpoints = []
    for listener in config.listeners:
        host = listener.advertised_host or (
            listener.host if listener.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        )
        port = listener.advertised_port or (bound_ports or {}).get(listener.name) or listener.port
        endpoints.append(Endpoint(listener.name, host, port))
    return endpoints


class Broker:
    def __init__(
        self,
        config: NodeConfig,
        *,
        node_epoch: int,
        cluster: ClusterClient,
        storage: StreamClient,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.node_epoch = node_epoch
        self.cluster = cluster
        self.storage = storage
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = KafkaMetrics(self.registry)
        self.metrics_url: str | None = None  # http://host:port/metrics once the process knows it
        self.metadata: MetadataImage | None = None
        # None without `kafka.authorizer_class_name`: handlers then skip every check
        self.authorizer = Authorizer(config.kafka, self.registry) if config.kafka.authorizer_class_name else None
        self.quotas = ClientQuotas(config.kafka, self.registry)  # inactive until a client quota exists
        self.partitions = PartitionManager(self)
        self.producer_ids = ProducerIdAllocator(node_id=self.node_id, node_epoch=node_epoch)
        self.groups = GroupCoordinator(self)
        self.transactions = TransactionCoordinator(self)
        self.txn_verifier = TxnVerifier(self)  # KIP-890: transactional produce checked with the coordinator
        from automq.broker.kafka.fetch_sessions import FetchSessionCache

        self.fetch_sessions = FetchSessionCache(config.kafka.fetch_session_cache_slots, self.metrics)
        # KIP-932: share-partitions led here (their durable state lives in the object store)
        self.share_partitions = SharePartitionManager(self)
        self.share_sessions = ShareSessionCache(config.kafka.group_share_max_share_sessions)
        self._creating: dict[str, asyncio.Task[TopicInfo | None]] = {}
        self._scram: dict[tuple[str, str], ScramCredential] = {}  # from the metadata image
        self.tokens = DelegationTokens(config.security)  # delegation tokens of the metadata image
        # SASL mechanisms of the SASL_* listeners (None: no such listener)
        self.sasl: SaslMechanisms | None = None
        if any(lst.security_protocol.startswith("SASL") for lst in config.listeners):
            self.sasl = SaslMechanisms(config.security, self.scram_credential, self.tokens.scram_login)
        if config.listeners and inter_broker_listener(config) is None:
            log.warning(
                "every listener needs SASL and security.sasl_inter_broker_jaas_config_file is not set: transaction "
                "markers for partitions led by other brokers cannot be delivered; set it (and "
                "kafka.inter_broker_listener_name)"
            )

    # ---------------------------------------------------------------- lifecycle

    async def start(self, metadata_timeout: float = 30.0) -> None:
        """Follow metadata and wait for the first image, then start the group coordinator."""
        await self.partitions.start()
        image = await self.partitions.wait_for_image(lambda _: True, metadata_timeout)
        if image is None:
            raise RuntimeError(f"no metadata from the controller within {metadata_timeout:.0f}s")
        await self.groups.start()
        await self.transactions.start()

    async def close(self) -> None:
        try:
            await self.transactions.close()
            await self.txn_verifier.close()
        except Exception:
            log.exception("closing the transaction coordinator failed")
        try:
            await self.groups.close()
        except Exception:
            log.exception("closing the group coordinator failed")
        try:
            await self.share_partitions.close()
        except Exception:
            log.exception("writing share-partition state at shutdown failed")
        await self.partitions.close()

    def _on_metadata(self, image: MetadataImage) -> None:
        previous = self.metadata
        self.metadata = image
        if self.authorizer is not None:
            self.authorizer.update(image.acls)
        self.quotas.update(image.client_quotas)
        if previous is None or previous.delegation_tokens != image.delegation_tokens:
            self.tokens.update(image.delegation_tokens)
        if previous is None or previous.scram_credentials != image.scram_credentials:
            self._scram = {
                (c.user, c.mechanism): ScramCredential(
                    c.mechanism, b64decode(c.salt), c.iterations, b64decode(c.stored_key), b64decode(c.server_key)
                )
                for c in image.scram_credentials
            }
        if previous is not None:
            current = {t.name for t in image.topics}
            for t in previous.topics:
                if t.name not in current:
                    self.metrics.forget_topic(t.name)  # deleted: its per-topic series go

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """A user's SCRAM credential as of the latest metadata (AlterUserScramCredentials)."""
        return self._scram.get((user, mechanism))

    # ---------------------------------------------------------------- leaders (KIP-951)

    def leader_of(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(leader id, leader epoch) the metadata names for a partition, if it has one."""
        info = self.partitions.topic(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            return None
        p = info.partitions[partition]
        return (p.leader, p.leader_epoch) if p.leader >= 0 else None

    def endpoint_of(self, node_id: int, listener: str | None = None) -> tuple[str, int, str | None] | None:
        """(host, port, rack) clients of `listener` (default: the first) should use for a broker."""
        image = self.metadata
        if image is None:
            return None
        if listener is None:  # broker-to-broker (transaction markers)
            chosen = inter_broker_listener(self.config)
            listener = chosen.name if chosen is not None else None
        for b in image.brokers:
            if b.node_id == node_id and b.endpoints and b.state != "fenced":
                e = next((e for e in b.endpoints if e.listener == listener), None)
                return (e.host, e.port, b.rack) if e is not None else None
        return None

    # ---------------------------------------------------------------- topics

    async def ensure_topic(
        self, name: str, partitions: int | None = None, configs: dict[str, str] | None = None, wait: float = 5.0
    ) -> TopicInfo | None:
        """Create a topic through the controller unless it exists (auto-create, internal topics).

        Concurrent calls for one name share one creation. Returns the topic once the local
        metadata image knows it (or None if it did not arrive within `wait`)."""
        existing = self.partitions.topic(name)
        if existing is not None:
            return existing
        task = self._creating.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._create_topic(name, partitions, configs or {}, wait))
            self._creating[name] = task
            task.add_done_callback(lambda _t: self._creating.pop(name, None))
        return await asyncio.shield(task)

    async def _create_topic(
        self, name: str, partitions: int | None, configs: dict[str, str], wait: float
    ) -> TopicInfo | None:
        if partitions is None:
            if name == OFFSETS_TOPIC:
                partitions = self.config.kafka.offsets_topic_num_partitions
            elif name == TXN_TOPIC:
                partitions = self.config.kafka.transaction_state_log_num_partitions
            else:
                partitions = self.config.kafka.num_partitions
        try:
            await self.cluster.create_topic(name, partitions, configs)
            log.info("created topic %s with %d partitions", name, partitions)
        except TopicExistsError:
            pass
        image = await self.partitions.wait_for_image(lambda img: any(t.name == name for t in img.topics), wait)
        return self.partitions.topic(name) if image is not None else None
