"""Config: one model for every node; errors name the key."""

import pytest

from automq.broker.config import ConfigError, dump_config, load_config, parse_config


def test_sizes_and_durations_parse_with_units(tmp_path):
    f = tmp_path / "node.yaml"
    f.write_text(
        "node_id: 3\nwal: {kind: s3, s3_bulk_interval_ms: 250ms, s3_bulk_bytes: 8MiB}\nstorage: {upload_interval_ms: 1m}\n"
    )
    cfg = load_config(f)
    assert cfg.wal.s3_bulk_bytes == 8 << 20
    assert cfg.wal.s3_bulk_interval_ms == 250
    assert cfg.storage.upload_interval_ms == 60_000
    assert load_config_roundtrip(cfg, tmp_path) == cfg


def load_config_roundtrip(cfg, tmp_path):
    f = tmp_path / "again.yaml"
    f.write_text(dump_config(cfg))
    return load_config(f)


@pytest.mark.parametrize(
    "raw, key, reason",
    [
        ({}, "node_id", "Field required"),
        ({"node_id": 1, "wal": {"kind": "tape"}}, "wal.kind", "'volume' or 's3'"),
        ({"node_id": 1, "storage": {"log_cache_bytes": "lots"}}, "storage.log_cache_bytes", "expected a size"),
        ({"node_id": 1, "wal": {"capasity": 5}}, "wal.capasity", "unknown key"),
        ({"node_id": 1, "object_store_url": "ftp://x"}, "(top level)", "s3:// or file://"),
        ({"node_id": -1}, "node_id", "greater than or equal to 0"),
    ],
)
def test_bad_config_names_the_key(raw, key, reason):
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, source="node.yaml")
    message = str(exc.value)
    assert "node.yaml" in message and key in message and reason in message


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("node_id: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
