"""What a broker or controller process imports before it serves (issue 14 goal 6: ready
within a second). Test libraries must never load at run time: kio registers Hypothesis
strategies whenever Hypothesis is importable, and that alone pulled in hypothesis, unittest
and attrs on every start (about half a second on a 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
from automq.broker import cli
cli._import_kio_without_hypothesis()
import automq.broker.kafka.process, automq.broker.controller.process, automq.broker.config
import kio.static._phantom as phantom
print(json.dumps({"modules": sorted(sys.modules), "kio_sees_hypothesis": phantom.hypothesis is not None}))
"""


def test_server_processes_import_no_test_library():
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    loaded = {m.split(".")[0] for m in report["modules"]}
    assert not report["kio_sees_hypothesis"]
    assert not loaded & {"hypothesis", "pytest", "unittest", "_pytest"}, sorted(
        loaded & {"hypothesis", "pytest", "unittest"}
    )
    # only OAUTHBEARER and mTLS listeners need it: imported when they verify something
    assert "cryptography" not in loaded


def test_hypothesis_still_works_after_the_entry_point_hid_it_from_kio():
    probe = (
        "from automq.broker import cli; cli._import_kio_without_hypothesis();"
        "import hypothesis.strategies as st; print(st.integers(0, 3).example() in range(4))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.strip().endswith("True")
