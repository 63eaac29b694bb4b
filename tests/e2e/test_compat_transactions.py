"""Until transactions exist, a transactional producer must fail at init_transactions() with
an error the clients treat as fatal, not wait out its timeout on a retriable
COORDINATOR_NOT_AVAILABLE: FindCoordinator for a transactional id answers
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (what Kafka answers a client not allowed to use one)."""

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer


def test_confluent_init_transactions_fails_fatally(cluster, e2e):
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": e2e.topic_name("txn")})
    with pytest.raises(KafkaException) as info:
        producer.init_transactions(60)
    err = info.value.args[0]
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, err
    assert err.fatal() and not err.retriable()
    assert "transactions are not supported" in err.str()


def test_kafka_python_init_transactions_fails(cluster, e2e):
    from kafka import KafkaProducer
    from kafka.errors import TransactionalIdAuthorizationFailedError

    producer = KafkaProducer(
        bootstrap_servers=cluster.bootstrap, transactional_id=e2e.topic_name("txn"), max_block_ms=60_000
    )
    try:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
    finally:
        producer.close(timeout=5)


def test_aiokafka_transactional_start_fails(cluster, e2e):
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    async def start() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=e2e.topic_name("txn"))
        try:
            with pytest.raises(TransactionalIdAuthorizationFailed):
                await asyncio.wait_for(producer.start(), 60)
        finally:
            await producer.stop()

    asyncio.run(start())
