"""Responses larger than one step reach the transport in bounded pieces, in order, one
piece per loop turn and only while the transport is under its high-water mark; a close
waits for the last byte."""

from __future__ import annotations

import asyncio
import os
import struct

from automq.broker.kafka import output
from automq.broker.kafka.output import PacedOutput


class FakeTransport:
    """Records what it is handed; `full` makes it report a buffer over the mark."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.limits: dict = {}

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self.limits = {"high": high, "low": low}

    def write(self, data) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def writelines(self, pieces) -> None:
        self.write(b"".join(bytes(p) for p in pieces))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def frame(chunks) -> bytes:
    body = b"".join(bytes(c) for c in chunks)
    return struct.pack(">i", len(body)) + body


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_small_frames_go_out_at_once_and_large_ones_in_steps(monkeypatch):
    monkeypatch.setattr(output, "STEP", 1000)
    t = FakeTransport()
    out = PacedOutput(t, lambda: None)  # type: ignore[arg-type]
    assert t.limits["high"] == 1000
    small = [b"a" * 10, b"b" * 20]
    assert out.write_frame(small) == 34 and t.writes == [frame(small)]
    big = [os.urandom(700), memoryview(os.urandom(2500)), os.urandom(300)]
    out.write_frame(big)
    later = [b"after"]
    out.write_frame(later)  # queued behind the big one, never ahead of it
    out.close_when_written()
    assert len(t.writes) == 2 and len(t.writes[1]) == 1000 and not t.closed
    await turns(10)
    assert all(len(w) <= 1000 for w in t.writes)
    assert b"".join(t.writes) == frame(small) + frame(big) + frame(later)
    assert t.closed and out.pending == 0


async def test_nothing_more_is_handed_over_while_the_transport_is_full(monkeypatch):
    monkeypatch.setattr(output, "STEP", 100)
    t = FakeTransport()
    drained = []
    out = PacedOutput(t, lambda: drained.append(out.pending))  # type: ignore[arg-type]
    out.transport_full()  # pause_writing
    data = [os.urandom(450)]
    out.write_frame(data)
    await turns(5)
    assert t.writes == [] and out.pending == 454
    out.transport_drained()  # resume_writing: one step now, the rest on later turns
    assert len(t.writes) == 1
    await turns(10)
    assert b"".join(t.writes) == frame(data) and out.pending == 0
    assert drained == [0]  # the connection hears when its backlog is gone (reading resumes)


async def test_write_all_now_hands_everything_over_for_an_abort(monkeypatch):
    monkeypatch.setattr(output, "STEP", 100)
    t = FakeTransport()
    out = PacedOutput(t, lambda: None)  # type: ignore[arg-type]
    data = [os.urandom(1000)]
    out.write_frame(data)
    out.write_all_now()
    assert b"".join(t.writes) == frame(data) and out.pending == 0
    await turns(5)  # the scheduled turn finds nothing left
    assert b"".join(t.writes) == frame(data)


async def test_a_lost_connection_drops_what_was_never_handed_over(monkeypatch):
    monkeypatch.setattr(output, "STEP", 100)
    t = FakeTransport()
    out = PacedOutput(t, lambda: None)  # type: ignore[arg-type]
    out.write_frame([os.urandom(1000)])
    t.closed = True  # the peer went away
    out.discard()
    assert out.pending == 0
    await turns(5)
    assert len(t.writes) == 1  # nothing more after the loss
