"""Switching a running cluster's controller API from http to https and back, with no
maintenance window: the real kopf operator on kmock, the kubelet harness running real
controller and broker processes (two of each, so the controller leader moves and brokers drain
to each other), and a real idempotent producer (confluent-kafka, acks=all) writing the whole
time. Each direction is three rolling updates (automq.operator.controller_scheme); afterwards
every acknowledged record is read back exactly once, and no node ever logged a call in a scheme
its controller did not serve. The phase machine and what each phase renders are unit-tested in
tests/operator/test_controller_scheme.py, the dual-protocol port in
tests/security/test_controller_dual_scheme.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubelet_harness import KubeletHarness, s3_cluster_spec
from sequenced_load import SequencedProducer, check_exactly_once, create_topic

from automq.operator.spec import CONTROLLER_API_STATE_ANNOTATION

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(600)]

# What a node logs when it calls a controller in a scheme that controller does not serve.
WRONG_SCHEME = (
    "serves its API over https only",
    "WRONG_VERSION_NUMBER",
    "an https:// URL to a controller serving plain http",
    "ControllerAuthenticationError",
)


def _state(k8s: KubeletHarness) -> str | None:
    obj = k8s.get("AutoMQCluster", "demo") or {}
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(CONTROLLER_API_STATE_ANNOTATION)


def _switch(k8s: KubeletHarness, load: SequencedProducer, tls: bool) -> list[tuple[str, int]]:
    """Flip controllerApi.tls and follow the switch to its end: the states seen, each with the
    producer's acknowledged count when it was first seen."""
    seen: list[tuple[str, int]] = [(_state(k8s) or "", load.acked_count())]
    k8s.patch_spec("demo", {"security": {"controllerApi": {"authentication": "none", "tls": tls}}})
    end = "https/https" if tls else "http/http"

    def done() -> bool:
        state = _state(k8s) or ""
        if state != seen[-1][0]:
            seen.append((state, load.acked_count()))
        if state != end:
            return False
        status = (k8s.get("AutoMQCluster", "demo") or {}).get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        return ready and status.get("controllerApi") == end.split("/")[0]

    k8s.wait_for(f"controller API switched to {end}", done, timeout=250)
    return seen


def test_http_to_https_and_back_while_producing(tmp_path: Path, s3_url: str) -> None:
    spec = s3_cluster_spec(s3_url, brokers=2, controller={"replicas": 2})
    with KubeletHarness(tmp_path) as k8s:
        k8s.create_cluster("demo", spec)
        k8s.wait_ready("demo", brokers=2)
        assert _state(k8s) == "http/http"
        bootstrap = k8s.bootstrap("demo")
        topic = f"scheme-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, 4)
        load = SequencedProducer(bootstrap, topic, partitions=4, rate=150, value_size=100).start()
        k8s.wait_for("first acknowledgements", lambda: load.acked_count() > 0, timeout=60)

        up = _switch(k8s, load, tls=True)
        assert [s for s, _ in up] == ["http/http", "both/http", "both/https", "https/https"], up
        broker_yaml = k8s.get("ConfigMap", "demo-config")["data"]["broker.yaml"]
        controller_yaml = k8s.get("ConfigMap", "demo-config")["data"]["controller.yaml"]
        assert "https://" in broker_yaml and "controller_plain_http: true" not in controller_yaml
        assert all(u.startswith("https://") for u in k8s.controller_urls("demo"))

        down = _switch(k8s, load, tls=False)
        assert [s for s, _ in down] == ["https/https", "both/https", "both/http", "http/http"], down
        assert "https://" not in k8s.get("ConfigMap", "demo-config")["data"]["broker.yaml"]

        acked_during = [n for _, n in up + down]
        load.stop()
        # the producer kept being acknowledged through the rolls (not only before and after)
        assert acked_during == sorted(acked_during) and acked_during[-1] > acked_during[0], acked_during
        assert load.acked_count() > acked_during[-1]
        check_exactly_once(bootstrap, topic, [load])

        # each direction restarted every controller twice and every broker once
        created = [pod for _, _, pod in k8s.history(what="created")]
        for pod, times in (
            ("demo-controller-0", 5),
            ("demo-controller-1", 5),
            ("demo-broker-0", 3),
            ("demo-broker-1", 3),
        ):
            assert created.count(pod) >= times, (pod, created)
        logs = {path.name: path.read_text(errors="replace") for path in (tmp_path / "logs").glob("*.log")}
        assert logs, "no pod logs to check"
        for name, text in logs.items():
            for marker in WRONG_SCHEME:
                assert marker not in text, f"{name} called a controller in a scheme it does not serve: {marker}"
