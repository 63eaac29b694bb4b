"""The controller process: `automq controller --config FILE` ends up in `run_controller`.

`ControllerService` wires a `Controller` to its object store and HTTP server and is also
what tests and local mode embed (port 0 picks a free port; `url` tells where it listens).
SIGTERM/SIGINT stop it gracefully: a leader resigns in the log so a standby takes over at
once instead of waiting out the lease.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from automq.broker.config import NodeConfig
from automq.broker.controller.controller import Controller
from automq.broker.controller.server import build_app, build_registry_app
from automq.broker.controller.tls_site import TlsOnlySite
from automq.broker.node import run_node
from automq.broker.objectstore import open_object_store
from automq.broker.security.controller_auth import ControllerClientAuth, ControllerServerAuth, server_tls

log = logging.getLogger(__name__)


class ControllerService:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.store = open_object_store(config.object_store_url)
        self.controller = Controller(
            self.store,
            controller_id=config.node_id,
            url="",  # known once the socket is bound
            cluster_id=config.cluster_id,
            config=config.controller,
            session_timeout_ms=config.session_timeout_ms,
            gc_retention_ms=config.storage.object_gc_retention_ms,
            lease=self._lease(config),
        )
        self._runner: web.AppRunner | None = None
        self.port = 0
        # built now so a bad certificate or token file stops the start with the key's name
        self.auth = ControllerServerAuth.from_config(config)
        self.tls = server_tls(config.tls) if config.security.controller_tls else None
        self._tls_reload: asyncio.Task[None] | None = None
        self._https: TlsOnlySite | None = None
        self._registry_https: TlsOnlySite | None = None
        self._registry_runner: web.AppRunner | None = None
        self.forward_auth = ControllerClientAuth.from_config(config)  # a standby forwarding registry calls
        self.schema_registry_port: int | None = None

    @staticmethod
    def _lease(config: NodeConfig):
        if config.controller.leadership != "lease":
            return None
        from automq.broker.controller.lease import KubernetesLease

        return KubernetesLease.from_config(config)

    @property
    def url(self) -> str:
        return self.controller.url

    @property
    def schema_registry_url(self) -> str:
        """Where Confluent clients reach the schema registry (its own port if one is set)."""
        if self.schema_registry_port is None:
            return self.url
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.rsplit(':', 1)[0]}:{self.schema_registry_port}"

    async def _serve(self, app: web.Application, port: int) -> tuple[web.AppRunner, TlsOnlySite | None, int]:
        """`app` on `port` of the HTTP host, over TLS when the controller has it: its runner, its
        TLS site (None for plain http; the runner's cleanup stops a plain site) and the bound port."""
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        if self.tls is not None:
            https = TlsOnlySite(
                runner.server,
                self.config.http_host,
                port,
                self.tls.context,
                self.config.tls.handshake_timeout_ms / 1000,
                plain_http=self.config.security.controller_plain_http,
            )
            https.start()
            return runner, https, https.port
        site = web.TCPSite(runner, self.config.http_host, port, reuse_address=True)
        await site.start()
        return runner, None, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def start(self) -> None:
        self._runner, self._https, self.port = await self._serve(
            build_app(self.controller, self.auth, self.forward_auth), self.config.http_port
        )
        registry_port = self.config.controller.schema_registry_port
        if registry_port is not None:
            self._registry_runner, self._registry_https, self.schema_registry_port = await self._serve(
                build_registry_app(self.controller, self.auth, self.forward_auth), registry_port
            )
        host = self.config.http_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        scheme = "https" if self.tls is not None else "http"
        self.controller.url = self.config.controller.advertised_url or f"{scheme}://{host}:{self.port}"
        if self.tls is not None and self.config.tls.reload_check_interval_ms > 0:
            self._tls_reload = asyncio.get_running_loop().create_task(self._reload_tls(), name="controller-tls-reload")
        await self.controller.start()
        log.info("controller %d serving on %s (object store %s)", self.config.node_id, self.url, self.store.url)

    async def stop(self, resign: bool = True) -> None:
        """resign=False stops like a crash would (tests): standbys wait out the lease."""
        if self._tls_reload is not None:
            self._tls_reload.cancel()
            self._tls_reload = None
        if resign:
            await self.controller.resign()
        await self.controller.stop()
        for site in (self._https, self._registry_https):
            if site is not None:
                await site.stop()
        self._https = self._registry_https = None
        for runner in (self._runner, self._registry_runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._registry_runner = None
        await self.store.close()

    async def _reload_tls(self) -> None:
        assert self.tls is not None
        while True:
            await asyncio.sleep(self.config.tls.reload_check_interval_ms / 1000)
            self.tls.check()

    async def __aenter__(self) -> ControllerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve(config: NodeConfig) -> int:
    service = ControllerService(config)
    await service.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    fatal = asyncio.create_task(service.controller.wait_stopped())
    await asyncio.wait({stopping, fatal}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stopping, fatal):
        task.cancel()
    code = 1 if service.controller.fatal is not None else 0
    await service.stop()
    return code


def run_controller(config: NodeConfig) -> None:
    """Blocking entry point; returns after SIGTERM/SIGINT (exit code 1 on a fatal error)."""
    run_node(config, serve, role="controller")
