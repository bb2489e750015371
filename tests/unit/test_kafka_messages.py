"""confluent-kafka's records as onceflow's Messages (what a Consumer on Kafka returns): the stream's name and
partition, the record's offset, key, value and timestamp, its headers without onceflow's own.

The compiled conversion (connector/store/kafka/_messages.c) must give exactly what the Python one gives; both are
run on real confluent-kafka Message objects."""

from __future__ import annotations

import gc
import itertools
import json
import logging
import sys
import weakref
from collections.abc import Callable

import confluent_kafka as ck
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.connector.errors import KafkaException
from onceflow.connector.message import Message
from onceflow.connector.store import Batch, Record
from onceflow.connector.store.kafka import messages
from onceflow.connector.store.kafka import writer as kafka_writer
from onceflow.connector.store.kafka.clients import SEQUENCE_HEADER, record_headers
from onceflow.connector.store.kafka.messages import as_messages, in_runs
from tests.unit.compiled import compiled_then_python

COMPILED = messages._compiled

maybe_bytes = st.one_of(st.none(), st.binary(max_size=32))
header_lists = st.lists(st.tuples(st.sampled_from(["a", "b", SEQUENCE_HEADER]), maybe_bytes), max_size=3)
kafka_records = st.builds(
    lambda offset, key, value, headers, kind, ts: ck.Message(
        topic="ns.orders", partition=3, offset=offset, key=key, value=value, headers=headers or None,
        timestamp=(kind, ts)),
    st.integers(min_value=-1, max_value=2**62), maybe_bytes, maybe_bytes, header_lists,
    st.sampled_from([0, 1, 2]), st.integers(min_value=0, max_value=2**62))


def fields(message: Message) -> tuple[object, ...]:
    return (message.topic(), message.partition(), message.offset(), message.key(), message.value(),
            message.headers(), message.timestamp(), message.error())


conversion = compiled_then_python(messages)


def python_messages(records: list[ck.Message], stream: str, partition: int) -> list[Message]:
    messages._compiled, saved = None, messages._compiled
    try:
        return as_messages(records, stream, partition)
    finally:
        messages._compiled = saved


@given(st.lists(kafka_records, max_size=20))
def test_the_compiled_conversion_gives_what_the_python_one_gives(records: list[ck.Message]) -> None:
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")
    compiled = COMPILED.as_messages(records, "orders", 7, Message, ck.Message, record_headers)
    assert [fields(m) for m in compiled] == [fields(m) for m in python_messages(records, "orders", 7)]


def test_the_compiled_conversion_reads_the_fields_of_confluent_kafkas_records() -> None:
    """The conversion reads confluent-kafka's Message fields itself (~0.08 us a record less than calling its
    getters) once a probe record showed where they lie; this fails when a confluent-kafka release moved them, which
    leaves every field to the getters: still right, only slower."""
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")
    assert messages.READS_FIELDS


def test_a_probe_that_cannot_tell_every_field_apart_or_a_class_with_python_getters_is_refused() -> None:
    """A field left unset could sit anywhere and still agree; a getter written in Python gives what it computes,
    not what the record holds. Either way the fields are asked of the getters (and the class already accepted
    stays so)."""
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")

    class Upper(ck.Message):
        def key(self) -> bytes | None:
            key = super().key()
            return key.upper() if isinstance(key, bytes) else key

    assert not COMPILED.read_fields_of(ck.Message, ck.Message())
    assert not COMPILED.read_fields_of(ck.Message, ck.Message(topic="t", partition=1, offset=2, key=b"k"))
    assert not COMPILED.read_fields_of(Upper, Upper(topic="t", partition=1, offset=2, key=b"k", value=b"v",
                                                    headers=[("h", b"1")], timestamp=(1, 3),
                                                    error=ck.KafkaError(ck.KafkaError._PARTITION_EOF)))
    records = [Upper(topic="t", partition=0, offset=1), Upper(topic="t", partition=0, offset=2, key=b"abc")]
    assert [m.key() for m in as_messages(records, "s", 0)] == [None, b"ABC"]
    assert [m.key() for m in as_messages([ck.Message(topic="t", offset=1, key=b"abc")], "s", 0)] == [b"abc"]


def test_records_become_the_stream_partitions_messages() -> None:
    records = [ck.Message(topic="ns.orders.e1", partition=0, offset=41, key=b"k", value=b"v",
                          headers=[("trace", b"1"), (SEQUENCE_HEADER, b"9")], timestamp=(1, 1_700_000_000_000)),
               ck.Message(topic="ns.orders.e1", partition=0, offset=42, key=None, value=None,
                          headers=[(SEQUENCE_HEADER, b"10")], timestamp=(0, 0))]
    first, second = as_messages(records, "orders", 5)
    assert fields(first) == ("orders", 5, 41, b"k", b"v", [("trace", b"1")], (ck.TIMESTAMP_CREATE_TIME,
                                                                             1_700_000_000_000), None)
    assert fields(second) == ("orders", 5, 42, None, None, None, (ck.TIMESTAMP_NOT_AVAILABLE, 0), None)


def test_records_of_another_class_are_asked_by_name() -> None:
    """A record that is not confluent-kafka's Message (a subclass, say) is read through its methods."""
    class Traced(ck.Message):
        def key(self) -> bytes:
            return b"traced"

    record = Traced(topic="t", partition=0, offset=1, key=b"k", value=b"v", timestamp=(1, 5))
    assert fields(as_messages([record], "s", 0)[0]) == ("s", 0, 1, b"traced", b"v", None,
                                                        (ck.TIMESTAMP_CREATE_TIME, 5), None)


def test_a_getter_that_fails_fails_the_conversion() -> None:
    with pytest.raises(AttributeError):
        as_messages([ck.Message(offset=1), object()], "s", 0)  # type: ignore[list-item]


def test_a_message_class_without_plain_slots_is_left_to_python() -> None:
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")

    class Keyed(Message):
        @property
        def _key(self) -> bytes:  # type: ignore[override]
            return b""

    assert COMPILED.as_messages([ck.Message(offset=1)], "s", 0, Keyed, ck.Message, record_headers) is None


def test_the_conversion_holds_each_value_once() -> None:
    """No reference leaked or lost: a Consumer converts millions of records."""
    value, key = b"v" * 100, b"k" * 10
    records = [ck.Message(topic="t", partition=0, offset=i, key=key, value=value, timestamp=(1, 5))
               for i in range(100)]
    before = sys.getrefcount(value), sys.getrefcount(key)
    converted = as_messages(records, "s", 0)
    assert (sys.getrefcount(value), sys.getrefcount(key)) == (before[0] + 100, before[1] + 100)
    del converted
    assert (sys.getrefcount(value), sys.getrefcount(key)) == before


fetched = st.lists(st.one_of(
    st.builds(lambda t, p, o: ck.Message(topic=t, partition=p, offset=o, value=b"v"),
              st.sampled_from(["x", "y"]), st.integers(0, 2), st.integers(0, 100)),
    st.builds(lambda t, p: ck.Message(topic=t, partition=p, error=ck.KafkaError(ck.KafkaError._PARTITION_EOF)),
              st.sampled_from(["x", "y"]), st.integers(0, 2)),
), max_size=30)


@given(fetched)
def test_a_fetch_splits_into_runs_of_one_partition_and_its_errors(messages: list[ck.Message]) -> None:
    runs, errors = in_runs(messages)
    assert [m for _, run in runs for m in run] == [m for m in messages if m.error() is None]
    assert [m for m, _ in errors] == [m for m in messages if m.error() is not None]
    assert all(e == m.error() for m, e in errors)
    keys = [key for key, _ in runs]
    assert all(a != b for a, b in itertools.pairwise(keys))  # each run as long as it can be
    assert all((m.topic(), m.partition()) == key for key, run in runs for m in run)


def test_a_record_class_without_a_getter_is_refused_not_crashed_on() -> None:
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")

    class NoTimestamp:
        def offset(self) -> int:
            return 1

    with pytest.raises(AttributeError):
        COMPILED.as_messages([ck.Message(offset=1)], "s", 0, Message, NoTimestamp, record_headers)


def test_fields_borrowed_from_another_class_are_left_to_python() -> None:
    """A class whose fields are Message's own descriptors (not slots of its own) would be written past its end."""
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")

    class Borrowing:
        __slots__ = ()

    for name in Message.__slots__:
        setattr(Borrowing, name, getattr(Message, name))
    assert COMPILED.as_messages([ck.Message(offset=1)], "s", 0, Borrowing, ck.Message, record_headers) is None


def test_the_messages_list_is_whole_whenever_python_code_runs() -> None:
    """Headers are converted by Python code, which may walk every object (a heap profiler, a gc callback): a list
    with empty items there crashed the interpreter."""
    def walking(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]] | None:
        for obj in gc.get_objects():
            if isinstance(obj, list):
                len(list(obj))
        return record_headers(headers)

    records = [ck.Message(offset=i, headers=[("h", b"%d" % i)], timestamp=(1, 5)) for i in range(3)]
    messages_ = COMPILED.as_messages(records, "s", 0, Message, ck.Message, walking) if COMPILED else []
    assert [m.headers() for m in messages_] == ([[("h", b"0")], [("h", b"1")], [("h", b"2")]] if COMPILED else [])


def test_a_partition_given_as_an_int_subclass_is_converted() -> None:
    class Partition(int):
        pass

    assert fields(as_messages([ck.Message(offset=3)], "s", Partition(2))[0])[:3] == ("s", 2, 3)


@given(st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.integers(min_value=0, max_value=2**62)))))
def test_a_reporter_notes_where_each_record_landed_or_why_not(reports: list[tuple[bool, int | None]]) -> None:
    landed: list[int] = []
    errors: list[ck.KafkaError] = []
    report = messages.reporter(landed, errors)
    for failed, offset in reports:
        report(ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT) if failed else None,
               ck.Message(topic="t", partition=2, offset=-1001 if offset is None else offset))  # -1001: None
    assert landed == [offset for failed, offset in reports if not failed and offset is not None]
    # delivered without an offset: where it landed is unknown (clients.delivery_error)
    assert [e.code() for e in errors] == [ck.KafkaError._MSG_TIMED_OUT if failed else ck.KafkaError._STATE
                                          for failed, offset in reports if failed or offset is None]
    assert report.reported == len(reports)


def test_a_reporter_holds_what_it_noted_and_nothing_else() -> None:
    landed: list[int] = []
    errors: list[ck.KafkaError] = []
    message, offset = ck.Message(topic="t", partition=2, offset=12345678901), 12345678901
    before = sys.getrefcount(message)
    report = messages.reporter(landed, errors)
    for _ in range(100):
        report(None, message)
    del report
    gc.collect()
    assert landed == [offset] * 100 and sys.getrefcount(message) == before


def read(count: int = 1) -> list[Message]:
    return as_messages([ck.Message(topic="t", partition=0, offset=i, key=b"k", value=b"v", timestamp=(1, 5))
                        for i in range(count)], "s", 0)


def test_a_message_whose_fields_cannot_form_a_cycle_is_left_to_reference_counting(conversion: str) -> None:
    """The compiled conversion leaves a message untracked by the collector while its fields hold nothing it could
    track (collections cost ~0.5 us a record read); one with headers (a list) or given such a field is tracked."""
    (plain,) = read()
    (with_headers,) = as_messages([ck.Message(topic="t", partition=0, offset=2, key=None, value=b"v",
                                              headers=[("a", b"1")], timestamp=(1, 5))], "s", 0)
    assert gc.is_tracked(plain) is (conversion == "python")
    assert gc.is_tracked(with_headers)
    plain.set_value(b"still bytes")
    assert gc.is_tracked(plain) is (conversion == "python")
    plain.set_headers([("b", b"2")])
    assert gc.is_tracked(plain)


class Marker:
    """Something a cycle holds, to see whether the cycle was collected."""


def collected(build: Callable[[Marker], None]) -> bool:
    marker = Marker()
    gone = weakref.ref(marker)
    build(marker)
    del marker
    gc.collect()
    return gone() is None


def test_a_message_given_a_deserialized_value_is_collected_when_that_value_refers_back_to_it() -> None:
    """A JSON deserializer's dict is untracked until it holds a container: the message must be tracked anyway."""
    def cycle(marker: Marker) -> None:
        (message,) = read()
        message.set_value(json.loads(b'{"a": 1}'))  # type: ignore[arg-type]
        message.value()["back"] = [message, marker]  # type: ignore[index]
    assert collected(cycle)


@pytest.mark.parametrize("shape", ["itself", "each other", "through a list"])
def test_messages_in_a_cycle_of_their_own_making_are_collected(shape: str) -> None:
    def cycle(marker: Marker) -> None:
        first, second = read(2)
        first.set_key(marker)  # type: ignore[arg-type]
        if shape == "itself":
            first.set_value(first)  # type: ignore[arg-type]
        elif shape == "each other":
            first.set_value(second)  # type: ignore[arg-type]
            second.set_value(first)  # type: ignore[arg-type]
        else:
            holder: list[object] = []
            first.set_headers(holder)  # type: ignore[arg-type]
            holder.append(first)
    assert collected(cycle)


def test_a_subclass_with_fields_of_its_own_is_always_tracked() -> None:
    if COMPILED is None:
        pytest.skip("the compiled conversion is not built here")

    class Annotated(Message):  # a __dict__: any attribute could close a cycle
        pass

    record = ck.Message(topic="t", partition=0, offset=1, key=b"k", value=b"v", timestamp=(1, 5))
    (message,) = COMPILED.as_messages([record], "s", 0, Annotated, ck.Message, record_headers)
    assert type(message) is Annotated and gc.is_tracked(message)


class Holding:
    """A real confluent-kafka producer whose broker is unreachable: what it took is read back from its delivery
    reports when it is purged."""

    def __init__(self, **conf: object) -> None:
        self.producer = ck.Producer({"bootstrap.servers": "127.0.0.1:9", "message.timeout.ms": 300_000,
                                     "logger": logging.getLogger("unreachable"), **conf})
        self.taken: list[tuple[object, ...]] = []

    def report(self, err: ck.KafkaError | None, msg: ck.Message) -> None:
        self.taken.append((msg.partition(), msg.key(), msg.value()))

    def take_back(self) -> list[tuple[object, ...]]:
        self.producer.purge()
        self.producer.flush(5)
        taken, self.taken = self.taken, []
        return taken


def expected(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None, int]],
             ) -> list[tuple[object, ...]]:
    """What librdkafka should hold of ``records``, as a purged record's delivery report tells it (without headers or
    timestamp: the Kafka contract tests check those)."""
    return [(3, key, value) for key, value, _, _ in records]


sent_records = st.lists(st.tuples(maybe_bytes, maybe_bytes, st.one_of(st.none(), header_lists),
                                  st.integers(min_value=-1, max_value=2**40)), min_size=1, max_size=12)


@settings(max_examples=25, deadline=None)
@given(sent_records, st.integers(min_value=1, max_value=14))
def test_send_hands_records_over_in_order_and_stops_where_the_queue_is_full(
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None, int]], room: int) -> None:
    """Each record reaches produce() as it was given, in order; a full queue stops it there, not raised, and the
    rest is handed over from that index once there is room."""
    holding = Holding(**{"queue.buffering.max.messages": room})
    sent, taken = 0, []
    while sent < len(records):
        start = sent
        sent, refused = messages.send(holding.producer.produce, "t", 3, records, holding.report, start)
        assert sent == min(start + room, len(records))
        assert isinstance(refused, BufferError) if sent < len(records) else refused is None
        taken += holding.take_back()  # room again
    assert taken == expected(records)


def test_send_hands_back_the_error_of_a_record_refused_midway() -> None:
    holding = Holding(**{"message.max.bytes": 1000})
    records = [(None, b"small", None, 0), (None, b"x" * 2000, None, 0), (None, b"never sent", None, 0)]
    sent, refused = messages.send(holding.producer.produce, "t", 3, records, holding.report)
    assert sent == 1 and isinstance(refused, ck.KafkaException)
    assert refused.args[0].code() == ck.KafkaError.MSG_SIZE_TOO_LARGE
    assert [value for _, _, value in holding.take_back()] == [b"small"]


@pytest.mark.parametrize("errors, landed", [
    ([ck.KafkaError._STATE] * 2, []),  # delivered, without an offset (DUPLICATE_SEQUENCE_NUMBER): stored
    ([ck.KafkaError._TRANSPORT] * 2, []),  # possibly persisted, librdkafka says
    ([ck.KafkaError.MSG_SIZE_TOO_LARGE], [7]),  # refused, after the record before it was stored
])
def test_a_plain_append_that_may_be_stored_in_part_is_outcome_unknown(errors: list[int], landed: list[int]) -> None:
    """Only a delivery error that says "not stored", with nothing of the append stored, is a definite refusal: a
    caller retries on one, and a retry of records already stored writes them twice."""
    batch = Batch("s", 0, [Record(None, b"a"), Record(None, b"b")])  # every record reported: delivered, or not
    with pytest.raises(KafkaException) as info:
        kafka_writer._raise_failed_delivery([ck.KafkaError(code) for code in errors], [landed], [batch], "s[0]",
                                            transactional=False)
    assert info.value.error.outcome_unknown() and not info.value.error.retriable(), info.value
    with pytest.raises(KafkaException) as refused:
        kafka_writer._raise_failed_delivery([ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE)] * 2, [[]], [batch],
                                            "s[0]", transactional=False)
    assert not refused.value.error.outcome_unknown()
