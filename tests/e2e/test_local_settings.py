"""Settings `automq local up --set` passes reach the brokers (seen by a real admin client),
and Kafka's default for group.initial.rebalance.delay.ms (3000) applies where none is set."""

from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from automq.broker.config import NodeConfig
from automq.broker.topic_configs import _broker_entries


def test_set_value_is_what_every_broker_reports(cluster):
    # the shared cluster starts with --set group.initial.rebalance.delay.ms=0 (see conftest)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for broker in ("1", "2"):
        res = ConfigResource(ConfigResource.Type.BROKER, broker)
        entries = admin.describe_configs([res])[res].result(timeout=30)
        entry = entries["group.initial.rebalance.delay.ms"]
        assert entry.value == "0"
        assert entry.source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert "group.initial.rebalance.delay.ms = 0 ms" in "\n".join(cluster.output)


def test_kafka_default_initial_rebalance_delay():
    entries = {name: (value, source) for name, value, source, _, _ in _broker_entries(NodeConfig(node_id=1))}
    assert entries["group.initial.rebalance.delay.ms"][0] == "3000"
