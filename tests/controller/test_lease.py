"""Kubernetes Lease leadership against the kmock API emulator (no real cluster here).

kmock does not emulate resourceVersion conflicts, so what is tested is the Lease protocol
(acquire, renew, expiry by observation, release) and that the controller leads only while it
holds the Lease; two writers racing is covered by the metadata log tests, which is what makes
the Lease safe to lose."""

from __future__ import annotations

import asyncio
import time

import kmock
import pytest
import yaml

from automq.broker.controller.lease import KubernetesLease
from automq.broker.controller.process import ControllerService


@pytest.fixture
async def coordination_api(tmp_path):
    from kubernetes import client, config

    async with kmock.KubernetesEmulator() as k, kmock.Server(k) as srv:
        k.resources.load_bundled()
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": str(srv.url)}}],
            "users": [{"name": "u", "user": {"token": "test"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        api_client = config.new_client_from_config(config_file=str(path))
        yield client.CoordinationV1Api(api_client)
        api_client.close()


async def _eventually(fn, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not await fn():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.05)


async def test_lease_acquire_renew_expire_release(coordination_api) -> None:
    a = KubernetesLease(coordination_api, "ctl", "ns", "a", 1)
    b = KubernetesLease(coordination_api, "ctl", "ns", "b", 1)
    assert await a.try_acquire()  # creates it
    assert not await b.try_acquire()
    for _ in range(3):  # a keeps renewing: b never gets it, however long it waits
        await asyncio.sleep(0.4)
        assert await a.try_acquire()
        assert not await b.try_acquire()
    # a stops renewing: b takes it once it saw no renewal for the lease duration
    await _eventually(b.try_acquire)
    lease = await asyncio.to_thread(coordination_api.read_namespaced_lease, name="ctl", namespace="ns")
    assert lease.spec.holder_identity == "b" and lease.spec.lease_transitions == 1
    assert not await a.try_acquire()
    await b.release()
    assert await a.try_acquire()  # released: free at once


async def test_controllers_lead_only_while_holding_the_lease(coordination_api, file_url, make_config) -> None:
    services = []
    for node_id in (0, 1):
        svc = ControllerService(make_config(file_url, node_id=node_id))
        svc.controller.lease = KubernetesLease(coordination_api, "automq-controller", "ns", f"c{node_id}", 1)
        services.append(svc)
    for svc in services:
        await svc.start()
    try:

        async def one_leader() -> bool:
            return sum(s.controller.is_leader for s in services) == 1

        await _eventually(one_leader)
        leader = next(s for s in services if s.controller.is_leader)
        other = next(s for s in services if s is not leader)

        async def holder() -> str:
            lease = await asyncio.to_thread(
                coordination_api.read_namespaced_lease, name="automq-controller", namespace="ns"
            )
            return lease.spec.holder_identity

        assert await holder() == f"c{leader.config.node_id}"
        await leader.stop(resign=False)  # crash: no release, the Lease must expire

        async def other_leads() -> bool:
            return other.controller.is_leader

        await _eventually(other_leads)
        assert await holder() == f"c{other.config.node_id}"
    finally:
        for svc in services:
            await svc.stop()
