"""Exactly-once output from ``foreachBatch``: each ``(batch_df, batch_id)`` is published at most once per query,
in batch order, with the same protocol as the data source (see :mod:`onceflow.txn.sink`)::

    query = df.writeStream.foreachBatch(spark_sinks.exactly_once_batches({
        "store.url": "sqlite:///data/app.db", "topic": "out", "sink.id": "orders-enriched"})).start()

It uses only Spark's core API (an RDD pass over the batch), so it also runs on Spark 3.x.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from onceflow.connector.errors import ErrorCode, fail
from onceflow.spark_sinks.options import parse
from onceflow.spark_sinks.rows import RowMapping
from onceflow.spark_sinks.tasks import commit_parts, stage_rows


def exactly_once_batches(options: Mapping[str, str]) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to ``topic`` exactly once (``sink.id`` required)."""
    parsed = parse(options)
    sink_id = parsed.sink_id
    if sink_id is None:
        fail(ErrorCode.INVALID_CONFIG, "onceflow: exactly_once_batches needs option 'sink.id'")

    def write(batch_df: Any, batch_id: int) -> None:
        mapping = RowMapping.of(parsed, batch_df.columns)
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        staged = batch_df.rdd.mapPartitions(
            lambda rows: [stage_rows(parsed, mapping, sink_id, batch_id, rows)[0]]).collect()
        commit_parts(parsed, sink_id, batch_id, staged, query_id)

    return write
