"""The exactly-once sink protocol of Spark writes, without Spark (txn.sink): batch order, replays, gaps, task
attempts that are not named, and one query per sink id; on every backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from onceflow import txn
from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import PartitionState, Record, Store, Writer, read_stream
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.spark_sinks import tasks
from onceflow.spark_sinks.options import parse
from onceflow.spark_sinks.rows import RowMapping
from onceflow.txn import log_codec, merge
from onceflow.txn.sink import ExactlyOnceSink, SinkTask, StagedPart, progress_group


@pytest.fixture
def group(store: Store) -> Iterator[txn.TransactionGroup]:
    store.create_stream("out", 2)
    g = txn.open_group({"store.url": store.url, "transaction.group": "spark-s1"})
    yield g
    g.close()


def part(group: txn.TransactionGroup, batch: int, name: str, count: int = 3) -> StagedPart:
    task = SinkTask(group, "s1", batch, f"s1-b{batch}-{name}", 60_000)
    for i in range(count):
        task.produce("out", Record(f"k{i}".encode(), f"{batch}/{name}/{i}".encode()))
    staged = task.finish()
    assert staged is not None
    return staged


def published(store: Store) -> list[bytes | None]:
    return sorted(m.value() for m in read_stream(store, "out"))


def expected(*parts: tuple[int, str]) -> list[bytes]:
    return sorted(f"{b}/{n}/{i}".encode() for b, n in parts for i in range(3))


def code_of(fn, *args) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaException) as info:
        fn(*args)
    return info.value.code


def test_batches_commit_in_order_with_exactly_the_named_task_attempts(store: Store,
                                                                      group: txn.TransactionGroup) -> None:
    sink = ExactlyOnceSink(group, store, "s1", "out")
    failed_attempt = part(group, 0, "p0a0")  # a task attempt that failed: Spark never reports it
    assert sink.commit_batch(0, [part(group, 0, "p0a1"), part(group, 0, "p1a0"), None], "q1")
    assert sink.next_batch() == 1
    assert sink.commit_batch(1, [part(group, 1, "p0a0")], "q1")
    assert published(store) == expected((0, "p0a1"), (0, "p1a0"), (1, "p0a0"))
    assert group.outcome(failed_attempt.txn_id) is txn.Outcome.ABORTED  # ended with its batch, staging freed


def test_a_replayed_batch_publishes_nothing_and_a_gap_is_refused(store: Store, group: txn.TransactionGroup) -> None:
    sink = ExactlyOnceSink(group, store, "s1", "out")
    assert sink.commit_batch(4, [part(group, 4, "p0")], "q1")  # a sink's first batch may have any number
    replay = part(group, 4, "p0-replay")
    assert not sink.commit_batch(4, [replay], "q1")
    assert group.outcome(replay.txn_id) is txn.Outcome.ABORTED
    assert code_of(sink.commit_batch, 6, [part(group, 6, "p0")], "q1") == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert published(store) == expected((4, "p0")) and sink.next_batch() == 5


def test_a_batch_older_than_the_last_committed_one_is_refused(store: Store, group: txn.TransactionGroup) -> None:
    """Only the last committed batch is ever replayed. An older one comes from a checkpoint older than the sink:
    Spark plans it again from where that checkpoint ends, wider than the first time, and taken for a replay its
    new rows were never published."""
    sink = ExactlyOnceSink(group, store, "s1", "out")
    for batch in range(3):
        assert sink.commit_batch(batch, [part(group, batch, "p0")], "q1")
    assert not sink.commit_batch(2, [part(group, 2, "replay")], "q1")
    assert code_of(sink.commit_batch, 1, [part(group, 1, "wider")], "q1") == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert published(store) == expected((0, "p0"), (1, "p0"), (2, "p0")) and sink.next_batch() == 3


def test_a_sink_into_a_stream_that_does_not_exist_is_refused(store: Store, group: txn.TransactionGroup) -> None:
    """Its rows would be staged, and dropped by the merge, the batch reported committed."""
    assert code_of(ExactlyOnceSink, group, store, "s1", "ordres") == ErrorCode.UNKNOWN_TOPIC_OR_PART
    store.create_stream("gone", 1)
    sink = ExactlyOnceSink(group, store, "s1", "gone")
    store.delete_stream("gone")
    assert code_of(sink.commit_batch, 0, [part(group, 0, "p0")], "q1") == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert published(store) == []


def test_a_sink_id_belongs_to_one_query(store: Store, group: txn.TransactionGroup) -> None:
    ExactlyOnceSink(group, store, "s1", "out").commit_batch(0, [part(group, 0, "p0")], "query-a")
    other = ExactlyOnceSink(group, store, "s1", "out")
    assert code_of(other.commit_batch, 1, [part(group, 1, "p0")], "query-b") == ErrorCode.SINK_ID_IN_USE
    assert published(store) == expected((0, "p0"))


def test_a_sink_id_keeps_the_transaction_group_it_began_with(store: Store, group: txn.TransactionGroup) -> None:
    """A batch committed in the first group and not merged yet (its driver died) is not seen by another group's
    merge: committed there again, it was published twice once the first group merged."""
    ExactlyOnceSink(group, store, "s1", "out").commit_batch(0, [part(group, 0, "p0")], "q1")
    other = txn.open_group({"store.url": store.url, "transaction.group": "spark-other"})
    moved = ExactlyOnceSink(other, store, "s1", "out")
    assert code_of(moved.commit_batch, 1, [part(other, 1, "p0")], "q1") == ErrorCode.INVALID_CONFIG
    other.close()
    assert published(store) == expected((0, "p0"))


def test_a_task_transaction_that_timed_out_fails_the_batch_and_publishes_nothing(
        store: Store, group: txn.TransactionGroup) -> None:
    task = SinkTask(group, "s1", 0, "s1-b0-p0", 1)  # a 1 ms timeout
    task.produce("out", Record(None, b"late"))
    staged = task.finish()
    group.expire()
    assert code_of(ExactlyOnceSink(group, store, "s1", "out").commit_batch, 0, [staged], "q1") in (
        ErrorCode.TRANSACTION_TIMED_OUT, ErrorCode.INVALID_TXN_STATE)
    assert published(store) == []


def test_bad_sink_ids_are_refused(store: Store, group: txn.TransactionGroup) -> None:
    assert code_of(ExactlyOnceSink, group, store, "has space", "out") == ErrorCode.INVALID_CONFIG


def test_a_long_running_sink_keeps_only_its_newest_progress_record(
        store: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch stores the sink's progress as a record of its own stream; a query running for months commits
    millions of batches: the records the newest supersedes are cut, and the sink goes on where it was."""
    monkeypatch.setattr(merge, "_KEPT_CUT_EVERY", 4)
    sink = ExactlyOnceSink(group, store, "s1", "out")
    for batch in range(12):
        assert sink.commit_batch(batch, [part(group, batch, "p0", count=1)], "q1")
    kept = store.partition_state(progress_group("s1"), 0)
    assert kept.start_offset > 0
    assert kept.end_offset - kept.start_offset <= 2 * 8  # what four batches (and Kafka's commit markers) add
    assert ExactlyOnceSink(group, store, "s1", "out").next_batch() == 12
    assert not sink.commit_batch(11, [part(group, 11, "replay", count=1)], "q1")


def test_the_tasks_of_a_worker_reuse_store_writers_only_where_a_session_outlives_its_close(
        store: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Kafka, in a Python worker Spark reuses, one store writer serves its tasks in turn (an idempotent producer
    each: one per task attempt gave the brokers a producer id per task, kept for a day); one a failed task used is
    closed, never lent again. On the embedded store, and without reuse, each task closes the writer it used (an
    unclosed one keeps its rows for good). An empty task opens none."""
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    options = parse({"store.url": store.url, "topic": "out", "sink.id": "s1"})
    monkeypatch.setitem(tasks._GROUPS, (store.url, options.group_name), group)
    idle: list[Writer] = []
    monkeypatch.setitem(tasks._IDLE_WRITERS, (group.store.url, group.name), idle)
    opened: list[Writer] = []
    open_writer = group.store.open_writer

    def counted(*args: object) -> Writer:
        opened.append(open_writer(*args))  # type: ignore[arg-type]
        return opened[-1]

    def closed(writer: Writer) -> bool:
        return code_of(writer.append, "out", 0, [Record(None, b"x")]) == ErrorCode._STATE

    monkeypatch.setattr(group.store, "open_writer", counted)
    mapping = RowMapping.of(options, ["key", "value", "partition"])

    def stage(batch: int, partition: int = 0) -> StagedPart | None:
        return tasks.stage_rows(options, mapping, "s1", batch, iter([
            {"key": b"k", "value": b"%d" % batch, "partition": partition}]))[0]

    assert tasks.stage_rows(options, mapping, "s1", 0, iter([])) == (None, "")
    assert opened == []  # an empty task (most of a sparse batch's) opens no writer
    reused = store.writer_sessions_outlive_close
    parts = [stage(batch) for batch in range(3)]  # (the driver's commits open writers of their own)
    with pytest.raises(KafkaException):
        stage(3, partition=-1)
    parts.append(stage(3))
    assert len(opened) == (2 if reused else 5)  # reused: the failed task's writer was closed, not lent again
    monkeypatch.delenv("SPARK_REUSE_WORKER")  # a worker serving one task: it closes the writer it used
    parts.append(stage(4))
    assert [closed(w) for w in opened] == ([True, True] if reused else [True] * 6)
    sink = ExactlyOnceSink(group, store, "s1", "out")
    assert all(sink.commit_batch(batch, [part], "q1") for batch, part in enumerate(parts))
    assert published(store) == [b"0", b"1", b"2", b"3", b"4"]
    for writer in idle:
        writer.close()


def test_a_task_whose_rows_fail_aborts_its_transaction_at_once(store: Store, group: txn.TransactionGroup,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark task whose rows fail after it staged some (here a bad partition number) aborts its transaction at
    once: it was left open until its timeout, pinning the commit log (its writer, left open too, is checked
    closed above)."""
    options = parse({"store.url": store.url, "topic": "out", "sink.id": "s1"})
    monkeypatch.setitem(tasks._GROUPS, (store.url, options.group_name), group)
    rows = iter([{"key": b"k", "value": b"good", "partition": 0}, {"key": b"k", "value": b"bad", "partition": -1}])
    with pytest.raises(KafkaException) as info:
        tasks.stage_rows(options, RowMapping.of(options, ["key", "value", "partition"]), "s1", 0, rows)
    assert info.value.code == ErrorCode.INVALID_RECORD
    kinds = [r.kind for m in read_stream(store, group.log_stream) for r in log_codec.decode(m.value() or b"", "e")]
    assert kinds == [TransactionMetadataEntry.BEGIN, TransactionMetadataEntry.ABORT]


def test_ending_a_batch_writes_no_fence_mark_in_the_log(store: Store, group: txn.TransactionGroup) -> None:
    """A batch's end aborts its task attempts left open, and marks nothing more in the log: a fence mark (a
    producer's new instance writes one) stops one-step commits, which the sink's tasks never make, and would cost a
    log entry and a read of the log to its end every batch."""
    sink = ExactlyOnceSink(group, store, "s1", "out")
    left_open = part(group, 0, "p0a0")
    for batch in range(3):
        assert sink.commit_batch(batch, [part(group, batch, "p0a1")], "q1")
    entries = [log_codec.decode(m.value() or b"", "log entry") for m in read_stream(store, group.log_stream)]
    assert [r.txn_id for entry in entries for r in entry if r.txn_id.startswith("fence.")] == []
    assert group.outcome(left_open.txn_id) is txn.Outcome.ABORTED


def test_a_replay_is_known_as_one_while_the_sinks_offsets_record_is_not_readable_yet(
        store: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge writes the sink's offsets record in one Kafka transaction with its progress, whose markers are
    written one partition after the other: a driver may see the progress moved (another process merged the batch)
    and not yet the record. Read then, a replayed batch looked like the next one and was published twice."""
    if not store.url.startswith("kafka://"):
        pytest.skip("the embedded store's records are readable once stored: no such window")
    sink = ExactlyOnceSink(group, store, "s1", "out")
    assert sink.commit_batch(0, [part(group, 0, "p0")], "q1")
    partition_state, unreadable_for = type(store).partition_state, [3]

    def record_not_readable_yet(s: Store, stream: str, partition: int) -> PartitionState:
        state = partition_state(s, stream, partition)
        if stream == progress_group("s1") and unreadable_for[0]:
            unreadable_for[0] -= 1
            return dataclasses.replace(state, end_offset=state.start_offset)
        return state

    monkeypatch.setattr(type(store), "partition_state", record_not_readable_yet)
    assert not sink.commit_batch(0, [part(group, 0, "p0-replay")], "q1")
    assert published(store) == expected((0, "p0")) and unreadable_for == [0]
