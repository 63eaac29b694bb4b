"""A connection's response output, handed to the transport in bounded steps.

A Fetch response for a consumer catching up is many MiB. Given to the transport in one
`writelines`, the event loop copies as much of it into the socket as the socket takes
(on loopback the peer's receive path runs inside the same `writev`), and later writable
events copy the rest, each as far as it goes: single turns of the loop of several ms to
tens of ms, during which produce requests on other connections wait (issue 14: produce p99
during a 1 GiB catch-up). Here frames up to `STEP` bytes go out at once as before; larger
output is queued and handed over `STEP` bytes per loop turn, and only while the transport
holds less than `STEP` (its high-water mark), so one turn never copies much more than that.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from collections.abc import Callable

STEP = 1 << 20
_SIZE = struct.Struct(">i")
_CLOSE = None  # queued marker: close the transport here


class PacedOutput:
    """Frames in order, then (optionally) a close; `pending` counts bytes not yet handed over."""

    def __init__(self, transport: asyncio.Transport, on_drained: Callable[[], None]) -> None:
        self._transport = transport
        self._on_drained = on_drained  # called when queued output fell to zero
        self._queue: collections.deque[bytes | bytearray | memoryview | None] = collections.deque()
        self.pending = 0
        self._full = False  # the transport is over its high-water mark (pause_writing)
        self._scheduled = False
        transport.set_write_buffer_limits(high=STEP)

    def write_frame(self, chunks: list) -> int:
        """Queues one size-prefixed frame; returns its bytes including the prefix."""
        size = 0
        for chunk in chunks:
            size += len(chunk)
        if not self._queue and not self._full and size <= STEP:
            if len(chunks) == 1:
                self._transport.write(_SIZE.pack(size) + chunks[0])
            else:
                self._transport.writelines([_SIZE.pack(size), *chunks])
            return size + 4
        self._queue.append(_SIZE.pack(size))
        self._queue.extend(chunks)
        self.pending += size + 4
        self._pump()
        return size + 4

    def close_when_written(self) -> None:
        if not self._queue:
            self._transport.close()
            return
        self._queue.append(_CLOSE)
        self._pump()

    def transport_full(self) -> None:
        self._full = True

    def transport_drained(self) -> None:
        self._full = False
        self._pump()

    def discard(self) -> None:
        """The connection is gone: drop what was never handed over (frees the buffers)."""
        self._queue.clear()
        self.pending = 0

    def write_all_now(self) -> None:
        """Hands everything queued to the transport now (aborts, shutdown)."""
        pieces = []
        close = False
        while self._queue:
            piece = self._queue.popleft()
            if piece is None:
                close = True
                break
            pieces.append(piece)
        self._queue.clear()
        self.pending = 0
        if pieces and not self._transport.is_closing():
            self._transport.writelines(pieces)
        if close:
            self._transport.close()

    def _pump(self) -> None:
        if self._scheduled or self._full or self._transport.is_closing():
            return
        queue = self._queue
        batch: list[bytes | bytearray | memoryview] = []
        n = 0
        while queue and n < STEP:
            piece = queue[0]
            if piece is None:
                if batch:
                    break  # close after this batch went out, next turn
                queue.popleft()
                self._transport.close()
                queue.clear()
                self.pending = 0
                return
            room = STEP - n
            if len(piece) > room:
                view = memoryview(piece).cast("B")
                batch.append(view[:room])
                queue[0] = view[room:]
                n += room
                break
            batch.append(piece)
            queue.popleft()
            n += len(piece)
        if batch:
            self.pending -= n
            self._transport.writelines(batch)
        if queue:
            if not self._full:  # not over the mark: continue next turn, after other callbacks
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._next_turn)
            return
        self._on_drained()

    def _next_turn(self) -> None:
        self._scheduled = False
        self._pump()
