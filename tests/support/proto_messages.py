"""Protobuf message classes made at test time from `.proto` text (protoc from grpcio-tools,
run in this process), for confluent-kafka's `ProtobufSerializer`/`ProtobufDeserializer`: the
tests commit no generated `_pb2` modules."""

from __future__ import annotations

import tempfile
from pathlib import Path

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc


def compile_files(files: dict[str, str]) -> list[descriptor_pb2.FileDescriptorProto]:
    """{path: .proto text} -> their FileDescriptorProtos (imports first), as protoc writes them."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, name).write_text(text)
        out = Path(tmp, "out.pb")
        include = Path(grpc_tools.__file__).parent / "_proto"
        args = ["protoc", f"-I{tmp}", f"-I{include}", "--include_imports", f"--descriptor_set_out={out}", *files]
        assert protoc.main(args) == 0, f"protoc failed on {list(files)}"
        return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)


def message_classes(files: dict[str, str]) -> dict[str, type]:
    """{full message name: class} of every message the files define, in a pool of their own."""
    pool = descriptor_pool.DescriptorPool()
    classes: dict[str, type] = {}
    for fdp in compile_files(files):
        fd = pool.AddSerializedFile(fdp.SerializeToString())
        if fdp.name.startswith("google/protobuf/"):
            continue
        stack = list(fd.message_types_by_name.values())
        while stack:
            desc = stack.pop()
            classes[desc.full_name] = message_factory.GetMessageClass(desc)
            stack.extend(desc.nested_types)
    return classes
