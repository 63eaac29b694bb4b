"""docs/configuration.md is generated from the config model: it must list every key, with a
meaning, and be up to date (regenerate with `python docs/generate_configuration.py`)."""

import importlib.util
from pathlib import Path

from automq.broker.topic_configs import TOPIC_CONFIGS

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("generate_configuration", ROOT / "docs" / "generate_configuration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_node_config_key_has_a_meaning_and_is_documented():
    gen = _generator()
    doc = (ROOT / "docs" / "configuration.md").read_text()
    keys = gen.all_keys()
    assert (
        "node_id" in keys and "wal.capacity" in keys and "kafka.num_partitions" in keys and "listeners[].port" in keys
    )
    for _, _, model, prefix in gen.sections():
        for key, _type, _default, meaning in gen.model_rows(model, prefix):
            assert meaning.strip(" `:"), f"{key} has no meaning: add a comment on its line in broker/config.py"
            assert f"| `{key}` |" in doc, f"{key} missing from docs/configuration.md"


def test_every_topic_config_is_documented():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for name in TOPIC_CONFIGS:
        assert f"| `{name}` |" in doc


def test_doc_is_regenerated():
    gen = _generator()
    assert (ROOT / "docs" / "configuration.md").read_text() == gen.render(), (
        "run: python docs/generate_configuration.py"
    )


def test_every_s3_url_parameter_has_a_meaning_and_is_documented():
    from automq.broker.objectstore.s3 import _INT_PARAMS

    gen = _generator()
    doc = (ROOT / "docs" / "configuration.md").read_text()
    rows = gen.s3_rows()
    assert {name for name, *_ in rows} >= {"endpoint", "region", "path_style", *_INT_PARAMS}
    for name, _type, _default, meaning in rows:
        assert meaning, f"S3 URL parameter {name} has no meaning: comment its line in S3Settings"
        assert f"| `{name}` |" in doc
