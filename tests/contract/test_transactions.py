"""Transactions as users rely on them, on every backend: all-or-nothing across streams, commit order, timeouts,
fencing, offsets inside a transaction, and one transaction written by several processes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from onceflow import txn
from onceflow.connector import (
    Consumer,
    ConsumerGroupMetadata,
    ErrorCode,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
    failpoints,
)
from onceflow.connector.config import StoreConfig, TransactionConfig
from onceflow.connector.partitioner import index_for_key
from onceflow.connector.store import Record, Store, Writer, open_store, read_range
from onceflow.connector.store.shared import stores
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn import expiry
from tests.conftest import next_line, start_worker


@pytest.fixture
def streams(store: Store) -> Store:
    store.create_stream("orders", 2)
    store.create_stream("payments", 1)
    return store


@pytest.fixture
def group(streams: Store) -> Iterator[txn.TransactionGroup]:
    g = txn.open_group({"store.url": streams.url, "transaction.group": "g"})
    yield g
    g.close()


def values(store: Store, stream: str) -> list[bytes | None]:
    """Every record of a stream, partition by partition, in offset order."""
    partitions = store.describe_stream(stream).partitions
    return [m.value() for p in partitions for m in read_range(store, stream, p)]


def producer(store: Store, transactional_id: str = "app", **extra: object) -> Producer:
    p = Producer({"store.url": store.url, "transactional.id": transactional_id, **extra})
    p.init_transactions()
    return p


def error_of(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaException) as info:
        fn(*args)
    return info.value.code.name


def test_a_commit_makes_records_in_two_streams_visible_together(streams: Store) -> None:
    p = producer(streams)
    p.begin_transaction()
    for i in range(5):
        p.produce("orders", f"order-{i}", key=f"k{i}")
    p.produce("payments", "payment-1", partition=0)
    p.flush()  # staged, not published
    assert values(streams, "orders") == [] and values(streams, "payments") == []
    p.commit_transaction()
    assert sorted(values(streams, "orders")) == [f"order-{i}".encode() for i in range(5)]
    assert values(streams, "payments") == [b"payment-1"]


def test_aborted_records_are_never_visible(streams: Store) -> None:
    p = producer(streams)
    p.begin_transaction()
    p.produce("orders", "lost", key="k")
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.produce("orders", "kept", key="k")
    p.commit_transaction()
    assert values(streams, "orders") == [b"kept"]


def test_readers_see_transactions_in_commit_order_not_begin_order(streams: Store,
                                                                  group: txn.TransactionGroup) -> None:
    first, second = group.begin(60_000), group.begin(60_000)
    writers = {t: group.writer(t, "w") for t in (first, second)}
    for t, writer in writers.items():
        for i in range(3):
            writer.produce("payments", Record(None, f"{t}/{i}".encode()), 0)
    group.commit(second, [writers[second].participant()])  # type: ignore[list-item]
    group.commit(first, [writers[first].participant()])  # type: ignore[list-item]
    assert values(streams, "payments") == [f"{t}/{i}".encode() for t in (second, first) for i in range(3)]


def test_an_open_transaction_does_not_hold_back_readers(streams: Store) -> None:
    others = 2000 if streams.url.startswith("sqlite") else 50  # a Kafka transaction costs a few round trips
    long_running = producer(streams, "long", **{"transaction.timeout.ms": 3_600_000})
    long_running.begin_transaction()
    long_running.produce("payments", "late", partition=0)
    long_running.flush()
    short = producer(streams, "short")
    for i in range(others):
        short.begin_transaction()
        short.produce("payments", f"quick-{i}", partition=0)
        short.commit_transaction()
    assert values(streams, "payments") == [f"quick-{i}".encode() for i in range(others)]
    long_running.commit_transaction()
    assert values(streams, "payments")[-1] == b"late"


def test_a_timed_out_transaction_aborts_and_its_late_commit_loses(streams: Store) -> None:
    p = producer(streams, **{"transaction.timeout.ms": 2000})  # the next transaction must fit in it on a slow machine
    p.begin_transaction()
    p.produce("orders", "too late", key="k")
    time.sleep(2.2)
    assert error_of(p.commit_transaction) == "TRANSACTION_TIMED_OUT"
    assert values(streams, "orders") == []
    p.begin_transaction()  # the producer goes on with a new transaction
    p.produce("orders", "in time", key="k")
    p.commit_transaction()
    assert values(streams, "orders") == [b"in time"]


def test_producers_of_one_process_share_their_group_until_the_last_one_closes(streams: Store) -> None:
    """Producers of one process that name the same group share it (one batched log, one merge): closing one
    leaves the others committing, and the last one stops the group's threads."""
    shared = {"transaction.group": "shared"}
    first, second = producer(streams, "first", **shared), producer(streams, "second", **shared)
    for p in (first, second, first):
        p.begin_transaction()
        p.produce("orders", "staged", key="k")
        p.flush()  # staged: through the group's batched log writer and merge
        p.commit_transaction()
    first.close()
    second.begin_transaction()
    second.produce("orders", "after the first closed", key="k")
    second.commit_transaction()
    assert values(streams, "orders") == [b"staged"] * 3 + [b"after the first closed"]
    second.close()
    assert [t.name for t in threading.enumerate() if t.name.endswith("-shared")] == []


def test_offsets_sent_in_a_transaction_move_only_if_it_commits(streams: Store) -> None:
    consumer = Consumer({"store.url": streams.url, "group.id": "copier", "auto.offset.reset": "earliest"})
    p = producer(streams)
    position = [TopicPartition("payments", 0, 7)]
    p.begin_transaction()
    p.produce("orders", "copied", key="k")
    p.send_offsets_to_transaction(position, consumer.consumer_group_metadata())
    p.abort_transaction()
    assert consumer.committed([TopicPartition("payments", 0)])[0].offset < 0
    p.begin_transaction()
    p.produce("orders", "copied", key="k")
    p.send_offsets_to_transaction(position, consumer.consumer_group_metadata())
    p.commit_transaction()
    assert consumer.committed([TopicPartition("payments", 0)])[0].offset == 7
    assert values(streams, "orders") == [b"copied"]
    consumer.close()


def test_offsets_for_a_partition_that_does_not_exist_are_refused_and_the_transaction_goes_on(streams: Store) -> None:
    p = producer(streams)
    group = ConsumerGroupMetadata("copier")
    p.begin_transaction()
    p.produce("orders", "copied", key="k")
    for missing in (TopicPartition("nowhere", 0, 3), TopicPartition("payments", 5, 3)):
        assert error_of(p.send_offsets_to_transaction, [TopicPartition("payments", 0, 7), missing],
                        group) == "UNKNOWN_TOPIC_OR_PART"
    p.commit_transaction()
    assert values(streams, "orders") == [b"copied"]
    assert streams.committed_offsets("copier", [("payments", 0)]) == {}


def test_offsets_of_a_partition_a_scale_added_are_committed_by_the_merge(streams: Store) -> None:
    """The merge knew the input stream from before its scale, and dropped the new partitions' offsets as those of
    partitions that do not exist: the group's next member read them again from their start."""
    p = producer(streams, **{"batch.num.messages": 1})  # records staged: the merge commits the offsets
    for partition, offset in ((0, 5), (1, 7)):
        p.begin_transaction()
        p.produce("orders", "copied", key="k")
        p.send_offsets_to_transaction([TopicPartition("payments", partition, offset)], ConsumerGroupMetadata("copier"))
        p.commit_transaction()
        if partition == 0:
            streams.scale_stream("payments", 2)  # payments[1] and payments[2] follow payments[0]
    assert streams.committed_offsets("copier", [("payments", 0), ("payments", 1)]) == {("payments", 0): 5,
                                                                                         ("payments", 1): 7}
    p.close()


def test_a_merge_right_after_a_one_step_commit_finds_nothing_to_do(group: txn.TransactionGroup,
                                                                    streams: Store) -> None:
    """On Kafka the log's view moves past the commit marker after its own one-step entry: a merge asked to reach
    that end passed again and again (each pass storing a progress record), then failed."""
    writer = streams.open_writer()
    assert group.commit_at_once({("payments", 0): [(b"k", b"paid", None, 1)]}, writer) is not None
    group.merge()
    before = streams.partition_state(group.progress_stream, 0).end_offset
    group.merge()
    assert streams.partition_state(group.progress_stream, 0).end_offset == before
    assert values(streams, "payments") == [b"paid"]
    writer.close()


def test_an_aborted_or_committed_transaction_leaves_nothing_open_in_the_log(streams: Store) -> None:
    """On Kafka a transaction's BEGIN is written when it begins (its commit then does not wait for it): aborting
    it must end it in the log, else it would hold back truncation until its timeout."""
    p = producer(streams, **{"transaction.group": "tg"})
    view = txn.open_group({"store.url": streams.url, "transaction.group": "tg"})
    try:
        for end in (p.abort_transaction, p.commit_transaction, p.abort_transaction):
            p.begin_transaction()
            p.produce("orders", "r", key="k")
            end()
            assert view.open_transactions() == []
        assert values(streams, "orders") == [b"r"]
    finally:
        view.close()


def test_a_new_instance_fences_the_old_one_and_aborts_its_transaction(streams: Store) -> None:
    zombie = producer(streams, "app")
    zombie.begin_transaction()
    zombie.produce("orders", "zombie", key="k")
    zombie.flush()
    successor = producer(streams, "app")
    assert error_of(zombie.commit_transaction) == "PRODUCER_FENCED"
    assert error_of(zombie.begin_transaction) == "PRODUCER_FENCED"
    successor.begin_transaction()
    successor.produce("orders", "successor", key="k")
    successor.commit_transaction()
    assert values(streams, "orders") == [b"successor"]


def test_misuse_of_the_transactional_api_is_refused_and_changes_nothing(streams: Store) -> None:
    p = Producer({"store.url": streams.url, "transactional.id": "app"})
    assert error_of(p.begin_transaction) == "INVALID_TXN_STATE"  # before init_transactions
    p.init_transactions()
    assert error_of(p.produce, "orders", "outside") == "INVALID_TXN_STATE"
    assert error_of(p.commit_transaction) == "INVALID_TXN_STATE"
    p.begin_transaction()
    assert error_of(p.begin_transaction) == "INVALID_TXN_STATE"
    p.abort_transaction()
    assert error_of(Producer({"store.url": streams.url}).begin_transaction) == "_NOT_CONFIGURED"  # librdkafka's
    with pytest.raises(KafkaException) as info:
        Producer({"store.url": streams.url, "transactional.id": "x", "transaction.timeout.ms": 0})
    assert info.value.code.name == "INVALID_TRANSACTION_TIMEOUT"
    assert values(streams, "orders") == []


def test_commit_or_abort_of_an_unknown_or_finished_transaction_is_refused(group: txn.TransactionGroup) -> None:
    assert error_of(group.commit, "12345.0", []) == "INVALID_TXN_STATE"
    done = group.begin(60_000)
    group.commit(done, [])
    assert error_of(group.commit, done, []) == "INVALID_TXN_STATE"
    assert error_of(group.abort, done) == "INVALID_TXN_STATE"
    assert group.outcome(done) is txn.Outcome.COMMITTED


def test_a_damaged_commit_log_entry_stops_the_group_with_a_typed_error(streams: Store,
                                                                      group: txn.TransactionGroup) -> None:
    pending = group.begin(60_000)
    writer = group.writer(pending, "w")
    writer.produce("payments", Record(None, b"never"), 0)
    participant = writer.participant()
    streams.open_writer().append(group.log_stream, 0, [Record(None, b"\xca\xfe not an entry")])
    assert error_of(group.commit, pending, [participant]) == "CORRUPT_MESSAGE"
    assert values(streams, "payments") == []


@pytest.mark.multiprocess
def test_one_transaction_written_by_several_processes(streams: Store, group: txn.TransactionGroup) -> None:
    txn_id = group.begin(120_000)
    url = streams.url
    finishing = [start_worker("txn_writer", url, "g", txn_id, f"w{i}", "orders", "25") for i in range(2)]
    failing = start_worker("txn_writer", url, "g", txn_id, "failed", "orders", "1000")
    assert next_line(failing) == {"staged": 10}  # it staged part of its records ...
    failing.kill()  # ... and died, as a failed task attempt
    failing.communicate()
    participants = []
    for proc in finishing:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        participants.append(txn.Participant(**json.loads(out.splitlines()[-1])["participant"]))
    group.commit(txn_id, participants)
    got = sorted(values(streams, "orders"))
    assert got == sorted(f"w{w}:{i}".encode() for w in range(2) for i in range(25))


def stage_by_key(group: txn.TransactionGroup, stream: str, keys: list[bytes]) -> tuple[str, txn.Participant]:
    """A transaction with one writer's records for ``stream``, staged by key (no partition named)."""
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, "w", known_open=True)
    for key in keys:
        writer.produce(stream, Record(key, key))
    participant = writer.participant()
    writer.close()
    assert participant is not None
    return txn_id, participant


def assert_routed_by_key(store: Store, stream: str, keys: list[bytes]) -> None:
    """Each key once, in the partition of the stream's current epoch its key picks."""
    current = store.describe_stream(stream).current.partitions
    landed = {p: [m.key() for m in read_range(store, stream, p)] for p in store.describe_stream(stream).partitions}
    assert sorted(k for got in landed.values() for k in got) == sorted(keys)
    for partition, got in landed.items():
        assert all(current[index_for_key(k or b"", len(current))] == partition for k in got), partition


def test_records_staged_by_key_before_a_scale_are_merged_by_key_into_the_new_epoch(
        streams: Store, group: txn.TransactionGroup) -> None:
    keys = [f"k{i}".encode() for i in range(40)]
    txn_id, participant = stage_by_key(group, "orders", keys)  # routed into the 2 partitions open then
    streams.scale_stream("orders", 3)
    group.commit(txn_id, [participant])
    assert_routed_by_key(streams, "orders", keys)


def test_a_producers_records_routed_before_a_scale_are_committed_by_key_into_the_new_epoch(streams: Store) -> None:
    """A transaction small enough to commit without staging: its records, routed by key into the partitions
    open when they were produced, are sealed out by a scale before the commit, and go by key into the new epoch
    (the merge routes them again; they reach it as the producer queued them)."""
    keys = [f"k{i}".encode() for i in range(40)]
    producer = Producer({"store.url": streams.url, "transactional.id": "scaled"})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for key in keys:
            producer.produce("orders", key, key)
        streams.scale_stream("orders", 3)
        producer.commit_transaction()
    finally:
        producer.close()
    assert_routed_by_key(streams, "orders", keys)


def test_after_a_scale_sealed_a_commit_the_producer_routes_its_next_transactions_into_the_new_epoch(
        streams: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-step commit that met a partition a scale sealed commits another way (by key, as above), and the
    producer routes its next transactions into the stream's current epoch, so they commit in one step again
    (before, every later commit of that producer met the sealed partitions and took the slower way)."""
    sealed: list[bool] = []
    one_steps = txn.TransactionGroup._one_steps

    def recorded(group: txn.TransactionGroup, steps: list[Any]) -> None:
        one_steps(group, steps)
        sealed.extend(step.sealed for step in steps)

    producer = Producer({"store.url": streams.url, "transactional.id": "rerouted"})
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("orders", b"before", b"k0")
        producer.commit_transaction()  # learns the stream's epoch
        streams.scale_stream("orders", 3)
        monkeypatch.setattr(txn.TransactionGroup, "_one_steps", recorded)
        keys = [f"k{i}".encode() for i in range(1, 4)]
        for key in keys:
            producer.begin_transaction()
            producer.produce("orders", key, key)
            producer.commit_transaction()
    finally:
        producer.close()
    assert sealed == [True, False, False]
    epochs = streams.describe_stream("orders").epochs
    assert sorted(m.value() for p in epochs[-1].partitions for m in read_range(streams, "orders", p)) == keys


def test_records_staged_for_a_stream_created_before_the_commit_are_merged_by_key(
        streams: Store, group: txn.TransactionGroup) -> None:
    keys = [f"k{i}".encode() for i in range(40)]
    txn_id, participant = stage_by_key(group, "refunds", keys)  # no such stream yet
    streams.create_stream("refunds", 3)
    group.commit(txn_id, [participant])
    assert_routed_by_key(streams, "refunds", keys)


def test_a_flush_that_landed_but_failed_and_is_flushed_again_publishes_each_record_once(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's flush stages its batches (here two: one per target partition) in one append; that append is
    stored and then reports an error. Flushing again appends the same batches, which the commit reads once."""
    if not streams.url.startswith("sqlite://"):
        pytest.skip("the failpoint after a stored append is the embedded store's")
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, "w")
    keys = [f"k{i}".encode() for i in range(20)]
    for key in keys:
        writer.produce("orders", Record(key, key))
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("sqlite.append.after_commit=raise@1"))
    with pytest.raises(KafkaException):
        writer.flush()
    participant = writer.participant()  # flushes again
    writer.close()
    assert participant is not None
    group.commit(txn_id, [participant])
    assert sorted(values(streams, "orders")) == sorted(keys)


def test_a_commit_whose_merge_failed_is_published_without_another_commit(
        group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The COMMIT is stored, then the merge after it fails (a store error): commit still returns (it committed),
    and the records become visible with no further call (the group merges again)."""
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, "w")
    for i in range(3):
        writer.produce("orders", Record(f"k{i}".encode(), f"order-{i}".encode()))
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("txn.commit.after_commit_record=raise@1"))
    group.commit(txn_id, [writer.participant()])  # type: ignore[list-item]
    deadline = time.monotonic() + 60
    while sorted(values(group.store, "orders")) != [b"order-0", b"order-1", b"order-2"]:
        assert time.monotonic() < deadline, f"never published: {values(group.store, 'orders')}"
        time.sleep(0.1)
    writer.close()


def test_a_closed_group_leaves_no_store_writer_open(streams: Store) -> None:
    tracked = WriterTracking(streams)
    group = txn.TransactionGroup(tracked, TransactionConfig(group="closing"), StoreConfig.message_max_bytes)
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, "w")
    writer.produce("orders", Record(b"k", b"v"))
    group.commit(txn_id, [writer.participant()])  # type: ignore[list-item]
    writer.close()
    group.commit_when([], lambda: True)  # a conditional commit: the group's CAS writer
    group.close()
    assert tracked.opened and tracked.still_open() == []


def test_a_group_whose_part_fails_to_close_still_closes_the_others(streams: Store,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The first error is raised after every part closed: before, a merger whose close raised left the CAS
    writer (on Kafka a transactional librdkafka producer, its threads and connections) open for good."""
    tracked = WriterTracking(streams)
    group = txn.TransactionGroup(tracked, TransactionConfig(group="closing"), StoreConfig.message_max_bytes)
    group.commit_when([], lambda: True)  # a conditional commit: the group's CAS writer
    merger_close = group._merger.close

    def failing() -> None:
        merger_close()
        raise KafkaException(KafkaError(ErrorCode._TRANSPORT, "the merger's last pass could not be stored"))

    monkeypatch.setattr(group._merger, "close", failing)
    with pytest.raises(KafkaException, match="last pass"):
        group.close()
    assert tracked.opened and tracked.still_open() == []


def test_a_closed_transactional_producer_leaves_no_store_writer_open(streams: Store,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Its fenced writer too: on Kafka a transactional librdkafka producer, whose threads lived on for as long as
    the closed Producer object was referenced. Its store is shared with its transaction group: that one's writers
    are closed with the last Producer using the group, this one."""
    opened: list[WriterTracking] = []
    monkeypatch.setattr(stores, "_open", lambda config: opened.append(WriterTracking(open_store(config))) or opened[-1])
    app = producer(streams)
    app.begin_transaction()
    app.produce("payments", b"v", partition=0)
    app.commit_transaction()
    app.close()
    app.close()  # a second close releases nothing more
    (tracked,) = opened
    assert tracked.opened and tracked.still_open() == []  # its fenced writer, its group's
    assert tracked not in stores


class WriterTracking:
    """A store that remembers the writers it opened and which of them were closed."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.opened: list[Writer] = []
        self.closed: set[int] = set()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def open_writer(self, writer_id: str | None = None, delivery_timeout_ms: int | None = None) -> Writer:
        writer = self._store.open_writer(writer_id, delivery_timeout_ms)
        self.opened.append(writer)
        close = writer.close

        def closing() -> None:
            self.closed.add(id(writer))
            close()

        writer.close = closing  # type: ignore[method-assign]
        return writer

    def still_open(self) -> list[Writer]:
        return [w for w in self.opened if id(w) not in self.closed]


@pytest.mark.multiprocess
def test_a_commit_racing_its_timeout_has_one_outcome_for_everyone(streams: Store, group: txn.TransactionGroup) -> None:
    for attempt in range(3):
        txn_id = group.begin(400)
        writer = group.writer(txn_id, "w")
        writer.produce("payments", Record(None, f"attempt-{attempt}".encode()), 0)
        participant = json.dumps(writer.participant().__dict__)  # type: ignore[union-attr]
        at = time.time() + 0.35 + attempt * 0.025  # around the deadline
        sides = [start_worker("txn_race", streams.url, "g", side, txn_id, str(at), participant)
                 for side in ("commit", "expire")]
        reports = [json.loads(proc.communicate(timeout=120)[0].splitlines()[-1]) for proc in sides]
        outcome = group.outcome(txn_id)
        committed = outcome is txn.Outcome.COMMITTED
        assert reports[0] == ({"committed": True} if committed else {"error": "TRANSACTION_TIMED_OUT"})
        assert (f"attempt-{attempt}".encode() in values(streams, "payments")) == committed
        fresh = txn.open_group({"store.url": streams.url, "transaction.group": "g"})
        assert fresh.outcome(txn_id) in (outcome, None)  # None: finished and merged, forgotten by a fresh view
        fresh.close()


def test_a_fenced_instance_cannot_commit_even_an_empty_transaction_with_offsets(streams: Store) -> None:
    zombie = producer(streams, "app")
    successor = producer(streams, "app")
    zombie.begin_transaction()  # begun after it was fenced: no records, only offsets
    zombie.send_offsets_to_transaction([TopicPartition("payments", 0, 9)], ConsumerGroupMetadata("copier"))
    assert error_of(zombie.commit_transaction) == "PRODUCER_FENCED"
    assert streams.committed_offsets("copier", [("payments", 0)]) == {}
    successor.begin_transaction()
    successor.commit_transaction()


def staged_by(group: txn.TransactionGroup, writer_id: str, count: int) -> tuple[str, txn.Participant]:
    """A transaction of its own, begun and written by one writer (as a Spark task does)."""
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, writer_id, known_open=True)
    for i in range(count):
        writer.produce("payments", Record(None, f"{writer_id}:{i}".encode()), 0)
    participant = writer.participant()
    assert participant is not None
    return txn_id, participant


def test_a_commit_that_joins_writers_transactions_publishes_exactly_the_named_ones(
        streams: Store, group: txn.TransactionGroup) -> None:
    (first, p1), (second, p2), (left_out, _) = (staged_by(group, w, 3) for w in ("task-0", "task-1", "task-1b"))
    progress = ("payments", 0)
    committed = group.commit_when([p1, p2], lambda: True, offsets={"sink": {progress: 1}})
    assert committed is not None
    assert sorted(values(streams, "payments")) == sorted(f"{w}:{i}".encode() for w in ("task-0", "task-1")
                                                         for i in range(3))
    assert [group.outcome(t) for t in (committed, first, second, left_out)] == [
        txn.Outcome.COMMITTED, txn.Outcome.COMMITTED, txn.Outcome.COMMITTED, txn.Outcome.OPEN]
    assert streams.committed_offsets("sink", [progress]) == {progress: 1}


def test_a_conditional_commit_sees_every_earlier_commit_and_refuses_when_its_condition_fails(
        streams: Store, group: txn.TransactionGroup) -> None:
    progress = ("payments", 0)

    def batch_is_next(batch: int) -> Callable[[], bool]:
        return lambda: streams.committed_offsets("sink", [progress]).get(progress, 0) == batch

    assert group.commit_when([staged_by(group, "a", 2)[1]], batch_is_next(0), offsets={"sink": {progress: 1}})
    replayed, participant = staged_by(group, "b", 2)
    assert group.commit_when([participant], batch_is_next(0), offsets={"sink": {progress: 2}}) is None
    assert values(streams, "payments") == [b"a:0", b"a:1"] and group.outcome(replayed) is txn.Outcome.OPEN
    assert streams.committed_offsets("sink", [progress]) == {progress: 1}


def test_a_commit_joining_an_aborted_transaction_decides_nothing(streams: Store, group: txn.TransactionGroup) -> None:
    (kept, p1), (aborted, p2) = staged_by(group, "task-0", 2), staged_by(group, "task-1", 2)
    group.abort(aborted)
    assert error_of(group.commit_when, [p1, p2], lambda: True) == "INVALID_TXN_STATE"
    assert values(streams, "payments") == [] and group.outcome(kept) is txn.Outcome.OPEN


def test_conditional_commits_in_a_row_with_nothing_between(streams: Store, group: txn.TransactionGroup) -> None:
    """As a Spark query's empty micro-batches: on Kafka each commit leaves a transaction marker after its entry."""
    progress = ("payments", 0)
    for batch in range(3):
        assert group.commit_when([], lambda: True, offsets={"sink": {progress: batch + 1}}) is not None
    assert streams.committed_offsets("sink", [progress]) == {progress: 3}


def test_conditional_commits_of_threads_sharing_a_group_each_commit_once(streams: Store,
                                                                        group: txn.TransactionGroup) -> None:
    """Threads committing through one group at once (two Spark queries given the same transaction.group): each
    commit lands as its own, with its own offsets. Their log appends went through one writer at once, numbered
    alike, and the second was answered as the first one retried: both callers got the first's transaction id."""
    threads, rounds = 4, 5
    committed: list[str | None] = []
    barrier = threading.Barrier(threads, timeout=60)  # a thread that failed breaks it for the others

    def commit(sink: str) -> None:
        for batch in range(rounds):
            barrier.wait()
            committed.append(group.commit_when([], lambda: True, offsets={sink: {("payments", 0): batch + 1}}))

    workers = [threading.Thread(target=commit, args=(f"sink-{i}",)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(committed) == threads * rounds and None not in committed
    assert len(set(committed)) == threads * rounds  # no two callers were told of the same commit
    for i in range(threads):
        assert streams.committed_offsets(f"sink-{i}", [("payments", 0)]) == {("payments", 0): rounds}


def test_a_lone_process_reads_back_none_of_the_log_entries_it_wrote(streams: Store, group: txn.TransactionGroup,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The log's writer hands each entry it stored to the process's view of the log, so a commit knows it decided
    its transaction without reading its BEGIN and COMMIT back (on Kafka a round trip per commit)."""
    first, participant = staged_by(group, "w0", 1)
    group.commit(first, [participant])  # the view has read the log up to here
    reads: list[str] = []
    read = group.store.read
    monkeypatch.setattr(group.store, "read", lambda stream, *args: reads.append(stream) or read(stream, *args))
    for n in range(1, 4):
        txn_id, participant = staged_by(group, f"w{n}", 2)
        group.commit(txn_id, [participant])
        assert group.outcome(txn_id) is txn.Outcome.COMMITTED
    assert group.log_stream not in reads
    assert len(values(streams, "payments")) == 7


def test_one_step_commits_look_at_the_log_only_after_another_process_wrote_to_it(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that alone writes the log commits in one step at the end it knows, without reading it first (on
    Kafka past its last commit's transaction marker, learned from the last stable offset that commit waited for);
    an entry another process wrote meanwhile makes that try miss, and the commit looks, then lands once, after
    it."""
    monkeypatch.setattr(expiry, "_EXPIRE_EVERY_S", 3600.0)  # no upkeep (which looks at the log) in between
    app = producer(streams, **{"transaction.group": "g"})

    def commit(value: bytes) -> None:
        app.begin_transaction()
        app.produce("payments", value, partition=0)
        app.commit_transaction()

    commit(b"first")  # the process's view reads the log once
    looks: list[str] = []
    partition_state = type(streams).partition_state
    monkeypatch.setattr(type(streams), "partition_state",
                        lambda self, stream, p: looks.append(stream) or partition_state(self, stream, p))
    commit(b"second")
    commit(b"third")
    assert group.log_stream not in looks
    assert group.progress_stream not in looks  # the merge's progress it read first is remembered
    other, participant = staged_by(group, "another-process", 1)  # another view of the group writes the log
    group.commit(other, [participant])
    commit(b"fourth")
    assert group.log_stream in looks
    assert values(streams, "payments") == [b"first", b"second", b"third", b"another-process:0", b"fourth"]
    app.close()


def _commit_payment(app: Producer, value: bytes) -> None:
    app.begin_transaction()
    app.produce("payments", value, partition=0)
    app.commit_transaction()


def test_a_failed_look_at_the_log_leaves_a_one_step_commit_to_the_staged_way(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of the log that fails while a commit is tried in one step ends that try, and the transaction commits
    the staged way (before, the error was raised to whichever committer led the try: with others collated, perhaps
    one whose own transaction had committed)."""
    monkeypatch.setattr(expiry, "_EXPIRE_EVERY_S", 3600.0)  # the failing read is a commit's look, not the upkeep's
    app = producer(streams, **{"transaction.group": "g"})
    _commit_payment(app, b"first")
    other, participant = staged_by(group, "another-process", 1)  # so the next one-step commit looks at the log
    group.commit(other, [participant])
    failures = [KafkaException(KafkaError(ErrorCode._TRANSPORT, "the broker went away", retriable=True))]
    partition_state = type(streams).partition_state

    def failing_once(store: Store, stream: str, partition: int) -> Any:
        if stream == group.log_stream and failures:
            raise failures.pop()
        return partition_state(store, stream, partition)

    monkeypatch.setattr(type(streams), "partition_state", failing_once)
    _commit_payment(app, b"second")
    assert failures == []
    assert values(streams, "payments") == [b"first", b"another-process:0", b"second"]
    app.close()


AtomicAppend = Callable[[], Any]


def faulty_atomic_appends(streams: Store, monkeypatch: pytest.MonkeyPatch,
                          fault: Callable[[AtomicAppend, Any], Any]) -> None:
    """Every atomic append of the store's writers from now on is ``fault(append, batches)``: it calls ``append``
    (the store's own) or not, and returns or raises what the store would have."""
    opened = streams.open_writer()
    writer_class = type(opened)
    opened.close()
    append_atomic = writer_class.append_atomic
    monkeypatch.setattr(writer_class, "append_atomic", lambda writer, batches, offsets=(): fault(
        lambda: append_atomic(writer, batches, offsets), batches))


def unknown_outcome() -> KafkaException:
    return KafkaException(KafkaError(ErrorCode._TIMED_OUT, "no answer in time", outcome_unknown=True))


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_a_one_step_commit_of_unknown_outcome_is_settled_by_reading_the_log_back(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch, landed: bool) -> None:
    """The store may not know whether an append landed (no answer in time). A producer that committed in one step
    saw no BEGIN and could not ask what became of its transaction: told "unknown", it would publish the records
    again. So the group reads the log back: committed if the entry landed, else it tries again; once either way."""
    app = producer(streams, **{"transaction.group": "g"})
    _commit_payment(app, b"first")
    faults = [landed]

    def unknown_once(append: AtomicAppend, batches: Any) -> Any:
        if batches[0].stream == group.log_stream and faults:
            if faults.pop():
                append()
            raise unknown_outcome()
        return append()

    faulty_atomic_appends(streams, monkeypatch, unknown_once)
    _commit_payment(app, b"second")
    _commit_payment(app, b"third")
    assert faults == []
    assert values(streams, "payments") == [b"first", b"second", b"third"]
    app.close()


@pytest.mark.parametrize("case", ["landed", "not-landed", "landed-then-cut"])
def test_the_abort_after_a_one_step_commit_left_unknown_says_whether_it_committed(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Where the log cannot be read to settle a one-step commit, its producer is told the outcome is unknown; the
    abort the application then calls asks the log (no BEGIN names that transaction: before, the abort found nothing
    to abort and succeeded): one that committed refuses the abort, its record reported delivered, so the application
    does not produce it again; one that never landed is aborted; one the log was cut past before this process read
    it cannot be told (outcome unknown, not "aborted")."""
    app = producer(streams, **{"transaction.group": "g"})
    _commit_payment(app, b"first")
    stored_end = type(streams).stored_end
    faults = [case != "not-landed"]
    unreadable: list[KafkaException] = []

    def unknown_once(append: AtomicAppend, batches: Any) -> Any:
        if batches[0].stream == group.log_stream and faults:
            if faults.pop():
                append()
            unreadable.append(KafkaException(KafkaError(ErrorCode._TRANSPORT, "the broker went away")))
            raise unknown_outcome()
        return append()

    def failing_once(store: Store, stream: str, partition: int) -> int:
        if stream == group.log_stream and unreadable:
            raise unreadable.pop()
        return int(stored_end(store, stream, partition))

    faulty_atomic_appends(streams, monkeypatch, unknown_once)
    monkeypatch.setattr(type(streams), "stored_end", failing_once)
    reports: list[KafkaError | None] = []
    app.begin_transaction()
    app.produce("payments", b"second", partition=0, on_delivery=lambda err, msg: reports.append(err))
    with pytest.raises(KafkaException) as commit:
        app.commit_transaction()
    assert commit.value.error.outcome_unknown() and commit.value.error.txn_requires_abort()
    if case == "landed-then-cut":  # by other processes, while this one could not read the log
        streams.truncate_before(group.log_stream, 0, streams.partition_state(group.log_stream, 0).end_offset)
        with pytest.raises(KafkaException) as abort:
            app.abort_transaction()
        assert abort.value.error.outcome_unknown()
        app.close()
        return
    if case == "landed":
        assert error_of(app.abort_transaction) == "INVALID_TXN_STATE"
    else:
        app.abort_transaction()
        _commit_payment(app, b"second")  # produced again
    app.poll(0)
    assert [r.code() if r else None for r in reports] == [None if case == "landed" else ErrorCode._PURGE_QUEUE]
    _commit_payment(app, b"third")
    assert values(streams, "payments") == [b"first", b"second", b"third"]
    app.close()


def test_a_one_step_commit_that_meets_only_retriable_errors_commits_the_other_way(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append retried as long as it may and refused each time (retriable: nothing landed) leaves the transaction
    to the staged way, which retries on its own (before, the producer was told its commit failed)."""
    app = producer(streams, **{"transaction.group": "g"})
    _commit_payment(app, b"first")
    refused: list[int] = []

    def refusing(append: AtomicAppend, batches: Any) -> Any:
        if batches[0].stream == group.log_stream and len(batches) > 1:  # a one-step commit's (the entry, records)
            refused.append(1)
            raise KafkaException(KafkaError(ErrorCode._TRANSPORT, "the broker went away", retriable=True))
        return append()

    faulty_atomic_appends(streams, monkeypatch, refusing)
    _commit_payment(app, b"second")
    assert len(refused) >= 2
    assert values(streams, "payments") == [b"first", b"second"]
    app.close()


def _offsets_producer(streams: Store, **settings: Any) -> Producer:
    """A producer of the group "g" for transactions that consume from the stream "input" (made here)."""
    streams.create_stream("input", 1)
    return producer(streams, **{"transaction.group": "g", **settings})


def _commit_offsets_in_one_step(app: Producer, batch: int) -> None:
    app.begin_transaction()
    app.produce("payments", f"batch-{batch}", partition=0)
    app.send_offsets_to_transaction([TopicPartition("input", 0, batch + 1)], ConsumerGroupMetadata("reader"))
    app.commit_transaction()


def test_a_merge_passing_over_one_step_commits_commits_none_of_their_offsets_again(
        streams: Store, group: txn.TransactionGroup) -> None:
    """A one-step commit writes its records and offsets with its COMMIT and may leave the merge's progress behind
    it; a merge that later passes over that COMMIT (to merge a staged transaction) must not commit its offsets
    again: an operator may have moved the group's offsets since (a reset), and the reset would be undone."""
    app = _offsets_producer(streams)
    for batch in range(3):
        _commit_offsets_in_one_step(app, batch)
    assert streams.committed_offsets("reader", [("input", 0)]) == {("input", 0): 3}
    streams.commit_offsets("reader", {("input", 0): 100})  # reset by an operator, outside any transaction
    other, participant = staged_by(group, "another-process", 1)  # its merge passes over the three COMMITs
    group.commit(other, [participant])
    assert group.merge_progress() == streams.partition_state(group.log_stream, 0).end_offset
    assert streams.committed_offsets("reader", [("input", 0)]) == {("input", 0): 100}
    assert values(streams, "payments") == [b"batch-0", b"batch-1", b"batch-2", b"another-process:0"]
    app.close()


def test_one_step_commits_after_another_process_merged_merge_nothing_twice(
        streams: Store, group: txn.TransactionGroup) -> None:
    """A process remembers the merge's progress it read; another process's merge moves it on meanwhile. The one-step
    commits after that still move the progress (conditional on what is stored, not what was remembered), and
    nothing is merged twice."""
    app = _offsets_producer(streams)
    _commit_offsets_in_one_step(app, 0)  # reads the progress: none stored yet
    other, participant = staged_by(group, "another-process", 1)
    group.commit(other, [participant])  # merged by the other view, which stores the progress
    stored_by_other = group.merge_progress()
    for batch in range(1, 80):
        _commit_offsets_in_one_step(app, batch)
    log_end = streams.partition_state(group.log_stream, 0).end_offset
    progress = group.merge_progress()
    assert progress is not None and stored_by_other is not None and stored_by_other < progress <= log_end
    assert values(streams, "payments") == [b"batch-0", b"another-process:0",
                                           *(f"batch-{batch}".encode() for batch in range(1, 80))]
    assert streams.committed_offsets("reader", [("input", 0)]) == {("input", 0): 80}
    app.close()


def test_one_step_commits_keep_the_log_truncatable(streams: Store, group: txn.TransactionGroup) -> None:
    """One-step commits move the merge's progress now and then, not with every commit, so however long a
    producer commits only in one step, the log is still cut behind it and the group's view of it stays small."""
    app = _offsets_producer(streams, **{"transaction.log.truncate.every.entries": 50,
                                        "transaction.log.truncate.delay.ms": 0})
    for batch in range(300):
        _commit_offsets_in_one_step(app, batch)
    log_end = streams.partition_state(group.log_stream, 0).end_offset
    # The producer's fence mark (init_transactions), then its 300 commits, each an entry (on Kafka followed by
    # its transaction's marker).
    per_commit = (log_end - 1) // 300
    assert log_end == 1 + 300 * per_commit and per_commit in (1, 2)
    progress = group.merge_progress()
    assert progress is not None and log_end - 100 * per_commit <= progress <= log_end
    start = streams.partition_state(group.log_stream, 0).start_offset
    assert start >= log_end - 150 * per_commit  # cut by the commits
    assert streams.committed_offsets("reader", [("input", 0)]) == {("input", 0): 300}
    assert values(streams, "payments") == [f"batch-{batch}".encode() for batch in range(300)]
    app.close()


def test_committers_a_merge_under_way_covers_do_not_each_take_a_turn_at_the_merge(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits stored while a merge pass waits to begin are merged by it, and their committers return when it
    ends, instead of queueing for the merge one after another to find their commit merged (64 committers at
    once on Kafka: the merge stood idle ~30% of the time, handed on from one committer to the next)."""
    staged = [staged_by(group, f"w{n}", 1) for n in range(5)]
    merger = group._merger  # the turns taken at the merge are what this test counts
    turns: list[int | None] = []
    first_began, go_on = threading.Event(), threading.Event()
    merge = merger._merge

    def counted(until: int | None) -> int:
        turns.append(until)
        if len(turns) == 1:
            first_began.set()
            go_on.wait(30)
        return merge(until)

    monkeypatch.setattr(merger, "_merge", counted)
    committers = [threading.Thread(target=group.commit, args=(txn_id, [participant]))
                  for txn_id, participant in staged]
    committers[0].start()
    assert first_began.wait(30)
    for committer in committers[1:]:
        committer.start()
    deadline = time.monotonic() + 30
    while any(group.outcome(txn_id) is not txn.Outcome.COMMITTED for txn_id, _ in staged):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    go_on.set()
    for committer in committers:
        committer.join(30)
    assert len(turns) == 1
    assert sorted(values(streams, "payments")) == sorted(f"w{n}:0".encode() for n in range(5))


def test_a_committer_meeting_the_merge_taken_before_its_first_pass_waits_for_that_pass(
        streams: Store, group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The merge of a fresh group is taken by one caller while a committer looks at it: the committer waits for
    that caller's pass to end, then goes on (a first version waited for good on a pass that never began)."""
    merger = group._merger  # the order of its callers is what this test sets up
    in_pass, end_pass = threading.Event(), threading.Event()

    def slow_merge(until: int | None) -> int:
        in_pass.set()
        end_pass.wait(30)
        return 1

    monkeypatch.setattr(merger, "_merge", slow_merge)
    lock, taken, tried = merger._lock, threading.Thread(target=group.merge, daemon=True), threading.Event()

    class TakenMeanwhile:
        """The merge's lock, taken by another caller just as the committer first tries it."""

        def acquire(self, blocking: bool = True) -> bool:
            if blocking or tried.is_set():
                return lock.acquire(blocking)
            taken.start()
            assert in_pass.wait(30)
            got = lock.acquire(False)
            tried.set()
            return got

        def release(self) -> None:
            lock.release()

    monkeypatch.setattr(merger, "_lock", TakenMeanwhile())
    committer = threading.Thread(target=merger.merge, args=(1,), daemon=True)
    committer.start()
    assert tried.wait(30)
    end_pass.set()
    committer.join(10)
    taken.join(10)
    assert not committer.is_alive(), "the committer waited for good"


def test_an_abort_the_store_refused_leaves_the_transaction_open_instead_of_reporting_it_aborted(
        group: txn.TransactionGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The abort after a commit of unknown outcome asks the log; an ABORT the store refused (the log's writer
    closing, say) decided nothing. It was reported "aborted" while the transaction stayed open: a COMMIT still on
    its way would then commit what the application produced again."""
    txn_id = group.begin(60_000)

    def refused(record: TransactionMetadataEntry) -> txn.Position:
        raise KafkaException(KafkaError(ErrorCode._STATE, "the commit log's writer is closed"))

    monkeypatch.setattr(group.log_writer, "append", refused)
    with pytest.raises(KafkaException) as info:
        group.abort_unless_committed(txn_id)
    assert info.value.code == ErrorCode._STATE
    monkeypatch.undo()
    assert group.outcome(txn_id) is txn.Outcome.OPEN
    assert group.abort_unless_committed(txn_id) is False and group.outcome(txn_id) is txn.Outcome.ABORTED


def test_a_staged_commit_whose_outcome_was_unknown_but_committed_is_visible_when_commit_returns(
        streams: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A COMMIT stored, then reported of unknown outcome: the producer asks the log, finds it committed, and
    returns success. Its records were never merged (the committer stopped at the error): they stayed invisible
    until some later commit's merge."""
    app = producer(streams, **{"transaction.group": "g", "batch.num.messages": 1})  # records stage as produced
    _commit_payment(app, b"first")
    append = txn.BatchedLogWriter.append

    def unknown_commits(writer: txn.BatchedLogWriter, record: TransactionMetadataEntry) -> txn.Position:
        position = append(writer, record)
        if record.kind == TransactionMetadataEntry.COMMIT:
            raise unknown_outcome()
        return position

    monkeypatch.setattr(txn.BatchedLogWriter, "append", unknown_commits)
    app.begin_transaction()
    for value in (b"second", b"third"):
        app.produce("payments", value, partition=0)
    app.commit_transaction()
    assert values(streams, "payments") == [b"first", b"second", b"third"]
    app.close()


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not-landed"])
def test_a_commit_not_made_in_one_step_whose_commit_record_is_of_unknown_outcome_is_settled_by_the_log(
        streams: Store, monkeypatch: pytest.MonkeyPatch, landed: bool) -> None:
    """A small transaction that does not commit in one step (paused after races, say) commits inline on Kafka
    (its records in the COMMIT) and staged on the embedded store. A COMMIT append of unknown outcome is settled by
    the log: landed, the commit succeeds and its records are visible once; not landed, an ABORT decides it (the
    inline commit's own, or the abort the application is told to make) and the records produced again are
    published once."""
    app = producer(streams, **{"transaction.group": "g"})
    _commit_payment(app, b"first")
    monkeypatch.setattr(txn.TransactionGroup, "_commit_in_one_step", lambda group, *args, **kwargs: None)
    append = txn.BatchedLogWriter.append
    faults = [landed]

    def unknown_commit_once(writer: txn.BatchedLogWriter, record: TransactionMetadataEntry) -> txn.Position:
        if record.kind == TransactionMetadataEntry.COMMIT and faults:
            if faults.pop():
                append(writer, record)
            raise unknown_outcome()
        return append(writer, record)

    monkeypatch.setattr(txn.BatchedLogWriter, "append", unknown_commit_once)
    if landed:
        _commit_payment(app, b"second")
    else:
        with pytest.raises(KafkaException) as info:
            _commit_payment(app, b"second")
        assert info.value.error.txn_requires_abort()  # (inline: settled by an ABORT; staged: the abort settles it)
        app.abort_transaction()
        _commit_payment(app, b"second")  # produced again
    assert faults == []
    assert values(streams, "payments") == [b"first", b"second"]
    app.close()


def test_the_abort_after_an_unknown_commit_leaves_another_owners_transaction_at_that_id_alone(
        group: txn.TransactionGroup) -> None:
    """The id a commit of unknown outcome was told names the entry its append expected to land at. Where another
    committer's entry landed there instead, that id is another owner's transaction: the abort neither reports it
    committed (the application would drop its own records as published) nor aborts it."""
    committed = group.begin(60_000, owner="other-app", owner_epoch=3)
    group.commit(committed, [])
    still_open = group.begin(60_000, owner="app", owner_epoch=0)  # an older instance of the caller
    assert group.abort_unless_committed(committed, "app", 1) is False
    assert group.abort_unless_committed(still_open, "app", 1) is False
    assert group.outcome(committed) is txn.Outcome.COMMITTED and group.outcome(still_open) is txn.Outcome.OPEN
    assert group.abort_unless_committed(still_open, "app", 0) is False  # its own: aborted
    assert group.outcome(still_open) is txn.Outcome.ABORTED
