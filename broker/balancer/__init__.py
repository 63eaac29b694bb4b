"""Goal-based partition balancing: load model from brokers' metrics, a pure planner, and an
executor that moves partitions through the standard Kafka reassignment API.

- `model`: `LoadModel` / `Incomplete` from brokers' metric samples (pure)
- `scrape`: `LoadScraper` fetches brokers' /metrics (aiohttp) into a window of samples
- `planner`: `plan()` / `drain()` -> `Proposal` of `Move`s (pure)
- `kafka_admin`: a small asyncio Kafka client for the calls the balancer needs
- `executor`: `MoveExecutor` applies moves (bounded concurrency) and waits until they serve
- `cli`: `automq rebalance`

The operator (automq.operator) and the CLI both use these; nothing here imports them.
"""
