"""Spark: rows/s of the exactly-once streaming sink against a plain at-least-once Python sink, same session.

Both queries read the same onceflow stream (the onceflow source, so reading costs the same) and write the same
rows to the same embedded store: the plain sink appends each task's rows straight to the target partitions
and commits nothing (a failed batch replays as duplicates); the exactly-once sink stages them in task
transactions and the driver commits the batch (txn.sink). Each sink runs ``--rounds`` times, alternating, and
the best round counts, with the ratio's min/median/max over the rounds; Spark's own ``noop`` sink runs beside them,
to show how much of the time is Spark itself; one small query first warms the session up. Then the main job end to end
(``python -m onceflow.demos.pipeline``: five Spark starts, a driver crash and restart, verification), as
orders/s over its wall time.

    python bench/spark_sink.py [--rows 200000] [--rounds 3] [--pipeline-orders 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _report import report, row

from onceflow.connector.store import Record, open_store

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from onceflow import spark_sinks

PLAIN = "onceflow_plain_bench"
FORMATS = (PLAIN, "onceflow", "noop")  # noop: Spark's own sink that writes nothing


class PlainSink(DataSource):
    """The baseline: each task appends its rows to the store as they come; no transaction, no commit."""

    @classmethod
    def name(cls) -> str:
        return "onceflow_plain_bench"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return PlainWriter(self.options["store.url"], self.options["topic"])


class PlainWriter(DataSourceStreamWriter):
    def __init__(self, url: str, topic: str) -> None:
        self.url, self.topic = url, topic

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        store = open_store(self.url)
        writer = store.open_writer()
        partitions = store.describe_stream(self.topic).current.partitions
        partition = partitions[(TaskContext.get().partitionId() if TaskContext.get() else 0) % len(partitions)]
        chunk: list[Record] = []
        for r in iterator:
            chunk.append(Record(r["key"], r["value"]))
            if len(chunk) == 5000:
                writer.append(self.topic, partition, chunk)
                chunk = []
        if chunk:
            writer.append(self.topic, partition, chunk)
        store.close()
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:
        """At-least-once: the rows are already in the store."""


def fill(url: str, stream: str, rows: int) -> None:
    store = open_store(url)
    store.create_stream(stream, 4)
    writer = store.open_writer()
    value = b"v" * 100
    for p in range(4):
        ids = range(p, rows, 4)
        for first in range(0, len(ids), 5000):
            writer.append(stream, p, [Record(f"k{i}".encode(), value) for i in ids[first:first + 5000]])
    store.close()


def run_query(spark: Any, url: str, source: str, fmt: str, target: str, checkpoint: str) -> float:
    open_store(url).create_stream(target, 4)
    rows = spark.readStream.format("onceflow").option("store.url", url).option("topic", source).load()
    writer = (rows.select("key", "value").writeStream.format(fmt).option("store.url", url).option("topic", target)
              .option("checkpointLocation", checkpoint).trigger(availableNow=True))
    if fmt == "onceflow":
        writer = writer.option("sink.id", target.replace(".", "-"))
    started = time.perf_counter()
    writer.start().awaitTermination()
    return time.perf_counter() - started


def pipeline_rate(orders: int, directory: Path) -> tuple[int, float]:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "onceflow.demos.pipeline", "--orders", str(orders), "--dir",
                    str(directory / "pipeline")], check=True, capture_output=True)
    return orders, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pipeline-orders", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite://{tmp}/bench.db"
        fill(url, "src", args.rows)
        fill(url, "warmup", 2_000)
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark_sinks.register(spark)
        spark.dataSource.register(PlainSink)
        run_query(spark, url, "warmup", "onceflow", "warm", f"{tmp}/ck-warm")
        seconds: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
        for n in range(args.rounds):
            for fmt in FORMATS:  # alternating, so that each sees the same load
                seconds[fmt].append(run_query(spark, url, "src", fmt, f"out-{fmt}-{n}", f"{tmp}/ck-{fmt}-{n}"))
        spark.stop()
        pipeline = pipeline_rate(args.pipeline_orders, Path(tmp))
    plain = (args.rows, min(seconds[PLAIN]))
    per_round = sorted(p / e for p, e in zip(seconds[PLAIN], seconds["onceflow"], strict=True))
    rows = [row("exactly-once streaming sink (best round)", args.rows, min(seconds["onceflow"]),
                "plain at-least-once Python sink", plain),
            row("Spark's noop sink (best round: Spark alone)", args.rows, min(seconds["noop"]),
                "plain at-least-once Python sink", plain),
            row("main pipeline end to end (5 Spark starts, crash, restart)", *pipeline)]
    spread = {"min": per_round[0], "median": statistics.median(per_round), "max": per_round[-1]}
    print("exactly-once / plain, round by round: " + ", ".join(f"{k} {v:.2f}" for k, v in spread.items()))
    report("spark_sink", rows, {"rows": args.rows, "rounds": args.rounds, "pipeline_orders": args.pipeline_orders,
                                "exactly_once_vs_plain_per_round": spread})


if __name__ == "__main__":
    main()
