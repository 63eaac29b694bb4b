"""A broker loads the kio schema modules of every version it serves once it serves, on a
worker thread, instead of on the event loop at each API version's first request (issue 14)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from automq.broker.kafka.codec.preload import preload_order, preload_schemas

_PROBE = """
import json, sys
from automq.broker import cli
cli._import_kio_without_hypothesis()
from kio.schema.index import api_key_map, schema_name_map
from automq.broker.kafka.handlers.registry import served_ranges
from automq.broker.kafka.codec.preload import preload_schemas

served = served_ranges()
def modules():
    out = []
    for key, (low, high) in served.items():
        for version in range(low, high + 1):
            for path in schema_name_map[api_key_map[key]][version].values():  # 'kio.schema.x.vN.request:Cls'
                out.append(path.split(":", 1)[0])
    return out
before = [m for m in modules() if m in sys.modules]
loaded = preload_schemas(served)
print(json.dumps({
    "pairs": sum(high - low + 1 for low, high in served.values()),
    "loaded": loaded,
    "before": len(before),
    "missing_after": [m for m in modules() if m not in sys.modules],
}))
"""


def test_every_served_version_is_loaded_by_the_preload():
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["pairs"] > 200
    assert report["loaded"] == report["pairs"]
    assert report["before"] < report["pairs"]  # most were not loaded by importing the broker
    assert report["missing_after"] == []


def test_newest_versions_come_first():
    order = preload_order({0: (3, 13), 18: (0, 4), 75: (0, 0)})
    assert order[:3] == [(0, 13), (18, 4), (75, 0)]
    assert order[3:5] == [(0, 12), (18, 3)]
    assert len(order) == 11 + 5 + 1 and len(set(order)) == len(order)


def test_a_stopping_broker_stops_the_preload():
    stop = threading.Event()
    stop.set()
    assert preload_schemas({0: (3, 13)}, stop) == 0


def test_a_version_that_fails_to_load_is_skipped_and_logged(caplog):
    # api key 0 has no version 99 in kio: the request that asked for it would fail the same way
    assert preload_schemas({0: (98, 99), 18: (4, 4)}) == 1
    assert "api key 0 version 98" in caplog.text
