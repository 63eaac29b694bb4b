"""Connection floods against the broker's Kafka server: what each kind of hostile or idle
client costs in broker memory, and whether that memory comes back.

    python benchmarks/connection_flood_bench.py [--idle 2000,10000] [--slowloris 2000] [--huge 200]

The broker side runs in a child process (the same `KafkaServer` and event loop a broker
process uses, no storage behind it: none of these clients gets that far), so its RSS is
read from /proc without the clients' own sockets in it. Phases, each followed by closing
its sockets and reading RSS again:
- idle: N connections that send nothing (RSS per connection);
- slowloris: connections that send 2 bytes of a 4-byte frame size and stop;
- huge: connections whose frame size declares socket_request_max_bytes - 1 and that send
  64 KiB of it, then a byte at a time;
- bulk: connections that each push 1 MiB of such a frame as fast as the broker reads it
  (what the unfinished-frame budget, queued_max_request_bytes, bounds);
- after: RSS once everything is closed (baseline: RSS before the first connection).
The file-descriptor limit is raised to the hard limit in both processes and printed.
Numbers are printed next to the baseline of the same run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import struct
import subprocess
import sys
import time


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# ------------------------------------------------------------------ the broker side (child)


def serve(kafka: dict, trim: bool, loop: str) -> None:
    from automq.broker.config import parse_config
    from automq.broker.kafka import server as server_module

    if not trim:
        server_module.TRIM_AFTER_CLOSED = 1 << 62
    from automq.broker.kafka.broker import Broker
    from automq.broker.kafka.server import KafkaServer

    raise_fd_limit()
    config = parse_config(
        {
            "node_id": 1,
            "data_dir": "/tmp",
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 0}],
            "kafka": kafka,
        }
    )

    async def main() -> None:
        server = KafkaServer(Broker(config, node_epoch=1, cluster=None, storage=None))
        ports = await server.start()
        print(json.dumps({"port": ports["PLAINTEXT"]}), flush=True)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            if line.strip() == b"count":
                print(json.dumps({"connections": len(server.connections)}), flush=True)
        await server.stop(1)

    if loop == "uvloop":
        import uvloop  # what run_node uses

        uvloop.run(main())
    else:
        asyncio.run(main())


# ------------------------------------------------------------------ the flood (parent)


class Broker:
    def __init__(self, kafka: dict, trim: bool, loop: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", json.dumps(kafka), "--loop", loop, *([] if trim else ["--no-trim"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = json.loads(self.proc.stdout.readline())["port"]

    def connections(self) -> int:
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["connections"]

    def rss(self) -> int:
        return rss_kib(self.proc.pid)

    def settle(self, expect: int, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.connections()
            if n == expect:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # let the loop finish whatever the last bytes started
        return self.connections()

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def connect(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out.append(s)
    return out


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
    socks.clear()


def alive(socks: list[socket.socket]) -> int:
    """How many of these sockets the broker has not closed."""
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            data = s.recv(1)
            n += data != b""
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", default="2000,10000")
    parser.add_argument("--slowloris", type=int, default=2000)
    parser.add_argument("--huge", type=int, default=200)
    parser.add_argument("--bulk", type=int, default=1000, help="connections pushing 1 MiB each of a huge frame")
    parser.add_argument("--max-request-mib", type=int, default=100)
    parser.add_argument("--kafka", default="{}", help="extra broker kafka config as JSON")
    parser.add_argument("--serve")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the broker's event loop")
    parser.add_argument("--no-trim", action="store_true", help="never malloc_trim after connections close")
    args = parser.parse_args()
    if args.serve is not None:
        serve(json.loads(args.serve), not args.no_trim, args.loop)
        return

    limit = raise_fd_limit()
    print(f"file-descriptor limit (soft = hard): {limit}; python {sys.version.split()[0]}")
    kafka = {"socket_request_max_bytes": args.max_request_mib << 20, **json.loads(args.kafka)}
    print(f"broker kafka config: {kafka}; malloc_trim after floods: {not args.no_trim}; loop: {args.loop}")

    def report(label: str, broker: Broker, base: int, n: int) -> None:
        rss = broker.rss()
        per = (rss - base) * 1024 / max(n, 1) / 1000
        print(
            f"  {label:<44} {n:6d} open  RSS {rss / 1024:7.1f} MiB  +{(rss - base) / 1024:7.1f} MiB  {per:7.1f} kB/conn"
        )

    def closed(label: str, broker: Broker, base: int) -> None:
        broker.settle(0)
        time.sleep(2)
        rss = broker.rss()
        print(
            f"  {label:<44} RSS {rss / 1024:7.1f} MiB, baseline {base / 1024:.1f} MiB: +{(rss - base) / 1024:.1f} MiB still held"
        )

    # each phase on a fresh broker process, so one phase's held memory does not hide the next's
    broker = Broker(kafka, not args.no_trim, args.loop)
    try:
        broker.settle(0)
        base = broker.rss()
        print(f"idle connections (baseline RSS {base / 1024:.1f} MiB)")
        socks: list[socket.socket] = []
        for target in [int(x) for x in args.idle.split(",") if x]:
            target = min(target, limit - 100)
            socks += connect(broker.port, target - len(socks))
            report(f"{target} idle", broker, base, broker.settle(target))
        print(f"  still open on the client side: {alive(socks)}")
        close_all(socks)
        closed("all closed", broker, base)
    finally:
        broker.stop()

    if args.slowloris:
        broker = Broker(kafka, not args.no_trim, args.loop)
        try:
            broker.settle(0)
            base = broker.rss()
            print(f"slowloris: 2 of the 4 frame-size bytes, then nothing (baseline RSS {base / 1024:.1f} MiB)")
            socks = connect(broker.port, args.slowloris)
            for s in socks:
                s.sendall(b"\x00\x00")
            report(f"{args.slowloris} slowloris", broker, base, broker.settle(args.slowloris))
            close_all(socks)
            closed("all closed", broker, base)
        finally:
            broker.stop()

    if args.huge:
        broker = Broker(kafka, not args.no_trim, args.loop)
        try:
            broker.settle(0)
            base = broker.rss()
            declared = (args.max_request_mib << 20) - 1
            print(
                f"huge frames: {declared} bytes declared, 64 KiB sent, then a byte at a time (baseline RSS {base / 1024:.1f} MiB)"
            )
            socks = connect(broker.port, args.huge)
            chunk = b"\x00" * (64 << 10)
            for s in socks:
                s.sendall(struct.pack(">i", declared) + b"\x00\x12\x00\x00\x00\x00\x00\x01" + chunk)
            for _ in range(3):
                time.sleep(0.3)
                for s in socks:
                    s.sendall(b"\x00")
            report(f"{args.huge} huge", broker, base, broker.settle(args.huge))
            close_all(socks)
            closed("all closed", broker, base)
        finally:
            broker.stop()

    if args.bulk:
        broker = Broker(kafka, not args.no_trim, args.loop)
        try:
            broker.settle(0)
            base = broker.rss()
            declared = (args.max_request_mib << 20) - 1
            print(
                f"bulk: {args.bulk} connections pushing 1 MiB each of a {declared}-byte frame (baseline RSS {base / 1024:.1f} MiB)"
            )
            socks = connect(broker.port, args.bulk)
            payload = struct.pack(">i", declared) + b"\x00\x12\x00\x00\x00\x00\x00\x01" + b"\x00" * (1 << 20)
            pushed = 0
            for s in socks:
                s.settimeout(0.05)  # a broker that stopped reading this socket: move on
                try:
                    s.sendall(payload)
                    pushed += 1
                except (TimeoutError, OSError):
                    pass
            report(f"{args.bulk} bulk ({pushed} pushed all 1 MiB)", broker, base, broker.settle(args.bulk))
            close_all(socks)
            closed("all closed", broker, base)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
