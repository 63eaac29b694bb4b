"""LoadScraper against real aiohttp servers serving a broker's metrics registry."""

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from automq.broker.balancer.model import BrokerMeta, ClusterMetadata, Incomplete, LoadModel
from automq.broker.balancer.scrape import LoadScraper
from automq.broker.kafka.metrics import KafkaMetrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def serve_metrics(handler):
    """A local HTTP server answering /metrics with `handler`: (runner, the page's URL)."""
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/metrics"


async def serve(metrics: KafkaMetrics, status: list[int]):
    async def handler(_request):
        if status[0] != 200:
            return web.Response(status=status[0], text="boom")
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

    return await serve_metrics(handler)


async def test_window_rates_and_a_failed_scrape_blocks_the_model_until_the_next_success():
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    m = KafkaMetrics(registry)
    m.partition_opened("t", 0)
    status = [200]
    runner, url = await serve(m, status)
    try:
        cluster = ClusterMetadata(
            {1: BrokerMeta(1, None, "active", url), 2: BrokerMeta(2, None, "fenced", None)}, {("t", 0): 1}
        )
        clock = FakeClock()
        async with LoadScraper(window_s=30, clock=clock) as scraper:
            assert await scraper.scrape(cluster) == {}  # the fenced broker is not scraped
            assert isinstance(scraper.model(cluster), Incomplete)  # one sample: no rates yet
            m.record_produce("t", 0, 10_000, 100)
            clock.now += 10
            await scraper.scrape(cluster)
            model = scraper.model(cluster)
            assert isinstance(model, LoadModel), model
            assert model.partitions[("t", 0)].bytes_in == 1000.0 and model.brokers[1].messages_in == 10.0

            status[0] = 500
            clock.now += 10
            failed = await scraper.scrape(cluster)
            assert "HTTP 500" in failed[1]
            result = scraper.model(cluster)
            assert isinstance(result, Incomplete) and result.brokers == [1] and "HTTP 500" in str(result)

            status[0] = 200
            m.record_produce("t", 0, 20_000, 100)
            clock.now += 10
            await scraper.scrape(cluster)
            model = scraper.model(cluster)
            assert isinstance(model, LoadModel)
            # the window (30 s) reaches back to the first sample: 30 000 bytes over 30 s
            assert model.partitions[("t", 0)].bytes_in == 1000.0
            assert len(scraper.history[1]) <= 3

            clock.now += 500  # nothing scraped for a long time: stale
            assert "old" in str(scraper.model(cluster))
    finally:
        await runner.cleanup()


async def test_unreachable_and_unknown_url_are_named():
    cluster = ClusterMetadata({1: BrokerMeta(1, None, "active", "http://127.0.0.1:9/metrics"), 2: BrokerMeta(2)}, {})
    async with LoadScraper(timeout_s=2) as scraper:
        failed = await scraper.scrape(cluster)
    assert "127.0.0.1:9" in failed[1] and "no metrics URL" in failed[2]


async def test_a_page_arriving_in_many_pieces_is_read_whole():
    """A broker with many partitions writes a page of hundreds of KiB; it reaches the scraper
    in pieces. Reading only what had arrived cut it mid-line ("not Prometheus text format")."""
    import asyncio

    registry = CollectorRegistry()
    m = KafkaMetrics(registry)
    for p in range(400):
        m.partition_opened("t", p)
        m.record_produce("t", p, 1000, 10)
    page = generate_latest(registry)
    assert len(page) > 64 << 10

    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        for start in range(0, len(page), 4096):
            await resp.write(page[start : start + 4096])
            await asyncio.sleep(0.001)  # each piece is its own arrival at the client
        await resp.write_eof()
        return resp

    runner, url = await serve_metrics(handler)
    try:
        cluster = ClusterMetadata({1: BrokerMeta(1, None, "active", url)}, {("t", p): 1 for p in range(400)})
        async with LoadScraper(window_s=30, clock=FakeClock()) as scraper:
            assert await scraper.scrape(cluster) == {}
            sample = scraper.history[1][-1]
            assert len(sample.partitions) == 400
    finally:
        await runner.cleanup()
