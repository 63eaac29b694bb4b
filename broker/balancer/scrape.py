"""Scraping brokers' /metrics over HTTP (aiohttp) into a sliding window of samples.

`LoadScraper` is meant for a timer (the operator scrapes every evaluation interval):
`await scraper.scrape(cluster)` fetches every non-fenced broker's metrics concurrently,
`scraper.model(cluster)` turns the window into a `LoadModel` or an `Incomplete` naming the
brokers whose data is missing or stale. `measure()` is the one-shot form the CLI uses (two
scrapes `interval_s` apart).

A failed scrape is remembered until the next success: the model stays incomplete rather
than quietly falling back to an older sample.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from automq.broker.balancer.model import (
    FENCED,
    BrokerSample,
    ClusterMetadata,
    Incomplete,
    LoadModel,
    MetricsFormatError,
    MissingData,
    build_model,
    parse_metrics,
)

MAX_METRICS_BYTES = 64 * 1024 * 1024  # a broker with many partitions has a large page; not unbounded


class LoadScraper:
    def __init__(
        self,
        *,
        window_s: float = 60.0,
        stale_after_s: float | None = None,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        # a sample older than two windows says nothing about now
        self.stale_after_s = stale_after_s if stale_after_s is not None else 2 * window_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._session = session
        self._own_session = session is None
        self.history: dict[int, list[BrokerSample]] = {}
        self.errors: dict[int, str] = {}

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> LoadScraper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    async def fetch(self, url: str) -> BrokerSample:
        """One broker's metrics, parsed; raises with a readable message on any failure."""
        async with self._http().get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url} answered HTTP {resp.status}")
            # StreamReader.read(n) answers with what has arrived (up to n bytes), not the whole
            # page: read to the end, bounded. (A page past one chunk was cut mid-line and
            # refused as "not Prometheus text format", leaving the balancer without load data.)
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > MAX_METRICS_BYTES:
                    raise RuntimeError(f"{url} returned more than {MAX_METRICS_BYTES} bytes")
                chunks.append(chunk)
            body = b"".join(chunks)
        at = self._clock()
        return parse_metrics(body.decode("utf-8", errors="replace"), at)

    async def scrape(self, cluster: ClusterMetadata) -> dict[int, str]:
        """Scrape every non-fenced broker once; returns {broker: why} for those that failed."""
        targets = {b.broker_id: b.metrics_url for b in cluster.brokers.values() if b.state != FENCED}

        async def one(bid: int, url: str | None) -> tuple[int, BrokerSample | str]:
            if not url:
                return bid, "no metrics URL known for it"
            try:
                return bid, await self.fetch(url)
            except TimeoutError:
                return bid, f"{url}: no answer within {self.timeout_s:g}s"
            except aiohttp.ClientError as exc:
                return bid, f"{url}: {type(exc).__name__}: {exc}"
            except (OSError, RuntimeError, MetricsFormatError) as exc:
                return bid, f"{url}: {exc}"

        results = await asyncio.gather(*(one(b, u) for b, u in sorted(targets.items())))
        failed: dict[int, str] = {}
        for bid, result in results:
            if isinstance(result, str):
                self.errors[bid] = failed[bid] = result
                continue
            self.errors.pop(bid, None)
            samples = self.history.setdefault(bid, [])
            samples.append(result)
            # keep the window plus the one sample before it (rates need a start point)
            while len(samples) > 2 and result.at - samples[1].at > self.window_s:
                samples.pop(0)
        for bid in list(self.history):
            if bid not in targets:  # gone from the cluster
                del self.history[bid]
                self.errors.pop(bid, None)
        return failed

    def model(self, cluster: ClusterMetadata) -> LoadModel | Incomplete:
        return build_model(
            cluster,
            self.history,
            now=self._clock(),
            window_s=self.window_s,
            stale_after_s=self.stale_after_s,
            errors=self.errors,
        )


async def measure(
    cluster: ClusterMetadata, *, interval_s: float = 5.0, timeout_s: float = 5.0
) -> LoadModel | Incomplete:
    """Two scrapes `interval_s` apart, then the model (or why there is none)."""
    async with LoadScraper(window_s=interval_s * 1.5 + timeout_s, timeout_s=timeout_s) as scraper:
        failed = await scraper.scrape(cluster)
        if failed:
            return Incomplete(tuple(MissingData(b, f"scrape failed: {why}") for b, why in sorted(failed.items())))
        await asyncio.sleep(interval_s)
        await scraper.scrape(cluster)
        return scraper.model(cluster)
