"""IncrementalAlterConfigs as Kafka 4.x answers it: SUBTRACT of the last cleanup policy leaves
an empty list, accepted (no cleanup), with a real admin client."""

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource


def test_subtract_last_cleanup_policy_is_accepted(cluster, e2e):
    topic = e2e.topic_name("subtract")
    e2e.create_topic(cluster.bootstrap, topic, configs={"cleanup.policy": "delete"})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    described = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([described])[described].result(timeout=30)
    assert entries["cleanup.policy"].value == ""
    # and a policy can be appended to the empty list again
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    entries = admin.describe_configs([described])[described].result(timeout=30)
    assert entries["cleanup.policy"].value == "compact"
