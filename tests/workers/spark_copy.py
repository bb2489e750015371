"""A Spark streaming query copying one onceflow stream to another exactly once, until the input is consumed.

Usage: spark_copy.py STORE_URL SOURCE TARGET SINK_ID CHECKPOINT MAX_RECORDS_PER_BATCH
Runs Spark in local mode with task retries (local[2,4]); a crash-session failpoint kills this whole driver.
"""

from __future__ import annotations

import os
import sys

from onceflow.connector.failpoints import allow_session_crash

SPARK_STARTS = 3
WORKER_TIMEOUT = "Python worker failed to connect back"


def main(url: str, source: str, target: str, sink_id: str, checkpoint: str, per_batch: str) -> None:
    allow_session_crash()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    from onceflow import spark_sinks

    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_sinks.register(spark)
    rows = (spark.readStream.format("onceflow").option("store.url", url).option("topic", source)
            .option("max.records.per.batch", per_batch).load())
    for attempt in range(1, SPARK_STARTS + 1):
        query = (rows.select("key", "value").writeStream.format("onceflow").option("store.url", url)
                 .option("topic", target).option("sink.id", sink_id).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
            break
        except StreamingQueryException as exc:
            # Spark gives a Python worker it starts 10 s to connect back (PythonWorkerFactory, not configurable):
            # on a loaded machine that fails now and then. Restarted from its checkpoint, as its supervisor would:
            # exactly once holds across restarts, which is what the tests check.
            if WORKER_TIMEOUT not in str(exc) or attempt == SPARK_STARTS:
                raise
            print(f"spark_copy: restarting the query after Spark's worker timeout ({attempt})", file=sys.stderr)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
