"""`automq spark ...` from the command line: bad options fail fast (exit 2, a message naming
the option) without starting Spark, and a real `ingest --data-dir` run commits a table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from automq.broker.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ingest", "--object-store", "file:///tmp/x", "--catalog", "bogus"], "catalog 'bogus'"),
        (["ingest", "--object-store", "file:///tmp/x"], "pass --catalog"),
        (["ingest"], "no object store"),
        (["compact", "--object-store", "file:///tmp/x"], "pass --controller"),
        (
            ["compact", "--controller", "http://127.0.0.1:1", "--object-store", "file:///x", "--min-age", "soon"],
            "--min-age",
        ),
        (
            ["compact", "--controller", "http://127.0.0.1:1", "--object-store", "file:///x", "--target-size", "big"],
            "--target-size",
        ),
    ],
)
def test_bad_options_exit_2_naming_the_problem(args, message, tmp_path):
    result = CliRunner().invoke(app, ["spark", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_data_dir_without_a_cluster_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["spark", "ingest", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not an `automq local up` data dir" in result.output


@pytest.mark.slow
@pytest.mark.spark
def test_ingest_command_against_a_local_cluster(spark_cluster, sh, tmp_path):
    topic = sh.topic_name("cli")
    sh.create_topic(spark_cluster.bootstrap, topic)
    sh.produce_confluent(spark_cluster.bootstrap, topic, [(None, b"x%d" % i, [], 0) for i in range(25)])
    spark_cluster.wait_uploaded(topic, 25)
    catalog = f"sqlite:///{tmp_path}/catalog.db"
    cmd = [
        sys.executable,
        "-m",
        "automq.broker.cli",
        "spark",
        "ingest",
        "--data-dir",
        str(spark_cluster.data_dir),
        "--catalog",
        catalog,
        "--topic",
        topic,
        "--only",
        "--master",
        "local[1]",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert (line["status"], line["records"], line["offsets"]) == ("committed", 25, {"0": 25})
    from automq.spark.iceberg import open_catalog

    assert open_catalog(catalog).load_table(line["table"]).scan().to_arrow().num_rows == 25
