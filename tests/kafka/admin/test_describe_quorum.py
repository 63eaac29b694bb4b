"""DescribeQuorum with an active controller and a standby: both are voters, the active one leads
under its term, and kafka-python's describe_metadata_quorum reads it through a broker."""

from __future__ import annotations

import asyncio

from automq.broker.config import parse_config


async def test_quorum_of_an_active_controller_and_a_standby(tmp_path):
    from kafka.admin import KafkaAdminClient

    from automq.broker.controller.process import ControllerService
    from automq.broker.kafka.process import BrokerService

    objects = f"file://{tmp_path}/objects"
    controllers = []
    for node in (0, 1):
        svc = ControllerService(
            parse_config(
                {
                    "node_id": node,
                    "data_dir": str(tmp_path / f"c{node}"),
                    "object_store_url": objects,
                    "http_host": "127.0.0.1",
                    "http_port": 0,
                }
            )
        )
        await svc.start()
        controllers.append(svc)
        if node == 0:
            await svc.controller.wait_leader(20)
    broker = BrokerService(
        parse_config(
            {
                "node_id": 1,
                "data_dir": str(tmp_path / "b1"),
                "object_store_url": objects,
                "controller_urls": [c.url for c in controllers],
                "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
                "http_host": "127.0.0.1",
                "http_port": 0,
                "heartbeat_interval_ms": 200,
                "wal": {"capacity": "16MiB"},
            }
        )
    )
    await asyncio.wait_for(broker.start(), 60)
    try:

        def describe():
            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=20_000)
            try:
                return admin.describe_metadata_quorum()
            finally:
                admin.close()

        quorum = await asyncio.to_thread(describe)
        (partition,) = quorum["topics"][0]["partitions"]
        assert partition["error"] is None
        active = controllers[0].controller
        assert partition["leader_id"] == 0 and partition["leader_epoch"] == active.state.term
        voters = {v["replica_id"]: v for v in partition["current_voters"]}
        assert sorted(voters) == [0, 1]
        assert voters[0]["log_end_offset"] == partition["high_watermark"] >= 0
        assert voters[1]["log_end_offset"] <= partition["high_watermark"]  # the standby tails the log
        assert [o["replica_id"] for o in partition["observers"]] == [1]
        assert sorted(n["node_id"] for n in quorum["nodes"]) == [0, 1]
    finally:
        await asyncio.wait_for(broker.stop(timeout=5), 60)
        for svc in reversed(controllers):
            await asyncio.wait_for(svc.stop(), 30)
