"""Big responses and the event loop: a uvloop server streams 16 MiB responses to a reader in
another process, handing each response to the transport whole (as the broker did before
broker/kafka/output.py) or through `PacedOutput` (1 MiB per loop turn). Prints throughput
next to the event loop's lag (a 1 ms ticker) and the longest loop-thread CPU stretch
without a turn, for each way, alternating; asserts nothing.

    python benchmarks/paced_output_bench.py [--rounds 3] [--mib 1024]

Why it matters: a consumer catching up gets responses of many MiB; while the loop copies one
into the socket, produce requests on other connections wait (issue 14 goal 2).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import uvloop

from automq.broker.kafka.output import PacedOutput

MiB = 1 << 20
RESPONSE_CHUNKS = 16  # a 16 MiB response of 1 MiB chunks (a fetch of cached batches)


def read_all(port: int, total: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(4 * MiB)
    n = 0
    while n < total:
        k = s.recv_into(buf)
        if not k:
            break
        n += k


class Streamer(asyncio.Protocol):
    """Keeps one response queued whenever the output has room, like a consumer with fetches
    in flight; `paced` chooses PacedOutput or one `writelines` per response."""

    def __init__(self, paced: bool, responses: int, chunk: list[memoryview], done: asyncio.Future) -> None:
        self.paced, self.left, self.chunk, self.done = paced, responses, chunk, done
        self.out: PacedOutput | None = None
        self.paused = False

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.t = transport
        if self.paced:
            self.out = PacedOutput(transport, lambda: None)
        else:
            transport.set_write_buffer_limits(high=8 * MiB)  # the broker's former mark
        asyncio.get_running_loop().call_soon(self.more)

    def pause_writing(self) -> None:
        self.paused = True
        if self.out is not None:
            self.out.transport_full()

    def resume_writing(self) -> None:
        self.paused = False
        if self.out is not None:
            self.out.transport_drained()
        self.more()

    def more(self) -> None:
        while self.left and not self.paused and (self.out is None or self.out.pending < 8 * MiB):
            if self.out is not None:
                self.out.write_frame(self.chunk)
            else:
                self.t.writelines([b"\0\0\0\0", *self.chunk])
            self.left -= 1
        if self.left:
            asyncio.get_running_loop().call_later(0.001, self.more)


async def run(paced: bool, total_mib: int) -> str:
    loop = asyncio.get_running_loop()
    responses = total_mib // RESPONSE_CHUNKS
    chunk = [memoryview(os.urandom(MiB)) for _ in range(RESPONSE_CHUNKS)]
    server = await loop.create_server(lambda: Streamer(paced, responses, chunk, loop.create_future()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    total = responses * (RESPONSE_CHUNKS * MiB + 4)
    reader = subprocess.Popen([sys.executable, __file__, "--reader", str(port), str(total)])
    lags: list[float] = []
    longest_cpu = 0.0
    start = last = time.perf_counter()
    cpu = time.thread_time()
    while reader.poll() is None:
        await asyncio.sleep(0.001)
        now, c = time.perf_counter(), time.thread_time()
        lags.append(now - last - 0.001)
        longest_cpu = max(longest_cpu, c - cpu)
        last, cpu = now, c
    elapsed = time.perf_counter() - start
    server.close()
    lags.sort()
    return (
        f"{'paced (1 MiB a turn)' if paced else 'whole response':21s} {total / MiB / elapsed:7.0f} MiB/s; "
        f"loop lag p99 {lags[int(len(lags) * 0.99)] * 1e3:.2f} ms, p99.9 {lags[int(len(lags) * 0.999)] * 1e3:.2f} ms, "
        f"max {lags[-1] * 1e3:.1f} ms; longest loop-thread CPU without a turn {longest_cpu * 1e3:.1f} ms"
    )


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--reader":
        read_all(int(sys.argv[2]), int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024, help="MiB streamed per run")
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start")
    for _ in range(args.rounds):
        for paced in (False, True):
            print(uvloop.run(run(paced, args.mib)))


if __name__ == "__main__":
    main()
