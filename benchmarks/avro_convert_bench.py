"""Avro and Protobuf value conversion (by_schema_id) vs JSON conversion of the same records,
in one run.

What an ingestion task spends turning values into columns (`automq.spark.convert.convert`),
without Spark, the object store or Iceberg: N records of one order document, encoded as
Confluent wire-format Avro and Protobuf (schemas registered at a real in-process controller,
the Protobuf one as `.proto` text) and as JSON. Prints records/s of each and their ratio to
JSON (the baseline). No assertions.

    python benchmarks/avro_convert_bench.py --records 100000
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import tempfile
import time

import fastavro
import pyarrow as pa
from google.protobuf import descriptor_pool, message_factory

from automq.broker.config import NodeConfig
from automq.broker.controller.process import ControllerService
from automq.broker.controller.schema_registry import protobuf
from automq.spark.convert import TableSettings, convert
from automq.spark.reader import ROW_SCHEMA

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "ship_to", "type": {"type": "record", "name": "A", "fields": [{"name": "city", "type": "string"}]}},
    ],
}

PROTO = """
syntax = "proto3";
message Order {
  int64 id = 1;
  string item = 2;
  int32 qty = 3;
  double price = 4;
  optional string note = 5;
  message A { string city = 1; }
  A ship_to = 6;
}
"""


def rows(values: list[bytes]) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "topic": ["t"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            "timestamp_type": pa.array([0] * n, pa.int32()),
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array([[]] * n, ROW_SCHEMA.field("headers").type),
        },
        schema=ROW_SCHEMA,
    )


async def register(url: str, subject: str, body: dict) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.post(f"{url}/subjects/{subject}/versions", json=body) as resp:
        return int((await resp.json(content_type=None))["id"])


async def proto_class(url: str, schema_id: int) -> type:
    """The message class of the registry's descriptor (`?format=serialized`)."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{url}/schemas/ids/{schema_id}?format=serialized") as resp:
        fdp = protobuf.decode((await resp.json(content_type=None))["schema"])
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(fdp.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("Order"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    docs = [
        {
            "id": i,
            "item": f"item-{i}",
            "qty": i % 9,
            "price": i / 4,
            "note": None if i % 3 else "n",
            "ship_to": {"city": "x"},
        }
        for i in range(args.records)
    ]
    with tempfile.TemporaryDirectory(prefix="avro-bench-") as d:
        config = NodeConfig(node_id=0, object_store_url=f"file://{d}", http_host="127.0.0.1", http_port=0)

        async def run() -> None:
            service = ControllerService(config)
            await service.start()
            await service.controller.wait_leader(10)
            try:
                schema_id = await register(service.url, "bench-value", {"schema": json.dumps(SCHEMA)})
                proto_id = await register(service.url, "pbench-value", {"schema": PROTO, "schemaType": "PROTOBUF"})
                order = await proto_class(service.url, proto_id)
                header = b"\x00" + proto_id.to_bytes(4, "big") + b"\x00"  # message indexes [0]
                proto_values = []
                for doc in docs:
                    msg = order(id=doc["id"], item=doc["item"], qty=doc["qty"], price=doc["price"])
                    if doc["note"] is not None:
                        msg.note = doc["note"]
                    msg.ship_to.city = doc["ship_to"]["city"]
                    proto_values.append(header + msg.SerializeToString())
                parsed = fastavro.parse_schema(SCHEMA)
                avro_values = []
                for doc in docs:
                    buf = io.BytesIO()
                    buf.write(b"\x00" + schema_id.to_bytes(4, "big"))
                    fastavro.schemaless_writer(buf, parsed, doc)
                    avro_values.append(buf.getvalue())
                json_values = [json.dumps(doc).encode() for doc in docs]
                cases = {
                    "json (baseline)": (rows(json_values), TableSettings(convert="json")),
                    "by_schema_id avro": (
                        rows(avro_values),
                        TableSettings(convert="by_schema_id", registry_url=service.url),
                    ),
                    "by_schema_id protobuf": (
                        rows(proto_values),
                        TableSettings(convert="by_schema_id", registry_url=service.url),
                    ),
                }
                load = os.getloadavg()
                print(f"{args.records} records; load average {load[0]:.2f} {load[1]:.2f} (a busy machine skews these)")
                best: dict[str, float] = {}
                for _ in range(args.repeats):
                    for name, (table, settings) in cases.items():
                        t0 = time.perf_counter()
                        # the controller serves the registry from this loop: convert in a thread
                        out = await asyncio.to_thread(convert, table, settings)
                        elapsed = time.perf_counter() - t0
                        assert out.rows.num_rows == args.records
                        best[name] = min(best.get(name, elapsed), elapsed)
                for name, seconds in best.items():
                    ratio = best["json (baseline)"] / seconds
                    print(
                        f"{name:22s} {args.records / seconds:12,.0f} records/s  {ratio:5.2f}x json  (best of {args.repeats})"
                    )
            finally:
                await service.stop()

        asyncio.run(run())


if __name__ == "__main__":
    main()
