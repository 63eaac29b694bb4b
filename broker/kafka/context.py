"""What a request handler knows about the request it is answering, besides the request itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from automq.broker.kafka.auth_session import ConnectionSession
    from automq.broker.kafka.broker import Broker


@dataclass(slots=True)
class RequestContext:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    peer: str  # "host:port" of the client, for logs
    # The kio response dataclass matching the request's api key AND version: handlers build
    # their answer with it (and its module's nested classes, see codec.build/codec.nested).
    response_class: type
    broker: Broker
    # set by client quotas: the server mutes the connection this long after answering
    throttle_ms: int = 0
    # Who is asking, for authorization and quotas: a Kafka principal string ("User:alice";
    # "User:ANONYMOUS" when the listener authenticates nobody), the client's IP, and the
    # listener the connection came in on. Captured per request: re-authentication (KIP-368)
    # may change the principal of a connection between two requests.
    principal: str = "User:ANONYMOUS"
    client_host: str = ""
    listener: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    session: ConnectionSession | None = None  # TLS/SASL listeners: the connection's auth state
    # callbacks the connection runs once when it closes, one per key (None: no connection)
    on_close: dict[object, Callable[[], None]] | None = None
    # Produce only: its connection's previous Produce, done once that one has reserved its
    # offsets (None: nothing to wait for), and this one's own, which the handler resolves once
    # its appends are scheduled. Pipelined Produces of one connection run concurrently, yet
    # each partition must get their batches in request order, as Kafka's one-at-a-time
    # connections give: a non-idempotent producer's in-flight requests are not reordered.
    produce_after: asyncio.Future[None] | None = None
    produce_turn: asyncio.Future[None] | None = None

    def produce_scheduled(self, _task: object = None) -> None:
        """The Produce's appends have their offsets: the connection's next Produce may go.
        (Also its task's done callback, `_task` being that task.)"""
        turn = self.produce_turn
        if turn is not None and not turn.done():
            turn.set_result(None)
