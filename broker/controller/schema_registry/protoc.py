"""`.proto` text -> a serialized FileDescriptorProto, with protoc (grpcio-tools' bundled
compiler) in a child process.

A child, not an in-process call: protoc's C++ parser reads hostile text, and a crash or a
runaway there must not take the controller down; the child has a time limit and at most
`MAX_CONCURRENT` run at once. The schema's imports are written next to it (their `.proto`
text, rendered from the registry's descriptors); the well-known types come from grpcio-tools'
own include directory.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from automq.broker.controller.schema_registry.protobuf import InvalidSchema

TIMEOUT_S = 30.0
MAX_CONCURRENT = 2
MAIN = "automq_registered_schema.proto"
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _include_dir() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


async def compile_text(text: str, imports: Sequence[tuple[str, str]] = ()) -> str:
    """The base64 FileDescriptorProto of `.proto` text; `imports`: (import path, `.proto` text)
    of the files it may import. InvalidSchema with protoc's message when it does not compile."""
    slots = _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(MAX_CONCURRENT))
    async with slots:
        with tempfile.TemporaryDirectory(prefix="automq-protoc-") as tmp:
            root = Path(tmp, "src")
            for name, source in ((MAIN, text), *imports):
                path = (root / name).resolve()
                if not path.is_relative_to(root.resolve()) or name.startswith("/"):
                    raise InvalidSchema(f"Invalid schema: reference name {name!r} is not a relative .proto path")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(source)
            out = Path(tmp, "out.pb")
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{_include_dir()}",
                f"--descriptor_set_out={out}",
                MAIN,
                cwd=tmp,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")},
            )
            try:
                _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise InvalidSchema(f"Invalid schema: protoc did not finish within {TIMEOUT_S:.0f} s") from None
            if proc.returncode != 0:
                lines = err.decode(errors="replace").replace(str(root) + "/", "").strip().splitlines()
                message = "\n".join(dict.fromkeys(lines))[:2_000]  # protoc repeats some errors per field
                raise InvalidSchema(f"Invalid schema: {message or f'protoc exited with {proc.returncode}'}")
            files = descriptor_pb2.FileDescriptorSet()
            try:
                files.ParseFromString(out.read_bytes())
            except (OSError, DecodeError) as exc:
                raise InvalidSchema(f"Invalid schema: protoc wrote no descriptor: {exc}") from None
    [fdp] = [f for f in files.file if f.name == MAIN]
    return base64.standard_b64encode(fdp.SerializeToString()).decode("ascii")
