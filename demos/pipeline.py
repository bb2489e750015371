"""The main job: a Spark Structured Streaming pipeline on the embedded store, crashed and restarted, verified.

1. Generated orders go to the stream ``orders``.
2. A streaming query (the ``onceflow`` source and sink) enriches each order (its total and a size class) into
   ``orders_enriched``, exactly once; it runs over the first half of the orders.
3. The second half arrives; the query runs again with the failpoint ``sink.batch.before_commit`` armed: its
   tasks stage their rows, then the whole driver (Python and JVM) is killed before it commits the batch.
4. The query restarts from its checkpoint and finishes.
5. A batch job aggregates the enriched orders per customer into ``customer_totals`` (``job.id``); it runs
   twice, and the second run publishes nothing.
6. The streams are read back and checked: input rows, output rows, duplicates 0, missing 0, totals exact.

Run ``python -m onceflow.demos.pipeline`` (``--help`` for the sizes). Spark's Python workers use this
interpreter (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from onceflow import txn
from onceflow.connector import Producer
from onceflow.connector.failpoints import ENV_VAR, allow_session_crash
from onceflow.connector.store import Store, open_store, read_stream
from onceflow.txn.sink import sink_owner

ORDERS, ENRICHED, TOTALS = "orders", "orders_enriched", "customer_totals"
SINK_ID = "orders-enriched"
CRASH_AT = "sink.batch.before_commit=crash-session@1"
console = Console()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onceflow.demos.pipeline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("onceflow-pipeline"), help="store and checkpoint (fresh)")
    parser.add_argument("--orders", type=int, default=20_000, help="orders to generate")
    parser.add_argument("--batch-records", type=int, default=2_500, help="records per micro-batch at most")
    parser.add_argument("--customers", type=int, default=100)
    sub = parser.add_subparsers(dest="step")
    step = sub.add_parser("stream", help="(internal) run the streaming query until the input is consumed")
    step.add_argument("store")
    step.add_argument("checkpoint")
    step.add_argument("batch_records", type=int)
    sub.add_parser("aggregate", help="(internal) run the per-customer batch job").add_argument("store")
    args = parser.parse_args(argv)
    if args.step:
        allow_session_crash()  # a Spark step leads its session: a crash-session failpoint kills its JVM too
    if args.step == "stream":
        return run_stream(args.store, args.checkpoint, args.batch_records)
    if args.step == "aggregate":
        return run_aggregate(args.store)
    return run_all(args.dir.resolve(), args.orders, args.batch_records, args.customers)


# -- the orchestration (this process never starts Spark itself) ---------------------------------------------


def run_all(directory: Path, orders: int, batch_records: int, customers: int) -> int:
    started = time.monotonic()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    url, checkpoint = f"sqlite://{directory / 'store.db'}", str(directory / "checkpoint")
    store = open_store(url)
    for name, partitions in ((ORDERS, 4), (ENRICHED, 4), (TOTALS, 2)):
        store.create_stream(name, partitions)
    half = orders // 2
    produce_orders(url, 0, half, customers)
    spark_step("streaming query over the first half", "stream", url, checkpoint, str(batch_records))
    produce_orders(url, half, orders, customers)
    crashed = spark_step("streaming query, driver killed before its commit", "stream", url, checkpoint,
                         str(batch_records), failpoints=CRASH_AT, expect_kill=True)
    console.print(f"  the driver was killed (exit {crashed}) after its tasks staged: "
                  f"{open_task_transactions(url)} task transaction(s) staged, none committed")
    spark_step("streaming query restarted from its checkpoint", "stream", url, checkpoint, str(batch_records))
    spark_step("per-customer totals (batch job, job.id totals-1)", "aggregate", url)
    spark_step("the same batch job again (must publish nothing)", "aggregate", url)
    ok = verify(store, time.monotonic() - started)
    store.close()
    return 0 if ok else 1


def produce_orders(url: str, first: int, end: int, customers: int) -> None:
    producer = Producer({"store.url": url, "linger.ms": 5})
    rng = random.Random(first)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"orders {first}..{end - 1}", total=end - first)
        for order_id in range(first, end):
            customer = f"c{rng.randrange(customers):03d}"
            order = {"order_id": order_id, "customer": customer, "qty": rng.randint(1, 5),
                     "price_cents": rng.randint(100, 10_000)}
            producer.produce(ORDERS, json.dumps(order), key=customer)
            if order_id % 1000 == 0:
                producer.poll(0)
                progress.update(task, completed=order_id - first)
        producer.flush()
    console.print(f"[green]✓[/] {end - first} orders produced to {ORDERS!r}")


def spark_step(title: str, *args: str, failpoints: str = "", expect_kill: bool = False) -> int:
    """Run one Spark step in a child process that leads its own session, so a failpoint can kill the whole
    driver (Python and JVM) at once."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, ENV_VAR: failpoints}
    started = time.monotonic()
    with console.status(f"{title} …"):
        proc = subprocess.run([sys.executable, "-m", "onceflow.demos.pipeline", *args], env=env, text=True,
                              capture_output=True, start_new_session=True)
    killed = proc.returncode == -signal.SIGKILL
    if killed != expect_kill or (not expect_kill and proc.returncode != 0):
        console.print(proc.stdout[-4000:], proc.stderr[-4000:], markup=False)
        raise SystemExit(f"{title}: exited {proc.returncode}")
    console.print(f"[green]✓[/] {title} ({time.monotonic() - started:.1f} s)")
    return proc.returncode


def open_task_transactions(url: str) -> int:
    group = txn.open_group({"store.url": url, "transaction.group": f"spark-{SINK_ID}"})
    try:
        return len([t for t in group.open_transactions() if t.owner == sink_owner(SINK_ID)])
    finally:
        group.close()


def verify(store: Store, seconds: float) -> bool:
    orders = [json.loads(v) for v in values(store, ORDERS)]
    enriched = [json.loads(v) for v in values(store, ENRICHED)]
    total_records = [json.loads(v) for v in values(store, TOTALS)]
    totals = {t["customer"]: t for t in total_records}
    seen = Counter(e["order_id"] for e in enriched)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    missing = len({o["order_id"] for o in orders} - set(seen))
    expected: dict[str, int] = Counter()
    for o in orders:
        expected[o["customer"]] += o["qty"] * o["price_cents"]
    wrong_totals = sum(1 for c, cents in expected.items() if totals.get(c, {}).get("total_cents") != cents)
    table = Table(title="verification (read back from the store)")
    for column in ("input rows", "output rows", "duplicates", "missing", "customer totals", "wrong totals",
                   "seconds"):
        table.add_column(column, justify="right")
    table.add_row(str(len(orders)), str(len(enriched)), str(duplicates), str(missing), str(len(total_records)),
                  str(wrong_totals + abs(len(total_records) - len(expected))), f"{seconds:.1f}")
    console.print(table)
    ok = duplicates == 0 and missing == 0 and len(enriched) == len(orders) and wrong_totals == 0 and (
        len(total_records) == len(expected))
    console.print("[bold green]exactly once: verified[/]" if ok else "[bold red]verification FAILED[/]")
    return ok


def values(store: Store, stream: str) -> list[bytes]:
    return [m.value() or b"" for m in read_stream(store, stream)]


# -- the Spark steps (each in its own process) ---------------------------------------------------------------


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    from onceflow import spark_sinks

    spark = (SparkSession.builder.master("local[2]").appName("onceflow-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_sinks.register(spark)
    return spark


def run_stream(url: str, checkpoint: str, batch_records: int) -> int:
    from pyspark.sql import functions as F

    spark = spark_session()
    schema = "order_id long, customer string, qty int, price_cents long"
    orders = (spark.readStream.format("onceflow").option("store.url", url).option("topic", ORDERS)
              .option("max.records.per.batch", str(batch_records)).load()
              .select(F.from_json(F.col("value").cast("string"), schema).alias("o")).select("o.*"))
    total = F.col("qty") * F.col("price_cents")
    enriched = orders.select(
        F.col("customer").alias("key"),
        F.struct("order_id", "customer", "qty", "price_cents", total.alias("total_cents"),
                 F.when(total >= 20_000, "large").otherwise("small").alias("size")).alias("value"))
    query = (enriched.writeStream.format("onceflow").option("store.url", url).option("topic", ENRICHED)
             .option("sink.id", SINK_ID).option("value.format", "json").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    return 0


def run_aggregate(url: str) -> int:
    from pyspark.sql import functions as F

    spark = spark_session()
    schema = "order_id long, customer string, total_cents long"
    enriched = (spark.read.format("onceflow").option("store.url", url).option("topic", ENRICHED).load()
                .select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*"))
    totals = enriched.groupBy("customer").agg(F.sum("total_cents").alias("total_cents"),
                                             F.count("*").alias("orders"))
    (totals.select(F.col("customer").alias("key"), F.struct("customer", "total_cents", "orders").alias("value"))
     .write.format("onceflow").option("store.url", url).option("topic", TOTALS).option("job.id", "totals-1")
     .option("value.format", "json").mode("append").save())
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
