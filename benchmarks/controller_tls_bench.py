"""What https (and the token) cost on the controller API: call latency and throughput of the same
controller calls over plain http (the baseline) and over https with a bearer token, measured in
the same run, rounds interleaved so both see the same load. Prints numbers; asserts nothing.

    python benchmarks/controller_tls_bench.py            # 2000 calls per round, 3 rounds
    python benchmarks/controller_tls_bench.py -n 500 --rounds 5

Per scheme (http; https; https with the token), against an in-process controller on a file:// store:
1. heartbeat: one registered broker heartbeats back to back over one kept-alive connection
   (what every broker does every `heartbeat_interval_ms`): p50 / p99 latency, calls/s;
2. new connection: a fresh client per call (connect, TLS handshake, one call), what a CLI or a
   restarted broker pays once: p50 / p99.
Certificates are made like the operator's (ECDSA P-256 from a cluster CA).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import ssl
import statistics
import tempfile
import time
from pathlib import Path

from automq.broker.config import parse_config
from automq.broker.controller.client import ControllerClient
from automq.broker.controller.process import ControllerService
from automq.broker.controller.protocol import Endpoint
from automq.broker.security.controller_auth import ControllerClientAuth, TokenFile
from automq.operator import certificates


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _heartbeats(url: str, auth: ControllerClientAuth, n: int) -> tuple[list[float], float]:
    async with ControllerClient([url], auth=auth) as client:
        epoch = await client.register_broker(1, [Endpoint("PLAINTEXT", "127.0.0.1", 9092)], None)
        await client.heartbeat(1, epoch)
        latencies = []
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            await client.heartbeat(1, epoch)
            latencies.append((time.perf_counter() - t) * 1000)
        return latencies, n / (time.perf_counter() - start)


async def _fresh_connections(url: str, auth: ControllerClientAuth, n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        t = time.perf_counter()
        async with ControllerClient([url], auth=auth) as client:
            await client.broker_sessions()
        latencies.append((time.perf_counter() - t) * 1000)
    return latencies


async def main(n: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="controller-tls-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        now = dt.datetime.now(dt.UTC)
        ca = certificates.new_ca("bench-cluster-ca", now, 2)
        leaf = certificates.issue(
            ca, certificates.node_subject("bench-controller"), now, 1, dns_names=["localhost", "127.0.0.1"], server=True
        )
        (tmp / "tls.crt").write_bytes(leaf.cert_pem)
        (tmp / "tls.key").write_bytes(leaf.key_pem)
        (tmp / "ca.crt").write_bytes(ca.cert_pem)
        (tmp / "token").write_text("bench-token-0123456789\n")
        base = {"node_id": 0, "http_host": "127.0.0.1", "http_port": 0}
        plain = parse_config({**base, "data_dir": str(tmp / "p"), "object_store_url": f"file://{tmp}/p-objects"})
        secure = parse_config(
            {
                **base,
                "data_dir": str(tmp / "s"),
                "object_store_url": f"file://{tmp}/s-objects",
                "tls": {"cert_file": str(tmp / "tls.crt"), "key_file": str(tmp / "tls.key")},
                "security": {"controller_tls": True, "controller_token_file": str(tmp / "token")},
            }
        )
        tls_only = parse_config(
            {
                **base,
                "data_dir": str(tmp / "t"),
                "object_store_url": f"file://{tmp}/t-objects",
                "tls": {"cert_file": str(tmp / "tls.crt"), "key_file": str(tmp / "tls.key")},
                "security": {"controller_tls": True},
            }
        )
        auths = {
            "http": ControllerClientAuth(),
            "https": ControllerClientAuth(None, ssl.create_default_context(cafile=str(tmp / "ca.crt"))),
            "https+token": ControllerClientAuth(
                TokenFile(str(tmp / "token")), ssl.create_default_context(cafile=str(tmp / "ca.crt"))
            ),
        }
        async with (
            ControllerService(plain) as http,
            ControllerService(tls_only) as https,
            ControllerService(secure) as https_token,
        ):
            urls = {"http": http.url, "https": https.url, "https+token": https_token.url}
            beats: dict[str, list[float]] = {k: [] for k in urls}
            rates: dict[str, list[float]] = {k: [] for k in urls}
            fresh: dict[str, list[float]] = {k: [] for k in urls}
            for _ in range(rounds):
                for scheme, url in urls.items():  # interleaved: both see the same machine load
                    lat, rate = await _heartbeats(url, auths[scheme], n)
                    beats[scheme] += lat
                    rates[scheme].append(rate)
                    fresh[scheme] += await _fresh_connections(url, auths[scheme], max(20, n // 20))
        print(f"controller API, {rounds} rounds x {n} heartbeats (busy shared 2-core machine: compare within this run)")
        for scheme in urls:
            print(
                f"  {scheme:12s} heartbeat p50 {_pct(beats[scheme], 0.5):6.2f} ms  p99 {_pct(beats[scheme], 0.99):6.2f} ms"
                f"  {statistics.median(rates[scheme]):7.0f} calls/s   new connection + call"
                f" p50 {_pct(fresh[scheme], 0.5):6.2f} ms  p99 {_pct(fresh[scheme], 0.99):6.2f} ms"
            )
        base_rate, tls_rate = statistics.median(rates["http"]), statistics.median(rates["https+token"])
        print(f"  https+token throughput vs http: {100 * (tls_rate / base_rate - 1):+.1f} %")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="heartbeats per round and scheme")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.rounds))
