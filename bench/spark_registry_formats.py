"""Spark: rows/s of the onceflow sink writing ``value.format`` avro-registry against the same sink writing bytes,
same rows, same session (and, to tell the registry's cost from the struct's, schemaless avro of the same structs).

One cached DataFrame holds each order twice: as a struct (id, customer, amount, tags) and as that struct's JSON
text in a binary column, computed before timing. The baseline writes the binary column with ``value.format``
bytes; the candidate writes the struct with avro-registry, through confluent-kafka's AvroSerializer against
onceflow's own registry (kept on the same embedded store, served over HTTP), the subject's latest version; the
third writes the struct as schemaless Avro (fastavro, no registry). All are batch writes (one job id each) into
streams of 4 partitions; each runs ``--rounds`` times, alternating, and the best round counts, with each format's
ratio to bytes in the same round (min/median/max over the rounds: on a loaded machine one round's load can move the
best rounds' ratio by more than a change being measured). A small write of each warms the session's Python
workers up first.

``--in-process`` measures, without Spark, what the sink's Python does for each row of a task: avro-registry from an
Arrow batch of the same rows (to rows, then records), bytes from Spark's rows (records), best of ``--rounds``; what
Spark itself does (moving rows to its Python workers, staging the records) is left out of both.

    python bench/spark_registry_formats.py [--rows 200000] [--rounds 3] [--in-process]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from _report import report, row

from onceflow.connector.store import Store, open_store
from onceflow.schemas.registry import RegistryServer, SchemaRegistry

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

from onceflow import spark_sinks

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"}, {"name": "tags", "type": {"type": "array", "items": "string"}}]})
STRUCT = "struct(id, customer, amount, tags)"


def orders(spark: Any, rows: int) -> Any:
    """The rows, cached: key, the order as a struct, and the same order as JSON bytes."""
    frame = spark.range(rows).selectExpr(
        "cast(id as string) as key", "id", "concat('customer-', id % 1000) as customer", "id * 0.25 as amount",
        "array('new', concat('batch-', id % 7)) as tags").selectExpr(
        "key", f"{STRUCT} as order", f"cast(to_json({STRUCT}) as binary) as payload").repartition(4).cache()
    frame.count()
    return frame


def write(frame: Any, store: Store, registry: SchemaRegistry, registry_url: str, fmt: str, job: str) -> float:
    """Seconds to write ``frame`` in format ``fmt`` (bytes: the payload column; avro-registry: the struct, with
    the schema registered under the topic's subject beforehand)."""
    topic = f"out-{job}"
    store.create_stream(topic, 4)
    registry.register(f"{topic}-value", "AVRO", ORDER, [])
    value = "payload" if fmt == "bytes" else "order"
    writer = (frame.selectExpr("key", f"{value} as value").write.format("onceflow").option("store.url", store.url)
              .option("topic", topic).option("job.id", job).option("value.format", fmt).mode("append"))
    writer = (writer.option("avro.schema", ORDER) if fmt == "avro" else
              writer.option("schema.registry.url", registry_url) if fmt == "avro-registry" else writer)
    started = time.perf_counter()
    writer.save()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-process", action="store_true", help="the sink's per-row Python only, no Spark")
    args = parser.parse_args()
    if args.in_process:
        in_process(args.rows, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite://{tmp}/bench.db")
        registry = SchemaRegistry(store)
        server = RegistryServer(registry, port=0).start()
        with contextlib.closing(store), contextlib.closing(registry), contextlib.closing(server):
            spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            spark_sinks.register(spark)
            results = measure(spark, store, server.url, registry, args.rows, args.rounds)
            spark.stop()
    baseline = (args.rows, min(results["bytes"]))
    spreads = {fmt: spread(results["bytes"], results[fmt]) for fmt in ("avro-registry", "avro")}
    for fmt, found in spreads.items():
        print(f"{fmt} / bytes, round by round: " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
    report("spark_registry_formats", [
        row("Spark sink, value.format bytes", *baseline),
        *(row(f"Spark sink, value.format {fmt}", args.rows, min(results[fmt]), "bytes", baseline)
          for fmt in ("avro-registry", "avro")),
    ], {"rows": args.rows, "rounds": args.rounds, "rounds_seconds": results, "vs_bytes_per_round": spreads})


def spread(baseline: list[float], candidate: list[float]) -> dict[str, float]:
    """The candidate's rate over the baseline's in each round: min, median, max."""
    ratios = sorted(b / c for b, c in zip(baseline, candidate, strict=True))
    return {"min": ratios[0], "median": statistics.median(ratios), "max": ratios[-1]}


def measure(spark: Any, store: Store, url: str, registry: SchemaRegistry, rows: int, rounds: int
            ) -> dict[str, list[float]]:
    """Each format's seconds per round, alternating (after a warm-up write of each)."""
    warm = orders(spark, 2_000)
    results: dict[str, list[float]] = {"bytes": [], "avro-registry": [], "avro": []}
    for fmt in results:
        write(warm, store, registry, url, fmt, f"warm-{fmt}")
    frame = orders(spark, rows)
    for round_ in range(rounds):
        for fmt in results:
            results[fmt].append(write(frame, store, registry, url, fmt, f"r{round_}-{fmt}"))
            print(f"round {round_} {fmt}: {rows / results[fmt][-1]:,.0f} rows/s", flush=True)
    return results


def in_process(rows: int, rounds: int) -> None:
    """Seconds (best of ``rounds``) the sink's Python takes for ``rows``: Arrow batch to records (avro-registry,
    as its Arrow writers do) against Spark's rows to records (bytes)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import Row

    from onceflow.spark_sinks.datasource import _rows
    from onceflow.spark_sinks.options import parse
    from onceflow.spark_sinks.rows import RowMapping

    values = [{"id": i, "customer": f"customer-{i % 1000}", "amount": i * 0.25, "tags": ["new", f"batch-{i % 7}"]}
              for i in range(rows)]
    kind = pa.struct([("id", pa.int64()), ("customer", pa.string()), ("amount", pa.float64()),
                      ("tags", pa.list_(pa.string()))])
    batch = pa.RecordBatch.from_arrays([pa.array([str(i) for i in range(rows)]), pa.array(values, type=kind)],
                                       names=["key", "value"])
    spark_rows = [Row(key=str(i), value=json.dumps(v, separators=(",", ":")).encode()) for i, v in enumerate(values)]
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite://{tmp}/bench.db")
        registry = SchemaRegistry(store)
        server = RegistryServer(registry, port=0).start()
        with contextlib.closing(store), contextlib.closing(registry), contextlib.closing(server):
            registry.register("orders-value", "AVRO", ORDER, [])
            given = {"store.url": store.url, "topic": "orders", "job.id": "bench"}
            registry_rows = RowMapping.of(parse({**given, "value.format": "avro-registry",
                                                 "schema.registry.url": server.url}), ["key", "value"])
            bytes_rows = RowMapping.of(parse({**given, "value.format": "bytes"}), ["key", "value"])
            plain = list(_rows(iter([batch])))
            timings = {
                "bytes: Spark's rows to records": lambda: [bytes_rows.record(r) for r in spark_rows],
                "avro-registry: Arrow batch to rows": lambda: list(_rows(iter([batch]))),
                "avro-registry: rows to records": lambda: [registry_rows.record(r) for r in plain],
                "avro-registry: Arrow batch to records": lambda: [registry_rows.record(r)
                                                                  for r in _rows(iter([batch]))],
            }
            best = {name: min(_seconds(call) for _ in range(rounds)) for name, call in timings.items()}
    for name, seconds in best.items():
        print(f"{name}: {seconds / rows * 1e6:.2f} us a row")
    baseline = (rows, best["bytes: Spark's rows to records"])
    report("spark_registry_formats_in_process", [
        row(f"in process, {name}", rows, seconds, *(() if name.startswith("bytes") else ("bytes", baseline)))
        for name, seconds in best.items()], {"rows": rows, "rounds": rounds})


def _seconds(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
