"""Engine setup shared by the storage tests and their child processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from automq.broker.config import NodeConfig
from automq.broker.objectstore import open_object_store
from automq.broker.storage.engine import StorageEngine
from automq.broker.storage.inprocess import InProcessMetadata


def node_config(data_dir: Path, store_url: str, **overrides: Any) -> NodeConfig:
    wal = {"kind": "volume", "path": "wal", "capacity": 4 << 20}
    storage = {
        "log_cache_bytes": 8 << 20,
        "block_cache_bytes": 4 << 20,
        "upload_block_bytes": 1 << 20,
        "upload_interval_ms": 200,
        "stream_split_bytes": 512 << 10,
        "object_block_bytes": 16 << 10,
        "read_ahead_initial_bytes": 32 << 10,
        "read_ahead_max_bytes": 256 << 10,
    }
    wal.update(overrides.pop("wal", {}))
    storage.update(overrides.pop("storage", {}))
    return NodeConfig(
        node_id=1, data_dir=str(data_dir), object_store_url=store_url, wal=wal, storage=storage, **overrides
    )


class EngineFactory:
    """Starts engines for one node on one WAL + object store, like restarts of a process."""

    def __init__(self, tmp_path: Path, store_url: str, **overrides: Any) -> None:
        self.config = node_config(tmp_path / "node", store_url, **overrides)
        self.store = open_object_store(store_url)
        self.metadata = InProcessMetadata(self.store)
        self.engines: list[StorageEngine] = []

    async def start(self, **kwargs: Any) -> StorageEngine:
        epoch = await self.metadata.register_node(self.config.node_id)
        config = self.config if not kwargs else self.config.model_copy(update=kwargs)
        engine = StorageEngine(config, self.store, self.metadata, self.metadata, self.config.node_id, epoch)
        await engine.start()
        self.engines.append(engine)
        return engine

    async def close(self) -> None:
        for e in self.engines:
            await e.close()
        await self.store.close()
