"""The two halves of an exactly-once Spark write, shared by the data source and the ``foreachBatch`` helper:
a task stages its rows (:func:`stage_rows`), the driver commits the batch (:func:`commit_parts`).

Only ``pyspark``'s core is used here, so the ``foreachBatch`` helper also runs where Spark has no Python data
sources (Spark 3.x).

Thread safety: a Python worker may run several tasks at once in threads. They share one ``TransactionGroup`` and
one ``Store`` per URL (both thread-safe), opened once under a lock; each task has its own ``SinkTask`` and
staging writer, which are not shared. Where a writer's session outlives its close (Kafka: each writer is an
idempotent producer, and one per task attempt gave the brokers a new producer id per task, kept for
``producer.id.expiration.ms``, a day: a known way to run a broker out of memory under a query committing a batch
a second) and Spark reuses its Python workers (``spark.python.worker.reuse``, the default), the store writers the
tasks stage through are lent out one task at a time and kept for the worker's next tasks. Elsewhere each task
closes its writer: on the embedded store closing deletes its rows, and a worker Spark kills closes nothing.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark import TaskContext

from onceflow import txn
from onceflow.connector.store import Store, Writer, open_store
from onceflow.spark_sinks.options import OnceflowOptions
from onceflow.spark_sinks.rows import RowMapping
from onceflow.txn.sink import ExactlyOnceSink, SinkTask, StagedPart

_GROUPS: dict[tuple[str, str], txn.TransactionGroup] = {}  # per Python worker: opened once, reused by its tasks
_STORES: dict[str, Store] = {}
_IDLE_WRITERS: dict[tuple[str, str], list[Writer]] = {}  # per group: store writers no task holds now
_NO_ROWS = object()  # what next() gives for a task without rows
_OPENING = threading.Lock()  # one check-then-open at a time: two tasks never open the same group or store twice


def group_of(options: OnceflowOptions) -> txn.TransactionGroup:
    """This worker's group for the options' store and group name, opened by the first task that needs it."""
    key = (options.store_url, options.group_name)
    with _OPENING:
        if key not in _GROUPS:
            _GROUPS[key] = txn.open_group({"store.url": options.store_url, "transaction.group": options.group_name})
        return _GROUPS[key]


def store_of(url: str) -> Store:
    """This worker's store for ``url``, opened by the first task that needs it."""
    with _OPENING:
        if url not in _STORES:
            _STORES[url] = open_store(url)
        return _STORES[url]


def stage_rows(options: OnceflowOptions, mapping: RowMapping, sink_id: str, batch_id: int,
               rows: Iterator[Any]) -> tuple[StagedPart | None, str]:
    """A task: stage its rows of batch ``batch_id`` in a transaction of its own; (its part, its query id)."""
    context = TaskContext.get()
    partition, attempt = (context.partitionId(), context.attemptNumber()) if context else (0, 0)
    query_id = (context.getLocalProperty("sql.streaming.queryId") if context else None) or ""
    writer_id = f"{sink_id}-b{batch_id}-p{partition}-a{attempt}-{uuid.uuid4().hex[:8]}"
    rows = iter(rows)
    first = next(rows, _NO_ROWS)
    if first is _NO_ROWS:  # an empty task (most of a sparse batch's): no transaction, no writer
        return None, query_id
    rows = itertools.chain([first], rows)
    group = group_of(options)
    store_writer = _borrow_writer(group)
    task = SinkTask(group, sink_id, batch_id, writer_id, options.transaction_timeout_ms, store_writer)
    try:
        for row in rows:
            record, target = mapping.record(row)
            task.produce(options.topic, record, target)
        part = task.finish()
    except BaseException:  # a row that cannot be mapped, the input failing, the task killed: nothing is committed
        task.abandon()
        store_writer.close()  # never lent again: a failure may have left it unusable
        raise
    if group.store.writer_sessions_outlive_close and os.environ.get("SPARK_REUSE_WORKER"):  # set by Spark
        _return_writer(group, store_writer)
    else:
        store_writer.close()
    return part, query_id


def _borrow_writer(group: txn.TransactionGroup) -> Writer:
    """A store writer of ``group``'s store for one task: an idle one, or a new one."""
    with _OPENING:
        idle = _IDLE_WRITERS.get((group.store.url, group.name))
        if idle:
            return idle.pop()
    return group.store.open_writer()


def _return_writer(group: txn.TransactionGroup, writer: Writer) -> None:
    """Keep the writer of a task that finished for the worker's next task."""
    with _OPENING:
        _IDLE_WRITERS.setdefault((group.store.url, group.name), []).append(writer)


def sink_of(options: OnceflowOptions, sink_id: str) -> ExactlyOnceSink:
    group = group_of(options)
    return ExactlyOnceSink(group, group.store, sink_id, options.topic)


def commit_parts(options: OnceflowOptions, sink_id: str, batch_id: int, parts: Sequence[StagedPart | None],
                 query_id: str | None) -> bool:
    """The driver: commit a batch with exactly the parts of the tasks Spark reported; False for a replay."""
    return sink_of(options, sink_id).commit_batch(batch_id, parts, query_id or f"sink:{sink_id}")
