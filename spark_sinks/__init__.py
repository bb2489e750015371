"""onceflow on Spark: the ``onceflow`` data source (an exactly-once sink and a source) and a ``foreachBatch``
helper. ``register(spark)`` once per session, then ``format("onceflow")``::

    spark_sinks.register(spark)
    (df.writeStream.format("onceflow").option("store.url", "sqlite:///data/app.db").option("topic", "out")
       .option("sink.id", "orders-enriched").option("checkpointLocation", "/data/ckpt").start())

Spark's Python workers must import onceflow: ``PYSPARK_PYTHON`` names the interpreter it is installed in
(:func:`register` sets it to the current one when unset, before the session's first worker starts).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def register(spark: Any) -> None:
    """Make ``format("onceflow")`` available in ``spark``'s session."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from onceflow.spark_sinks.datasource import OnceflowDataSource

    spark.dataSource.register(OnceflowDataSource)


def exactly_once_batches(options: dict[str, str]) -> Any:
    """See :func:`onceflow.spark_sinks.foreach_batch.exactly_once_batches`."""
    from onceflow.spark_sinks.foreach_batch import exactly_once_batches as make

    return make(options)


__all__ = ["exactly_once_batches", "register"]
