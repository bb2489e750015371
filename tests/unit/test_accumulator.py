"""A Producer's per-record path (connector/accumulator.py, compiled in connector/_accumulator.c): the compiled
accumulator queues and routes exactly as the Python one does, and a Producer delivers the same records either way,
whatever the shape of the call."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.connector import KafkaError, KafkaException, Message, Producer, accumulator
from onceflow.connector.errors import ErrorCode
from onceflow.connector.partitioner import index_for_key
from onceflow.connector.producer_transactions import ProducerTransactions
from onceflow.connector.store import open_store, read_range
from onceflow.txn.staging import StagingWriter

compiled = accumulator._compiled
needs_compiled = pytest.mark.skipif(compiled is None, reason="the C extension is not built here (no C compiler)")

TOPICS = ("a", "b", "gone")  # "gone": never described, so its records take the Producer's full path


def _accumulators(linger_s: float, transactional: bool = False) -> tuple[Any, accumulator.Accumulator]:
    made = []
    for kind in (compiled.Accumulator, accumulator.Accumulator):
        queue = kind(threading.RLock(), linger_s, 5, 400, 1_000, 300, None, transactional)
        queue.current.update({"a": (0, 1, 2), "b": (7,)})
        queue.partitions.update({"a": frozenset({0, 1, 2}), "b": frozenset({3, 7})})
        made.append(queue)
    return made[0], made[1]


def _batches(batches: dict[Any, Any]) -> dict[Any, Any]:
    """Batches as plain values, with the wall-clock timestamps stamped on records replaced by "now"."""
    return {tp: ([(k, v, h, "now" if abs(ts - time.time() * 1000) < 60_000 else ts) for k, v, h, ts in b.fields],
                 dict(b.callbacks), set(b.pinned), b.size, len(b), math.isinf(b.deadline)) for tp, b in batches.items()}


def _state(queue: Any) -> tuple[Any, ...]:
    """What an accumulator holds."""
    return _batches(queue.batches), dict(queue.sticky), queue.in_flight, math.isinf(queue.next_due), queue.queued


values = st.one_of(st.none(), st.binary(max_size=120), st.text(max_size=3), st.builds(bytearray, st.binary(max_size=3)))
records = st.tuples(st.sampled_from(TOPICS), values, values,
                    st.one_of(st.just(-1), st.none(), st.integers(-3, 8), st.just(True), st.just(2**70)),
                    st.sampled_from([None, print, len]),
                    st.one_of(st.just(0), st.integers(1, 2**40), st.just(1.5), st.none()))


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(records, st.just("take")), max_size=40), st.sampled_from([1e6, 0.0]), st.booleans())
def test_the_compiled_accumulator_queues_and_routes_as_the_python_one(calls: list[Any], linger_s: float,
                                                                      transactional: bool) -> None:
    ours, reference = _accumulators(linger_s, transactional)
    for call in calls:
        if call == "take":
            assert _batches(ours.take()) == _batches(reference.take())
        else:
            assert ours.add(*call) == reference.add(*call), call
        assert _state(ours) == _state(reference), call
        for topic in TOPICS:
            for key in (None, b"k", b"other key"):
                assert ours.route(topic, key) == reference.route(topic, key)


@needs_compiled
def test_a_full_or_due_batch_is_reported_and_a_refused_record_changes_nothing() -> None:
    ours, reference = _accumulators(1e6)
    for queue in (ours, reference):
        assert [queue.add("a", b"v", b"k", 1, None, 5) for _ in range(5)] == [1, 1, 1, 1, 2]  # batch.num.messages 5
        assert queue.add("b", b"x" * 301, None, -1, None, 5) == 0  # over message.max.bytes
        assert queue.add("b", b"x" * 300, None, -1, None, 5) == 1
        assert queue.add("b", b"x" * 100, None, -1, None, 5) == 2  # batch.size 400
        queue.in_flight = 1_000  # queue.buffering.max.messages
        assert queue.add("a", b"v", b"k", 1, None, 5) == 0
        queue.in_flight, queue.accepting = 0, False
        assert queue.add("a", b"v", b"k", 1, None, 5) == 0
    assert _state(ours) == _state(reference)
    due, _ = _accumulators(0.0)
    assert due.add("a", b"v", None, -1, None, 5) == 3  # linger.ms 0: due at once


@needs_compiled
@given(st.binary(max_size=300))
def test_keys_hash_as_zlib_crc32(key: bytes) -> None:
    assert compiled.crc32(key) == zlib.crc32(key)


@needs_compiled
def test_a_queued_record_holds_its_fields_and_nothing_else() -> None:
    queue, _ = _accumulators(1e6)
    topic, value, key = "".join(["to", "pic"]), b"value " * 5, b"a key"  # strs and bytes of their own
    queue.current[topic] = (0, 1)
    before = [sys.getrefcount(topic), sys.getrefcount(value), sys.getrefcount(key)]
    for _ in range(100):
        queue.add(topic, value, key, -1, None, 0)
    after = [sys.getrefcount(topic), sys.getrefcount(value), sys.getrefcount(key)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 100, 100]  # the topic: in its batch's key
    queue.batches.clear()
    assert [sys.getrefcount(topic), sys.getrefcount(value), sys.getrefcount(key)] == before


# -- a Producer, with the compiled path and with the Python one ------------------------------------------------------


@pytest.fixture(params=["compiled", "python"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "compiled" and compiled is None:
        pytest.skip("the C extension is not built here (no C compiler)")
    if request.param == "python":
        monkeypatch.setattr(accumulator, "_compiled", None)
        monkeypatch.setattr(Producer, "produce", accumulator.fast_produce(Producer.produce.__wrapped__))
    yield request.param


@pytest.fixture
def url(sqlite_url: str) -> Iterator[str]:
    store = open_store(sqlite_url)
    store.create_stream("t", 4)
    store.close()
    yield sqlite_url


def _stored(url: str) -> dict[int, list[Message]]:
    store = open_store(url)
    try:
        return {p: list(read_range(store, "t", p)) for p in range(4)}
    finally:
        store.close()


class Falsy:
    """A callable that is false: ``callback or on_delivery`` passes over it, as in confluent-kafka."""

    def __bool__(self) -> bool:
        return False

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        raise AssertionError("a falsy callback was called")


def test_records_land_where_the_partitioner_says_whatever_the_shape_of_the_call(implementation: str,
                                                                                url: str) -> None:
    reports: list[tuple[KafkaError | None, Message]] = []

    def report(error: KafkaError | None, message: Message) -> None:
        reports.append((error, message))

    producer = Producer({"store.url": url, "on_delivery": report})
    producer.produce("t", b"v10", b"key 10", expected_offset=0, partition=3)  # CAS (partition 3 is empty): full path
    producer.produce("t", b"v0", b"key 0")
    producer.produce("t", value=b"v1", key=b"key 1")
    producer.produce(topic="t", value=b"v2")  # the topic by keyword: the full path
    producer.produce("t", b"v3", None, 2, report, 1234)
    producer.produce("t", "v4", "key 4")  # str: the full path
    producer.produce("t", b"v5", b"key 5", headers={"h": b"x"})  # headers: the full path
    producer.produce("t", b"v6", b"key 6", callback=report, timestamp=99)
    producer.produce("t", b"v7", b"key 7", on_delivery=print, callback=report)  # callback wins, as in confluent-kafka
    Producer.produce(producer, "t", b"v8", b"key 8", partition=None)  # unbound, and None is "let it choose"
    producer.produce("t", b"v9", b"key 9", partition=1, on_delivery=Falsy(), callback=None)  # a falsy callback: not it
    with pytest.raises(TypeError):
        producer.produce("t", b"v", nonsense=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        producer.produce("t", b"v", b"k", -1, None, 0, None, "one too many")  # type: ignore[misc]
    with pytest.raises(KafkaException) as refused:
        producer.produce("t", b"v", b"k", -2)
    assert refused.value.args[0].code() == ErrorCode._INVALID_ARG
    with pytest.raises(KafkaException) as missing:
        producer.produce("t", b"v", b"k", 9)
    assert missing.value.args[0].code() == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert producer.flush(10) == 0
    producer.close()

    stored = {m.value(): (p, m) for p, messages in _stored(url).items() for m in messages}
    assert sorted(stored) == sorted(b"v%d" % i for i in range(11))
    for i in (0, 1, 4, 5, 6, 7, 8):
        assert stored[b"v%d" % i][0] == index_for_key(b"key %d" % i, 4)
    assert stored[b"v9"][0] == 1 and stored[b"v10"][0] == 3
    assert stored[b"v3"][0] == 2 and stored[b"v3"][1].timestamp()[1] == 1234
    assert stored[b"v6"][1].timestamp()[1] == 99
    assert stored[b"v5"][1].headers() == [("h", b"x")]
    assert sorted(m.value() for error, m in reports if error is None) == sorted(stored)  # each reported once
    assert all(m.offset() == stored[m.value()][1].offset() for _, m in reports)


def test_a_full_batch_is_written_without_a_flush_and_a_due_one_by_the_next_record(implementation: str,
                                                                                  url: str) -> None:
    producer = Producer({"store.url": url, "batch.num.messages": 10, "linger.ms": 60_000})
    for _ in range(9):
        producer.produce("t", b"v", b"k")
    assert sum(map(len, _stored(url).values())) == 0
    producer.produce("t", b"v", b"k")
    assert sum(map(len, _stored(url).values())) == 10
    producer.close()

    producer = Producer({"store.url": url, "linger.ms": 0})
    producer.produce("t", b"v", b"k")
    producer.produce("t", b"v", b"k")
    assert sum(map(len, _stored(url).values())) >= 11  # the first was due when the second came
    producer.close()


def test_unkeyed_records_stick_to_a_partition_until_its_batch_is_sent(implementation: str, url: str) -> None:
    producer = Producer({"store.url": url, "batch.num.messages": 3, "linger.ms": 60_000})
    for _ in range(9):
        producer.produce("t", b"v")
    producer.close()
    assert sorted(len(messages) for messages in _stored(url).values()) == [0, 3, 3, 3]


def test_a_full_queue_refuses_a_record_until_reports_are_served(implementation: str, url: str) -> None:
    producer = Producer({"store.url": url, "queue.buffering.max.messages": 3, "linger.ms": 60_000})
    for _ in range(3):
        producer.produce("t", b"v", b"k", on_delivery=lambda error, message: None)
    with pytest.raises(BufferError):
        producer.produce("t", b"v", b"k")
    producer.flush(10)
    producer.produce("t", b"v", b"k")
    producer.close()
    assert sum(map(len, _stored(url).values())) == 4


def test_a_producer_waits_for_a_thread_holding_it(implementation: str, url: str) -> None:
    producer = Producer({"store.url": url})
    done = threading.Event()
    with producer._lock:  # as a flush in another thread holds it
        thread = threading.Thread(target=lambda: (producer.produce("t", b"v", b"k"), done.set()))
        thread.start()
        assert not done.wait(0.2)
        assert len(producer) == 0
    thread.join(10)
    assert done.is_set() and len(producer) == 1
    producer.close()


def test_a_fenced_producer_refuses_every_later_record(implementation: str, url: str) -> None:
    first = Producer({"store.url": url, "writer.id": "w"})
    second = Producer({"store.url": url, "writer.id": "w"})  # fences the first
    errors: list[KafkaError | None] = []
    first.produce("t", b"v", b"k", on_delivery=lambda error, message: errors.append(error))
    first.flush(10)
    assert errors and errors[0] is not None and errors[0].fatal()
    with pytest.raises(KafkaException):
        first.produce("t", b"v", b"k")
    second.close()
    first.close()


def test_a_transactions_records_are_refused_outside_it_and_reported_when_it_ends(implementation: str,
                                                                                  url: str) -> None:
    producer = Producer({"store.url": url, "transactional.id": "app", "batch.num.messages": 5})
    producer.init_transactions()
    reports: list[tuple[KafkaError | None, int | None]] = []

    def report(error: KafkaError | None, message: Message) -> None:
        reports.append((error, message.offset()))

    for outcome in ("commit", "abort"):
        producer.begin_transaction()
        for i in range(12):  # past batch.num.messages twice: 10 staged on the way
            producer.produce("t", b"%d" % i, b"k", on_delivery=report if i % 4 == 0 or i == 11 else None)
        assert len(producer) == 3 + 1  # the reports of 0, 4 and 8, staged, and of 11, queued (10 has none)
        assert producer.poll(None) == 3  # served; the queued records are not due, so it does not wait for them
        assert len(producer) == 1
        producer.commit_transaction() if outcome == "commit" else producer.abort_transaction()
        assert len(producer) == 0
        with pytest.raises(KafkaException) as outside:
            producer.produce("t", b"after", b"k")  # a record the accumulator would queue
        assert outside.value.args[0].code() == ErrorCode.INVALID_TXN_STATE
    producer.close()

    assert sorted(m.value() for m in _stored(url)[index_for_key(b"k", 4)]) == sorted(b"%d" % i for i in range(12))
    purged = KafkaError(ErrorCode._PURGE_QUEUE)
    assert [(e and e.code(), offset) for e, offset in reports] == [(None, None)] * 7 + [(purged.code(), None)]


@needs_compiled
def test_a_finalizer_producing_while_a_record_is_routed_crashes_nothing(tmp_path: Path) -> None:
    """A collection may run finalizers inside produce(); one that produces to the same Producer (its lock is
    re-entrant) may replace the topic's partitions the record was being routed to. The compiled path held a
    borrowed partition there, and crashed once it was freed."""
    script = tmp_path / "finalizer.py"
    script.write_text(textwrap.dedent(f"""
        import gc
        from onceflow.connector import Producer
        from onceflow.connector.partitioner import index_for_key
        from onceflow.connector.store import open_store
        url = "sqlite://{tmp_path}/store.db"
        open_store(url).create_stream("t", 600)
        p = Producer({{"store.url": url, "linger.ms": 60000, "batch.num.messages": 10**6}})
        p.produce("t", b"first", b"k")
        class Cycle:
            def __init__(self): self.me = self
            def __del__(self):
                try:
                    p.produce("t", b"x", partition=10**6)  # not a partition: describes the topic again
                except Exception:
                    pass
        keys = [k for k in (b"k%d" % i for i in range(10000)) if index_for_key(k, 600) > 400][:50]
        gc.set_threshold(1, 1, 1)
        for k in keys:
            Cycle()
            p.produce("t", b"v", k)
        gc.set_threshold(700, 10, 10)
        p.close()
        print(sum(1 for _ in range(600) for _ in []) + len(keys))
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["50"]


def test_a_closed_producer_refuses_records(implementation: str, url: str) -> None:
    producer = Producer({"store.url": url})
    producer.produce("t", b"before", b"k")
    producer.close()
    for call in (lambda: producer.produce("t", b"after", b"k"), lambda: producer.produce("t", "after", "k")):
        with pytest.raises(KafkaException) as refused:
            call()
        assert refused.value.args[0].code() == ErrorCode._STATE
    assert len(producer) == 0
    assert [m.value() for messages in _stored(url).values() for m in messages] == [b"before"]


def test_a_transaction_holds_more_records_than_the_queue_takes_reports(implementation: str, url: str) -> None:
    """A transaction's records without a callback wait for its commit, not for poll(): they do not count against
    queue.buffering.max.messages (a BufferError there could not be cleared by the poll() it asks for)."""
    producer = Producer({"store.url": url, "transactional.id": "app", "batch.num.messages": 5000,
                         "queue.buffering.max.messages": 100})
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(1000):
        producer.produce("t", b"%d" % i, b"k")
    producer.commit_transaction()
    producer.close()
    assert sum(map(len, _stored(url).values())) == 1000


def test_a_record_whose_callback_ends_the_transaction_is_not_queued_for_the_next(implementation: str,
                                                                                url: str) -> None:
    producer = Producer({"store.url": url, "transactional.id": "app"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", b"first", b"k")

    class Committing:
        """A callback whose truth commits the open transaction, on this thread, once."""

        done = False

        def __bool__(self) -> bool:
            if not Committing.done:
                Committing.done = True
                producer.commit_transaction()
            return True

        def __call__(self, error: KafkaError | None, message: Message) -> None:
            pass

    with pytest.raises(KafkaException) as outside:
        producer.produce("t", b"late", b"k", on_delivery=Committing())
    assert outside.value.args[0].code() == ErrorCode.INVALID_TXN_STATE
    producer.begin_transaction()
    producer.commit_transaction()
    producer.close()
    assert [m.value() for messages in _stored(url).values() for m in messages] == [b"first"]


def test_poll_does_not_wait_for_a_batch_a_cas_append_sent_ahead_of_itself(implementation: str, url: str) -> None:
    producer = Producer({"store.url": url, "linger.ms": 60_000})
    producer.produce("t", b"queued", b"k", partition=0)
    producer.produce("t", b"cas", b"k", partition=0, expected_offset=1)  # sends the queued batch first
    polled = threading.Thread(target=lambda: (producer.poll(), producer.poll()))
    polled.start()
    polled.join(30)  # a poll() that waited for the sent batch's linger.ms would take a minute
    assert not polled.is_alive()
    producer.close()
    assert [m.value() for m in _stored(url)[0]] == [b"queued", b"cas"]


def test_every_record_of_a_transaction_that_fails_is_reported(implementation: str, url: str) -> None:
    """Staged records are reported when staged, the others with the error that ended their transaction, whatever
    the call raised: reports dropped with an error left their records counted in len(producer) for good."""
    reports: list[ErrorCode | None] = []

    def report(error: KafkaError | None, message: Message) -> None:
        reports.append(None if error is None else error.code())

    timed = Producer({"store.url": url, "transactional.id": "timed", "batch.num.messages": 10,
                      "transaction.timeout.ms": 1000})
    timed.init_transactions()
    timed.begin_transaction()
    for i in range(25):  # 20 staged on the way, 5 queued
        timed.produce("t", b"%d" % i, b"k", on_delivery=report)
    time.sleep(1.2)
    with pytest.raises(KafkaException) as late:
        timed.commit_transaction()
    assert late.value.args[0].code() == ErrorCode.TRANSACTION_TIMED_OUT
    timed.abort_transaction()
    assert timed.flush(10) == 0 and len(reports) == 25
    timed.close()

    fenced = Producer({"store.url": url, "transactional.id": "fenced"})
    fenced.init_transactions()
    fenced.begin_transaction()
    for i in range(5):
        fenced.produce("t", b"old %d" % i, b"k", on_delivery=report)
    successor = Producer({"store.url": url, "transactional.id": "fenced"})
    successor.init_transactions()  # fences the first
    with pytest.raises(KafkaException) as zombie:
        fenced.commit_transaction()
    assert zombie.value.args[0].fatal()
    assert fenced.flush(10) == 0
    assert reports[25:] == [ErrorCode.PRODUCER_FENCED] * 5
    successor.close()
    fenced.close()
    assert not any(m.value().startswith(b"old") for messages in _stored(url).values() for m in messages)  # type: ignore[union-attr]


def test_a_transaction_whose_staging_raised_anything_must_be_aborted(implementation: str, url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Records taken out of the buffer for staging are the transaction's: after any failure there (an interrupt,
    say), committing it would publish it without them."""
    producer = Producer({"store.url": url, "transactional.id": "app", "batch.num.messages": 10})
    producer.init_transactions()
    producer.begin_transaction()

    def interrupted(self: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(StagingWriter, "flush", interrupted)
        with pytest.raises(KeyboardInterrupt):
            for i in range(10):  # the 10th stages the batch
                producer.produce("t", b"%d" % i, b"k")
    for call in (lambda: producer.produce("t", b"after", b"k"), producer.commit_transaction):
        with pytest.raises(KafkaException) as refused:
            call()
        assert refused.value.args[0].txn_requires_abort()
    producer.abort_transaction()
    producer.close()
    assert sum(map(len, _stored(url).values())) == 0


def test_a_transaction_whose_records_were_lost_on_their_way_to_it_must_be_aborted(
        implementation: str, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    producer = Producer({"store.url": url, "transactional.id": "app"})
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.produce("t", b"%d" % i, b"k")

    def interrupted(self: object, records: object, reports: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(ProducerTransactions, "add", interrupted)
        with pytest.raises(KeyboardInterrupt):
            producer.commit_transaction()  # hands the queued records over first
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction()  # would have published the transaction without its records
    assert refused.value.args[0].txn_requires_abort()
    producer.abort_transaction()
    producer.close()
    assert sum(map(len, _stored(url).values())) == 0


def test_a_close_whose_flush_failed_still_releases_the_transaction(implementation: str, url: str) -> None:
    producer = Producer({"store.url": url, "transactional.id": "app", "batch.num.messages": 2})
    producer.init_transactions()
    producer.begin_transaction()

    def follow_up(error: KafkaError | None, message: Message) -> None:
        producer.produce("t", b"follow-up", b"k")  # served by close()'s flush: the producer is closed by then

    producer.produce("t", b"a", b"k", on_delivery=follow_up)
    producer.produce("t", b"b", b"k")  # staged: the report of "a" is due
    with pytest.raises(KafkaException) as refused:
        producer.close()
    assert refused.value.args[0].code() == ErrorCode._STATE
    assert producer._transactions is not None and producer._transactions._group is None  # released


def test_a_mock_of_the_producer_checks_produce_calls_as_written(implementation: str) -> None:
    """unittest.mock's autospec reads produce()'s signature (the compiled method gives the one written in Python)."""
    producer = mock.create_autospec(Producer, instance=True)
    producer.produce("t", b"v", b"k", on_delivery=print)
    assert producer.produce.call_args == mock.call("t", b"v", b"k", on_delivery=print)
    producer.produce("t")
    producer.produce(topic="t", value=b"v")
    producer.produce("t", b"v", b"k", -1, None, 0, None)  # every positional parameter
    with pytest.raises(TypeError, match="bogus"):
        producer.produce("t", b"v", bogus=1)
    with pytest.raises(TypeError):
        producer.produce("t", b"v", b"k", -1, None, 0, None, "one too many")
