"""Hostile arguments to `automq rebalance` and its address parsing: clear errors, exit 2."""

import subprocess
import sys

import pytest

from automq.broker.balancer.cli import parse_metrics_urls
from automq.broker.balancer.kafka_admin import parse_bootstrap


def test_bootstrap_parsing():
    assert parse_bootstrap("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap("[::1]:9092") == [("::1", 9092)]
    for bad in ("", "host", "host:", ":9092", "h:0", "h:99999", "h:x"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


def test_metrics_url_parsing():
    assert parse_metrics_urls(["2=http://h:9094/metrics"]) == {2: "http://h:9094/metrics"}
    for bad in ("2", "x=http://h", "2=ftp://h", "=http://h"):
        with pytest.raises(ValueError, match="BROKER_ID=http"):
            parse_metrics_urls([bad])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bootstrap", "127.0.0.1:1", "--tolerance", "0"], "tolerance"),
        (["--bootstrap", "127.0.0.1:1", "--output", "yaml"], "--output"),
        (["--bootstrap", "127.0.0.1:1"], "cannot read cluster metadata"),
    ],
)
def test_bad_arguments_and_unreachable_cluster_exit_2_with_a_message(args, message):
    out = subprocess.run(
        [sys.executable, "-m", "automq.broker.cli", "rebalance", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out
    assert message in out.stdout + out.stderr
