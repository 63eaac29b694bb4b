"""Per-pod node config: the init step that turns the role's config template into this pod's file.

A StatefulSet's pods share one pod template, but each node needs its own `node_id`, advertised
host and rack. The ConfigMap holds one validated template per role (`broker.yaml`,
`controller.yaml`); the pod's init container runs

    python -m automq.operator.podconfig --template /etc/automq/broker.yaml --out /config/node.yaml

which fills in, from the environment the pod template sets:
    POD_NAME                 <cluster>-broker-3  -> node_id = AUTOMQ_NODE_ID_BASE + 3
    AUTOMQ_ROLE              broker | controller
    AUTOMQ_NODE_ID_BASE      0 for brokers, 1000 for controllers (ids never collide)
    AUTOMQ_ADVERTISED_HOST   the pod's stable DNS name (brokers: every listener advertises it;
                             controllers: controller.advertised_url = http(s)://<host>:<http_port>)
    AUTOMQ_RACK              the zone label the downward API exposes ('' when unknown)
    AUTOMQ_EXTERNAL_LISTENERS  {listener: {host: template with {ordinal} or "", port_base}} for
                             nodeport/loadbalancer listeners: they advertise this broker's own
                             Service (AUTOMQ_HOST_IP, the node's IP, when there is no template)
and validates the result with the same NodeConfig model the node loads, so a bad file fails here
with the key named. The main container then runs `automq broker --config /config/node.yaml`.

Kept free of kopf/kubernetes imports: it runs in every broker and controller pod.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml

from automq.broker.config import ConfigError, NodeConfig, dump_config, parse_config


def ordinal_of(pod_name: str) -> int:
    """The StatefulSet ordinal at the end of a pod name ('demo-broker-12' -> 12)."""
    head, _, tail = pod_name.rpartition("-")
    if not head or not tail.isdigit():
        raise ValueError(f"pod name {pod_name!r} does not end with a StatefulSet ordinal")
    return int(tail)


def _advertised(listener: dict, host: str, external: dict | None, ordinal: int, env: Mapping[str, str]) -> dict:
    """Internal listeners advertise the pod's DNS name; an external one the address of this
    broker's own Service: its host template (or the node's IP for a NodePort) and node port."""
    if external is None:
        return {**listener, "advertised_host": host} if host else dict(listener)
    template = external.get("host") or ""
    advertised_host = template.replace("{ordinal}", str(ordinal)) if template else env.get("AUTOMQ_HOST_IP", "")
    if not advertised_host:
        raise ConfigError(f"listener {listener.get('name')}: AUTOMQ_HOST_IP (status.hostIP) is not set")
    base = external.get("port_base")
    port = base + ordinal if base is not None else listener.get("port")
    return {**listener, "advertised_host": advertised_host, "advertised_port": port}


def render_pod_config(template: Mapping, env: Mapping[str, str]) -> NodeConfig:
    """This pod's NodeConfig from its role's template and the pod environment."""
    try:
        pod_name = env["POD_NAME"]
    except KeyError:
        raise ConfigError(
            "POD_NAME is not set: the pod template must pass metadata.name through the downward API"
        ) from None
    raw = dict(template)
    raw["node_id"] = int(env.get("AUTOMQ_NODE_ID_BASE", "0")) + ordinal_of(pod_name)
    rack = env.get("AUTOMQ_RACK", "")
    raw["rack"] = rack or None
    host = env.get("AUTOMQ_ADVERTISED_HOST", "")
    external = json.loads(env.get("AUTOMQ_EXTERNAL_LISTENERS") or "{}")
    if host or external:
        raw["listeners"] = [
            _advertised(listener, host, external.get(listener.get("name")), ordinal_of(pod_name), env)
            for listener in raw.get("listeners", [])
        ]
        if env.get("AUTOMQ_ROLE") == "controller":
            port = raw.get("http_port", NodeConfig.model_fields["http_port"].default)
            scheme = "https" if (raw.get("security") or {}).get("controller_tls") else "http"
            raw["controller"] = {**raw.get("controller", {}), "advertised_url": f"{scheme}://{host}:{port}"}
    return parse_config(raw, source=f"config template for {pod_name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        template = yaml.safe_load(args.template.read_text()) or {}
        config = render_pod_config(template, os.environ)
    except (OSError, ValueError, ConfigError, yaml.YAMLError) as exc:
        print(f"cannot render node config: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump_config(config))
    print(f"node_id={config.node_id} rack={config.rack} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
