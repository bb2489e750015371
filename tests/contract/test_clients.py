"""The confluent-kafka-shaped clients: code written for confluent-kafka runs with a changed config."""

from __future__ import annotations

import contextlib
import gc
import time
import weakref
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest

from onceflow.connector import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    AdminClient,
    Consumer,
    ErrorCode,
    KafkaError,
    KafkaException,
    Message,
    NewPartitions,
    NewTopic,
    Producer,
    TopicPartition,
)
from onceflow.connector.store.shared import stores
from onceflow.connector.topic import DEFAULT_NUM_PARTITIONS
from onceflow.integration.brokers import FAST_GROUP_CONFIG
from tests.conftest import skip_on_tansu


@pytest.fixture
def conf(store_url: str) -> dict[str, str]:
    admin = AdminClient({"store.url": store_url})
    for future in admin.create_topics([NewTopic("orders", 3), NewTopic("single", 1)]).values():
        future.result()
    return {"store.url": store_url}


def reader(conf: dict[str, str], **extra: object) -> Consumer:
    """A consumer that assign()s and commits nothing (confluent-kafka wants a group.id even so)."""
    return Consumer({**conf, "group.id": "reader", "enable.auto.commit": False, **extra})


def fast_group(conf: dict[str, str], group: str, **extra: object) -> dict[str, object]:
    return {**conf, "group.id": group, "auto.offset.reset": "earliest", **FAST_GROUP_CONFIG,
            "heartbeat.interval.ms": 50, **extra}


def produce_keyed(conf: dict[str, str], topic: str, count: int) -> None:
    producer = Producer(conf)
    for i in range(count):
        producer.produce(topic, b"%d" % i, key=b"%d" % i)
    producer.flush()


def drain(consumer: Consumer, count: int, timeout: float = 60) -> list[Message]:
    deadline, out = time.monotonic() + timeout, []
    while len(out) < count and time.monotonic() < deadline:
        out += [m for m in consumer.consume(1000, timeout=0.2) if m.error() is None]
    return out


def error_code(fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(KafkaException) as info:
        fn(*args, **kwargs)
    return info.value.code.name


def test_produce_reports_offsets_and_keys_stay_on_one_partition(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    reports: list[tuple[KafkaError | None, Message]] = []
    for i in range(30):
        producer.produce("orders", value=f"v{i}", key=f"k{i % 5}", headers={"n": str(i)},
                         on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush() == 0
    assert len(reports) == 30 and all(err is None for err, _ in reports)
    by_key: dict[bytes, set[int]] = {}
    for _, msg in reports:
        by_key.setdefault(msg.key(), set()).add(msg.partition())  # type: ignore[arg-type]
    assert all(len(parts) == 1 for parts in by_key.values())
    per_partition: dict[int, list[int]] = {}
    for _, msg in reports:
        per_partition.setdefault(msg.partition(), []).append(msg.offset())  # type: ignore[arg-type]
    assert all(offsets == list(range(len(offsets))) for offsets in per_partition.values())


def test_cas_produce_reports_cas_mismatch_and_writes_nothing(conf: dict[str, str]) -> None:
    producer = Producer({**conf, "linger.ms": 0})
    outcomes: list[KafkaError | None] = []
    producer.produce("single", b"a", expected_offset=0, on_delivery=lambda e, m: outcomes.append(e))
    producer.produce("single", b"b", expected_offset=0, on_delivery=lambda e, m: outcomes.append(e))
    producer.produce("single", b"c", expected_sequence=-1, on_delivery=lambda e, m: outcomes.append(e))
    producer.produce("single", b"d", expected_sequence=-1, on_delivery=lambda e, m: outcomes.append(e))
    producer.flush()
    assert [e.code() if e else None for e in outcomes] == [None, ErrorCode.CAS_MISMATCH, None,
                                                             ErrorCode.CAS_MISMATCH]
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    assert [m.value() for m in drain(consumer, 2)] == [b"a", b"c"]


def test_a_second_producer_with_the_same_writer_id_fences_the_first_which_still_closes(conf: dict[str, str]) -> None:
    first = Producer({**conf, "writer.id": "w", "linger.ms": 0})
    first.produce("single", b"one")
    first.flush()
    Producer({**conf, "writer.id": "w"})
    errors: list[KafkaError | None] = []
    first.produce("single", b"zombie", on_delivery=lambda e, m: errors.append(e))
    first.flush()
    assert errors[0] is not None and errors[0].code() == ErrorCode.PRODUCER_FENCED
    with pytest.raises(KafkaException) as info:
        first.produce("single", b"again")
    assert info.value.code == ErrorCode.PRODUCER_FENCED
    first.close()  # a fenced producer closes without an error: the fence was reported where it was met
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    assert [m.value() for m in drain(consumer, 2, timeout=3)] == [b"one"]


def test_producers_of_one_process_share_one_store_that_closes_with_the_last(conf: dict[str, str]) -> None:
    """Producers naming one store share it (on Kafka its ten librdkafka clients and their threads: 64 Producers ran
    3067 OS threads with a store each); closing one leaves the others producing."""
    plain, transactional = Producer({**conf, "linger.ms": 0}), Producer({**conf, "transactional.id": "shared"})
    assert plain._store is transactional._store
    transactional.init_transactions()
    transactional.begin_transaction()
    transactional.produce("single", b"committed")
    transactional.commit_transaction()
    transactional.close()
    transactional.close()  # a second close releases nothing the other still uses
    plain.produce("single", b"after the other closed")
    assert plain.flush(30) == 0
    store = plain._store
    plain.close()
    assert store not in stores
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    assert [m.value() for m in drain(consumer, 2, timeout=10)] == [b"committed", b"after the other closed"]


def test_produce_bad_input_raises_at_once(conf: dict[str, str]) -> None:
    producer = Producer({**conf, "message.max.bytes": 10})
    for kwargs, code in [
        ({"topic": "orders", "value": b"x", "partition": 9}, ErrorCode.UNKNOWN_TOPIC_OR_PART),
        ({"topic": "orders", "value": b"x", "partition": -5}, ErrorCode._INVALID_ARG),
        ({"topic": "orders", "value": b"x" * 11}, ErrorCode.MSG_SIZE_TOO_LARGE),
        ({"topic": "orders", "value": 12}, ErrorCode.INVALID_RECORD),
    ]:
        with pytest.raises(KafkaException) as info:
            producer.produce(**kwargs)  # type: ignore[arg-type]
        assert info.value.code == code, kwargs
    assert len(producer) == 0


def test_producing_to_a_topic_that_does_not_exist_fails_its_delivery_as_confluent_kafkas(
        conf: dict[str, str]) -> None:
    reports: list[tuple[KafkaError | None, Message]] = []
    producer = Producer({**conf, "on_delivery": lambda err, msg: reports.append((err, msg))})
    producer.produce("nope", b"lost", key=b"k")  # queued, as confluent-kafka queues it
    producer.produce("nope", b"pinned", partition=0)
    producer.produce("orders", b"kept", partition=1)
    assert producer.flush() == 0
    failed = [(err.code(), msg.topic(), msg.partition(), msg.value()) for err, msg in reports if err is not None]
    assert sorted(failed) == [(ErrorCode.UNKNOWN_TOPIC_OR_PART, "nope", -1, b"lost"),
                              (ErrorCode.UNKNOWN_TOPIC_OR_PART, "nope", 0, b"pinned")]
    assert [(msg.value(), msg.offset()) for err, msg in reports if err is None] == [(b"kept", 0)]
    AdminClient(conf).create_topics([NewTopic("nope", 1)])["nope"].result()
    producer.produce("nope", b"now", partition=0)  # the topic made meanwhile is found
    assert producer.flush() == 0
    assert reports[-1][0] is None and reports[-1][1].offset() == 0
    consumer = reader(conf)
    consumer.assign([TopicPartition("nope", 0, OFFSET_BEGINNING)])
    assert [m.value() for m in drain(consumer, 1, timeout=5)] == [b"now"]
    consumer.close()


def test_a_transactional_produce_to_a_missing_topic_raises_so_the_commit_cannot_miss_it(
        conf: dict[str, str]) -> None:
    """A failed delivery the transaction does not know of would commit without the record: raise instead."""
    producer = Producer({**conf, "transactional.id": "app"})
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(KafkaException) as info:
        producer.produce("nope", b"x")
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PART
    producer.abort_transaction()


def test_producer_routes_to_the_new_epoch_after_a_scale_by_another_client(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    producer.produce("orders", b"before", key=b"k")
    producer.flush()
    AdminClient(conf).scale_topic("orders", 2).result()
    reports: list[Message] = []
    producer.produce("orders", b"after", key=b"k", on_delivery=lambda e, m: reports.append(m))
    assert producer.flush() == 0
    assert reports[0].error() is None and reports[0].partition() in (3, 4)
    pinned: list[KafkaError | None] = []
    producer.produce("orders", b"pinned", partition=0, on_delivery=lambda e, m: pinned.append(e))
    producer.flush()
    assert pinned[0] is not None and pinned[0].code() == ErrorCode.PARTITION_SEALED


def test_batches_sent_together_land_or_fail_each_alone(conf: dict[str, str]) -> None:
    """The embedded store writes the batches of several partitions in one durable write: a batch refused there
    (a sealed partition) must not take the others with it, nor be reported landed."""
    AdminClient(conf).scale_topic("orders", 2).result()  # partitions 0-2 sealed, 3-4 open
    producer = Producer({**conf, "linger.ms": 60_000})  # nothing is sent before the flush: one group
    reports: dict[bytes, tuple[KafkaError | None, int | None]] = {}
    for value, partition in ((b"open-3", 3), (b"sealed-0", 0), (b"open-4", 4), (b"sealed-1", 1)):
        producer.produce("orders", value, partition=partition,
                         on_delivery=lambda e, m: reports.update({m.value(): (e, m.offset())}))
    assert producer.flush() == 0
    assert {v: (e.code() if e else None) for v, (e, _) in reports.items()} == {
        b"open-3": None, b"open-4": None, b"sealed-0": ErrorCode.PARTITION_SEALED,
        b"sealed-1": ErrorCode.PARTITION_SEALED}
    consumer = reader(conf)
    consumer.assign([TopicPartition("orders", p, 0) for p in range(5)])
    assert sorted(m.value() for m in drain(consumer, 2, timeout=10)) == [b"open-3", b"open-4"]
    assert [consumer.get_watermark_offsets(TopicPartition("orders", p))[1] for p in (0, 1)] == [0, 0]
    consumer.close()


def test_a_timestamp_beyond_64_bits_fails_its_batch_and_writes_none_of_it(conf: dict[str, str]) -> None:
    """On Kafka, confluent-kafka refused such a timestamp with an OverflowError midway through the batch: the
    record before it was written, and the error escaped flush() unreported."""
    producer = Producer({**conf, "linger.ms": 60_000})  # one batch, at the flush
    reports: list[KafkaError | None] = []
    for timestamp in (0, 2**63):
        producer.produce("single", b"v", partition=0, timestamp=timestamp, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush() == 0
    assert [e.code() if e else None for e in reports] == [ErrorCode.INVALID_RECORD] * 2
    consumer = reader(conf)
    assert consumer.get_watermark_offsets(TopicPartition("single", 0))[1] == 0
    producer.close()
    consumer.close()


def test_consumer_reads_keys_in_order_across_a_scale(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    admin = AdminClient(conf)
    for round_ in range(3):
        for i in range(40):
            producer.produce("orders", f"{round_}:{i}", key=f"key-{i % 7}")
        producer.flush()
        admin.scale_topic("orders", [2, 5, 1][round_]).result()
    consumer = Consumer(fast_group(conf, "ordered"))
    consumer.subscribe(["orders"])
    messages = drain(consumer, 120)
    assert len(messages) == 120
    seen: dict[bytes, list[tuple[int, int]]] = {}
    for m in messages:
        r, i = map(int, (m.value() or b"").split(b":"))
        seen.setdefault(m.key(), []).append((r, i))  # type: ignore[arg-type]
    assert all(values == sorted(values) for values in seen.values())
    consumer.close()


def test_a_consumer_reading_from_latest_when_a_scale_comes_loses_nothing_written_to_the_new_epoch(
        conf: dict[str, str]) -> None:
    """auto.offset.reset=latest (the default): the new epoch's partitions, with no committed offset, started at
    their end once the old ones were read to theirs, skipping what was written to them meanwhile."""
    consumer = Consumer(fast_group(conf, "latest", **{"auto.offset.reset": "latest"}))
    consumer.subscribe(["orders"])
    deadline = time.monotonic() + 60

    def positioned() -> bool:  # every partition assigned, its position at its end: what comes next is read
        assigned = consumer.assignment()
        return len(assigned) == 3 and all(tp.offset >= 0 for tp in consumer.position(assigned))

    while not positioned() and time.monotonic() < deadline:
        consumer.consume(1, timeout=0.1)
    producer = Producer(conf)
    for i in range(10):
        if i == 5:
            producer.flush()
            assert sorted(m.value() for m in drain(consumer, 5)) == [b"old%d" % n for n in range(5)]
            AdminClient(conf).scale_topic("orders", 5).result()
        producer.produce("orders", b"%s%d" % (b"old" if i < 5 else b"new", i), key=b"key-%d" % (i % 3))
    producer.flush()
    assert sorted(m.value() for m in drain(consumer, 5)) == [b"new%d" % n for n in range(5, 10)]
    consumer.close()


def test_a_rewind_across_a_scale_reads_each_keys_records_in_order_again(conf: dict[str, str]) -> None:
    """After a seek back (an application rewinding after an aborted transaction), the new epoch's partitions wait
    for the old ones again: they had been read to their ends once, and were read at the same time as the old
    ones the second time, a key's new records before its old ones."""
    producer = Producer(conf)
    for i in range(20):
        if i == 10:
            producer.flush()
            AdminClient(conf).scale_topic("orders", 2).result()
        producer.produce("orders", b"%d" % i, key=b"key-%d" % (i % 3))
    producer.flush()
    consumer = reader(conf, **{"auto.offset.reset": "earliest"})
    partitions = [TopicPartition("orders", p, 0) for p in range(5)]  # epoch 0: 0..2, epoch 1: 3..4
    consumer.assign(partitions)
    for round_ in range(2):
        if round_:
            for tp in partitions:
                consumer.seek(tp)
        seen: dict[bytes | None, list[int]] = {}
        for m in drain(consumer, 20):
            seen.setdefault(m.key(), []).append(int(m.value() or b""))
        assert sum(map(len, seen.values())) == 20
        assert all(values == sorted(values) for values in seen.values()), (round_, seen)
    consumer.close()


def test_offsets_of_partitions_without_a_position_are_ignored_in_a_transaction_as_confluent_kafka_does(
        conf: dict[str, str]) -> None:
    """The exactly-once loop sends ``position(assignment())``: a partition with no position yet (not read, or a
    new epoch's waiting for the old one after a scale) has OFFSET_INVALID there. It was refused (INVALID_REQUEST),
    so that loop failed; confluent-kafka ignores such offsets."""
    produce_keyed(conf, "single", 3)
    AdminClient(conf).scale_topic("single", 2).result()  # single[1] and single[2] wait for single[0]
    consumer = reader(conf, **{"auto.offset.reset": "earliest"})
    assigned = [TopicPartition("single", p) for p in range(3)]
    consumer.assign(assigned)
    assert len(consumer.consume(1, timeout=30)) == 1
    producer = Producer({**conf, "transactional.id": "copier"})
    producer.init_transactions()
    producer.begin_transaction()
    positions = consumer.position(consumer.assignment())
    assert sorted((tp.partition, tp.offset) for tp in positions) == [(0, 1), (1, OFFSET_INVALID), (2, OFFSET_INVALID)]
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata())
    producer.commit_transaction()
    assert [tp.offset for tp in consumer.committed(assigned)] == [1, OFFSET_INVALID, OFFSET_INVALID]
    producer.close()
    consumer.close()


def test_group_members_read_a_scaled_streams_new_partitions_when_the_old_one_hands_out_nothing(
        conf: dict[str, str]) -> None:
    """single[0] is sealed empty, so its owner never hands out (nor commits) a record of it: the member owning a
    successor waits for the group's committed offset of single[0] to reach its end. It waited forever."""
    AdminClient(conf).scale_topic("single", 2).result()  # single[1] and single[2] continue the empty single[0]
    members = [Consumer(fast_group(conf, "finishers", **{"enable.auto.commit": False})) for _ in range(2)]
    for member in members:
        member.subscribe(["single"])
    deadline = time.monotonic() + 60
    while not all(m.assignment() for m in members) and time.monotonic() < deadline:
        for member in members:
            member.poll(0.05)
    produce_keyed(conf, "single", 40)  # into single[1] and single[2], once the two members share the partitions
    got: list[Message] = []
    while len(got) < 40 and time.monotonic() < deadline:
        for member in members:
            got += [m for m in member.consume(100, timeout=0.05) if m.error() is None]
    assert sorted(int(m.value() or b"") for m in got) == list(range(40))
    for member in members:
        member.close()


def test_subscribe_commit_and_resume_from_committed(conf: dict[str, str]) -> None:
    produce_keyed(conf, "orders", 50)
    assigned: list[list[TopicPartition]] = []
    first = Consumer(fast_group(conf, "g", **{"enable.auto.commit": False}))
    first.subscribe(["orders"], on_assign=lambda c, ps: assigned.append(ps))
    got = drain(first, 20)[:20]
    for message in got:
        first.commit(message=message, asynchronous=False)
    assert sorted(tp.partition for tp in assigned[0]) == [0, 1, 2]
    first.close()
    second = Consumer(fast_group(conf, "g"))
    second.subscribe(["orders"])
    rest = drain(second, 30)
    seen = {(m.partition(), m.offset()) for m in got}
    later = {(m.partition(), m.offset()) for m in rest}
    assert seen.isdisjoint(later)  # nothing committed is delivered again
    assert len(seen | later) == 50 == len(got) + len(rest)
    second.close()


def test_with_auto_offset_store_off_only_stored_offsets_are_committed(conf: dict[str, str]) -> None:
    """enable.auto.offset.store=false: the application says which records are done (store_offsets), and the
    auto-commit on close commits exactly those, not what was merely returned."""
    produce_keyed(conf, "single", 10)
    consumer = Consumer({**conf, "group.id": "stores", "auto.offset.reset": "earliest",
                         "enable.auto.offset.store": False})
    consumer.assign([TopicPartition("single", 0)])
    got = drain(consumer, 10)
    assert error_code(consumer.store_offsets, offsets=[TopicPartition("orders", 0, 1)]) == "_STATE"  # not assigned
    consumer.store_offsets(message=got[3])
    consumer.close()
    committed = reader(conf, **{"group.id": "stores"}).committed([TopicPartition("single", 0)])
    assert [tp.offset for tp in committed] == [got[3].offset() + 1]
    auto = reader(conf, **{"auto.offset.reset": "earliest"})
    auto.assign([TopicPartition("single", 0)])
    assert error_code(auto.store_offsets, message=drain(auto, 1)[0]) == "_INVALID_ARG"  # auto store is on
    auto.close()


def test_two_members_split_partitions_and_hand_over_on_close(conf: dict[str, str]) -> None:
    produce_keyed(conf, "orders", 300)
    a = Consumer(fast_group(conf, "split"))
    b = Consumer(fast_group(conf, "split"))
    a.subscribe(["orders"])
    got_a = drain(a, 40)
    b.subscribe(["orders"])
    deadline, got_b = time.monotonic() + 60, []
    while (not b.assignment() or len(a.assignment()) == 3) and time.monotonic() < deadline:
        got_a += a.consume(10, timeout=0.05)
        got_b += b.consume(1, timeout=0.05)  # on Apache Kafka b may already have a partition and a record
    assert a.assignment() and b.assignment()
    assert {tp.partition for tp in a.assignment()}.isdisjoint({tp.partition for tp in b.assignment()})
    a.close()  # commits and leaves: b takes over from a's committed positions
    got_b += drain(b, 300 - len(got_a) - len(got_b))
    positions = [(m.partition(), m.offset()) for m in got_a + got_b if m.error() is None]
    assert len(positions) == len(set(positions)) == 300
    b.close()


def test_a_revoke_callback_that_raises_still_gives_its_partitions_up(conf: dict[str, str]) -> None:
    """As confluent-kafka unassigns them all the same: a member that kept reading them read what the new owner
    read (on Kafka it kept them, and committed over the new owner's offsets)."""
    produce_keyed(conf, "orders", 30)
    raised: list[list[TopicPartition]] = []
    revoked: list[int] = []

    def failing_once(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked.extend(tp.partition for tp in partitions)
        if not raised:
            raised.append(partitions)
            raise RuntimeError("revoke callback failed")

    a = Consumer(fast_group(conf, "raising", **{"enable.auto.commit": False}))
    a.subscribe(["orders"], on_revoke=failing_once)
    drain(a, 30)
    b = Consumer(fast_group(conf, "raising", **{"enable.auto.commit": False}))
    b.subscribe(["orders"])
    deadline = time.monotonic() + 60
    while (not raised or not b.assignment()) and time.monotonic() < deadline:
        with contextlib.suppress(RuntimeError):
            a.poll(0.05)
        b.poll(0.05)
    for _ in range(20):  # both keep following the group a while
        a.poll(0.02)
        b.poll(0.02)
    assert raised and b.assignment()
    assert {tp.partition for tp in a.assignment()}.isdisjoint({tp.partition for tp in b.assignment()})
    assert len(revoked) == len(set(revoked)), "each partition given up once, not again as lost"
    a.close()
    b.close()


def test_a_member_whose_session_ended_is_told_its_partitions_were_lost_and_reads_none_twice(
        conf: dict[str, str]) -> None:
    """Member a stops polling past max.poll.interval.ms; b takes the partition, reads it to its end and commits.
    When a polls again it is told it lost the partition, and is handed nothing b read (on the embedded store it
    took the partition back silently and went on from its own position)."""
    produce_keyed(conf, "single", 20)
    lost: list[list[TopicPartition]] = []
    a = Consumer(fast_group(conf, "stalled", **{"enable.auto.commit": False}))
    a.subscribe(["single"], on_lost=lambda consumer, partitions: lost.append(partitions))
    a.commit(message=drain(a, 5)[1])  # a processed records 0 and 1, and holds a position past them
    b = Consumer(fast_group(conf, "stalled", **{"enable.auto.commit": False}))
    b.subscribe(["single"])
    got_b = drain(b, 18, timeout=90)
    assert [m.offset() for m in got_b] == list(range(2, 20))
    b.commit(message=got_b[-1])
    b.close()
    deadline, again = time.monotonic() + 30, []
    while not lost and time.monotonic() < deadline:
        again += a.consume(10, timeout=0.1)
    again += a.consume(10, timeout=1)
    assert lost and [m.offset() for m in again if m.error() is None] == []
    a.close()


def test_a_consumer_whose_revoke_callback_fails_at_close_still_leaves_its_group(conf: dict[str, str]) -> None:
    """A member left behind would hold its partitions, and keep the group from being empty (a Connect sink's
    offsets could not be reset), until its session ran out: on Kafka its client kept heartbeating."""
    produce_keyed(conf, "orders", 30)

    def failing(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        raise RuntimeError("the application's revoke callback failed")

    member = Consumer(fast_group(conf, "leaving"))
    member.subscribe(["orders"], on_revoke=failing)
    drain(member, 30)
    with pytest.raises(RuntimeError, match="revoke callback failed"):
        member.close()
    assert AdminClient(conf).describe_consumer_groups(["leaving"])["leaving"].result().members == []


def test_assigning_a_partition_or_topic_that_does_not_exist_is_refused_and_changes_nothing(
        conf: dict[str, str]) -> None:
    consumer = reader(conf)
    consumer.assign([TopicPartition("orders", 0)])
    for bad in ([TopicPartition("orders", 1), TopicPartition("orders", 9)], [TopicPartition("nope", 0)]):
        assert error_code(consumer.assign, bad) == "UNKNOWN_TOPIC_OR_PART"
        assert error_code(consumer.incremental_assign, bad) == "UNKNOWN_TOPIC_OR_PART"
        assert [(tp.topic, tp.partition) for tp in consumer.assignment()] == [("orders", 0)]
    consumer.close()


def test_committing_offsets_of_a_partition_that_does_not_exist_is_refused_and_commits_none(
        conf: dict[str, str]) -> None:
    consumer = Consumer({**conf, "group.id": "assigner", "enable.auto.commit": False})
    for bad in (TopicPartition("orders", 9, 1), TopicPartition("nope", 0, 1)):
        assert error_code(consumer.commit, offsets=[TopicPartition("orders", 0, 1), bad],
                          asynchronous=False) == "UNKNOWN_TOPIC_OR_PART"
    assert consumer.committed([TopicPartition("orders", 0)])[0].offset == OFFSET_INVALID
    consumer.close()


def test_a_paused_partition_hands_out_nothing_until_resumed_not_even_what_was_fetched(conf: dict[str, str]) -> None:
    produce_keyed(conf, "single", 3)
    consumer = reader(conf)
    single = [TopicPartition("single", 0, 0)]
    consumer.assign(single)
    assert [m.offset() for m in consumer.consume(1, timeout=30)] == [0]  # the other two fetched with it
    consumer.pause(single)
    assert consumer.poll(0.5) is None
    assert [tp.offset for tp in consumer.position(single)] == [1]
    consumer.resume(single)
    assert [m.offset() for m in drain(consumer, 2)] == [1, 2]
    consumer.close()


def test_a_cas_append_is_checked_after_the_records_produced_before_it_landed(conf: dict[str, str]) -> None:
    """On Kafka the records produced before it were still in flight when the CAS append's check read the
    partition's end: it was refused (CAS_MISMATCH) although it expected the end they make, or, had it expected the
    end before them, it would have landed ahead of them."""
    producer = Producer(conf)
    reports: list[tuple[KafkaError | None, int | None]] = []
    producer.produce("single", b"c0", partition=0, expected_offset=0)
    producer.flush()
    watermarks = reader(conf)
    end = watermarks.get_watermark_offsets(TopicPartition("single", 0))[1]  # (on Kafka past c0's commit marker)
    watermarks.close()
    for _ in range(20_000):
        producer.produce("single", b"x" * 1000, partition=0)
    producer.produce("single", b"c1", partition=0, expected_offset=end + 20_000,
                     on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    producer.flush()
    assert reports == [(None, end + 20_000)]
    producer.close()


def test_records_sealed_out_of_their_partition_are_reported_when_they_cannot_be_routed_again(
        conf: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """They were neither routed again nor reported: flush() never returned 0 again."""
    producer = Producer(conf)
    reports: list[KafkaError | None] = []
    producer.produce("single", b"x", key=b"k", on_delivery=lambda err, msg: reports.append(err))  # routed now
    AdminClient(conf).scale_topic("single", 2).result()  # by another client: the producer learns it appending
    store = producer._store  # type: ignore[attr-defined]
    described = store.describe_stream
    failures = [KafkaException(KafkaError(ErrorCode._TRANSPORT, "the catalog cannot be read", retriable=True))]

    def describe_failing_once(name: str) -> Any:
        if failures:
            raise failures.pop()
        return described(name)

    monkeypatch.setattr(store, "describe_stream", describe_failing_once)
    with contextlib.suppress(KafkaException):
        producer.flush()
    assert producer.flush() == 0
    assert [e.code() if e is not None else None for e in reports] == [ErrorCode.PARTITION_SEALED]
    producer.close()


def test_assign_seek_position_watermarks_and_eof(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    for i in range(5):
        producer.produce("single", b"%d" % i)
    producer.flush()
    consumer = reader(conf, **{"enable.partition.eof": True})
    consumer.assign([TopicPartition("single", 0, 2)])
    assert [m.value() for m in drain(consumer, 3)] == [b"2", b"3", b"4"]
    assert consumer.position([TopicPartition("single", 0)])[0].offset == 5
    eof = consumer.poll(1)
    assert eof is not None and eof.error() is not None and eof.error().code() == KafkaError._PARTITION_EOF
    consumer.seek(TopicPartition("single", 0, OFFSET_BEGINNING))
    assert consumer.poll(1).value() == b"0"  # type: ignore[union-attr]
    consumer.seek(TopicPartition("single", 0, OFFSET_END))
    assert consumer.position([TopicPartition("single", 0)])[0].offset == 5
    assert consumer.get_watermark_offsets(TopicPartition("single", 0)) == (0, 5)
    consumer.close()


def test_auto_offset_reset_latest_and_error(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    producer.produce("single", b"old")
    producer.flush()
    latest = Consumer({**conf, "group.id": "l"})
    latest.assign([TopicPartition("single", 0)])
    assert latest.poll(0.2) is None
    producer.produce("single", b"new")
    producer.flush()
    assert latest.poll(2).value() == b"new"  # type: ignore[union-attr]
    strict = Consumer({**conf, "group.id": "e", "auto.offset.reset": "error"})
    strict.assign([TopicPartition("single", 0)])
    event = strict.poll(1)
    assert event is not None and event.error() is not None
    assert event.error().code() == ErrorCode.OFFSET_OUT_OF_RANGE


def test_consumer_bad_input(conf: dict[str, str]) -> None:
    consumer = reader(conf)
    with pytest.raises(KafkaException) as info:
        consumer.assign([TopicPartition("orders", 17)])
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PART
    with pytest.raises(KafkaException) as info:
        consumer.seek(TopicPartition("orders", 0, 3))
    assert info.value.code == ErrorCode._STATE
    fresh_group = Consumer({**conf, "group.id": "never-committed"})
    assert fresh_group.committed([TopicPartition("orders", 0)])[0].offset == OFFSET_INVALID
    consumer.close()
    with pytest.raises(KafkaException):
        consumer.poll(0)


def test_admin_futures_create_list_and_delete(conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    futures = admin.create_topics([NewTopic("orders", 2), NewTopic("fresh", 2)])
    with pytest.raises(KafkaException) as info:
        futures["orders"].result()
    assert info.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert futures["fresh"].result() is None
    metadata = admin.list_topics()
    assert sorted(metadata.topics) == ["fresh", "orders", "single"]
    assert sorted(metadata.topics["orders"].partitions) == [0, 1, 2]
    admin.delete_topics(["fresh"])["fresh"].result()
    assert "fresh" not in admin.list_topics().topics


def test_admin_validate_only_checks_everything_and_creates_nothing(conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    assert admin.create_topics([NewTopic("fresh", 2)], validate_only=True)["fresh"].result() is None
    refused = {"orders": ErrorCode.TOPIC_ALREADY_EXISTS, "many-copies": ErrorCode.INVALID_REPLICATION_FACTOR,
               "no-partitions": ErrorCode.INVALID_PARTITIONS}
    futures = admin.create_topics([NewTopic("orders", 2), NewTopic("many-copies", 1, replication_factor=3),
                                   NewTopic("no-partitions", 0)], validate_only=True)
    for topic, code in refused.items():
        with pytest.raises(KafkaException) as info:
            futures[topic].result()
        assert info.value.code == code, (topic, info.value)
    assert sorted(admin.list_topics().topics) == ["orders", "single"]
    admin.close()


def test_admin_topic_settings_apply_to_every_epoch_on_kafka_and_are_refused_embedded(
        conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    retention = {"retention.ms": "3600000"}
    future = admin.create_topics([NewTopic("kept", 1, replication_factor=1, config=retention)])["kept"]
    if not conf["store.url"].startswith("kafka://"):
        with pytest.raises(KafkaException) as info:
            future.result()
        assert info.value.code == ErrorCode.INVALID_CONFIG and "retention.ms" in str(info.value)
        assert "kept" not in admin.list_topics().topics
        admin.close()
        return
    future.result()
    admin.scale_topic("kept", 2).result()
    bootstrap, namespace = conf["store.url"].removeprefix("kafka://").split("/")
    kafka = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    for topic in (f"{namespace}.kept", f"{namespace}.kept.epoch-1"):
        resource = confluent_kafka.admin.ConfigResource(confluent_kafka.admin.ResourceType.TOPIC, topic)
        described = kafka.describe_configs([resource])[resource].result(timeout=30)
        assert described["retention.ms"].value == "3600000", topic
    admin.close()


def test_admin_delete_records_moves_the_low_watermark(conf: dict[str, str], request: pytest.FixtureRequest) -> None:
    skip_on_tansu(conf["store.url"], request, "Tansu does not support DeleteRecords (integration/PEER.md)")
    admin = AdminClient(conf)
    producer = Producer(conf)
    for i in range(4):
        producer.produce("single", b"%d" % i)
    producer.flush()
    low = admin.delete_records([TopicPartition("single", 0, 2)])
    assert next(iter(low.values())).result().offset == 2


def test_a_consumer_without_group_id_is_refused_as_confluent_kafka_refuses_it(conf: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"group\.id must be set"):
        confluent_kafka.Consumer({"bootstrap.servers": "localhost:1"})
    with pytest.raises(KafkaException) as info:
        Consumer(conf)
    assert info.value.code == KafkaError.INVALID_CONFIG and "group.id" in str(info.value)


def test_consume_zero_returns_nothing_and_leaves_the_records(conf: dict[str, str]) -> None:
    produce_keyed(conf, "single", 2)
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    assert consumer.consume(0, timeout=1) == []
    assert [m.value() for m in drain(consumer, 2)] == [b"0", b"1"]
    consumer.close()


@pytest.mark.parametrize("collecting", [True, False], ids=["gc-on", "gc-off"])
def test_consumed_messages_stay_collectable_and_the_collector_stays_as_it_was(conf: dict[str, str],
                                                                          collecting: bool) -> None:
    """Reading leaves the garbage collector on or off as it found it, and a message read, once given a field that
    refers back to it (a deserialized value holding it, say), is collected as any cycle is."""
    produce_keyed(conf, "single", 250)  # more than one chunk of a fetch on Kafka (messages.UNTRACKED_CHUNK)
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        messages = drain(consumer, 250)
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
    consumer.close()
    assert [m.value() for m in messages] == [b"%d" % i for i in range(250)]

    class Holder:
        message: Message

    holder = Holder()
    holder.message = messages[0]
    messages[0].set_value(holder)  # type: ignore[arg-type]  # a cycle: message -> holder -> message
    gone = weakref.ref(holder)
    del holder, messages
    gc.collect()
    assert gone() is None


def test_topic_partitions_are_equal_whatever_their_offsets(conf: dict[str, str]) -> None:
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, 5)])
    positions = {tp: tp.offset for tp in consumer.position([TopicPartition("single", 0)])}
    assert positions[TopicPartition("single", 0, OFFSET_INVALID)] == 5  # looked up by topic and partition
    consumer.close()


def test_new_topic_without_a_partition_count_gets_the_documented_default(conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    assert NewTopic("fresh").num_partitions == confluent_kafka.admin.NewTopic("fresh").num_partitions == -1
    admin.create_topics([NewTopic("fresh")])["fresh"].result()
    assert sorted(admin.list_topics("fresh").topics["fresh"].partitions) == list(range(DEFAULT_NUM_PARTITIONS))


def test_internal_topics_cannot_be_created_or_changed(conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    name = "__onceflow.txn.default.log"
    for future in (admin.create_topics([NewTopic(name, 1)])[name], admin.delete_topics([name])[name],
                   admin.scale_topic(name, 2)):
        with pytest.raises(KafkaException) as info:
            future.result()
        assert info.value.code == KafkaError.TOPIC_EXCEPTION and "reserved" in str(info.value)


def test_produce_refuses_a_negative_partition_other_than_any(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    with pytest.raises(KafkaException) as info:
        producer.produce("single", b"x", partition=-5)
    assert info.value.code == KafkaError._INVALID_ARG and "-1" in str(info.value)
    producer.produce("single", b"x", partition=-1)  # -1: the partitioner chooses
    assert producer.flush() == 0


def test_transactional_api_without_transactional_id_is_not_configured(conf: dict[str, str]) -> None:
    with pytest.raises(KafkaException) as info:
        Producer(conf).begin_transaction()
    assert info.value.args[0].code() == KafkaError._NOT_CONFIGURED


def commit_or_abort(producer: Producer) -> str:
    """confluent-kafka's standard handling of a commit: retry the retriable, abort what requires an abort."""
    while True:
        try:
            producer.commit_transaction()
            return "committed"
        except KafkaException as exc:
            error = exc.args[0]
            if error.retriable():
                continue
            if error.txn_requires_abort():
                assert error.code() == KafkaError.TRANSACTION_TIMED_OUT and not error.fatal()
                producer.abort_transaction()
                return "aborted"
            raise


@pytest.mark.parametrize("staged", [False, True], ids=["in-memory", "staged"])
def test_a_timed_out_transaction_is_handled_by_confluent_kafkas_standard_loop(conf: dict[str, str],
                                                                              staged: bool) -> None:
    producer = Producer({**conf, "transactional.id": "app", "transaction.timeout.ms": 1_000})
    producer.init_transactions()

    def attempt(value: bytes, delay: float) -> str:
        producer.begin_transaction()
        producer.produce("single", value, partition=0)
        if staged:
            producer.flush()  # the records are staged in the log: the commit is the group's
        time.sleep(delay)
        return commit_or_abort(producer)

    assert attempt(b"too late", 1.2) == "aborted"
    # The application retries after an abort (on a slow broker a retry may time out as well).
    assert any(attempt(b"in time", 0) == "committed" for _ in range(3))
    consumer = reader(conf)
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    assert [m.value() for m in drain(consumer, 1)] == [b"in time"]
    assert consumer.consume(10, timeout=0.5) == []


def test_incremental_assign_and_unassign_change_only_the_named_partitions(conf: dict[str, str]) -> None:
    producer = Producer(conf)
    for p in range(3):
        producer.produce("orders", b"p%d" % p, partition=p)
    producer.flush()
    consumer = reader(conf)
    consumer.assign([TopicPartition("orders", 0, 0)])
    consumer.incremental_assign([TopicPartition("orders", 1, 0), TopicPartition("orders", 2, 0)])
    assert sorted(m.value() for m in drain(consumer, 3)) == [b"p0", b"p1", b"p2"]
    consumer.incremental_unassign([TopicPartition("orders", 0)])
    assert sorted(tp.partition for tp in consumer.assignment()) == [1, 2]
    with pytest.raises(KafkaException) as info:
        consumer.incremental_assign([TopicPartition("orders", 1, 0)])
    assert info.value.code == ErrorCode._CONFLICT
    with pytest.raises(KafkaException) as info:
        consumer.incremental_unassign([TopicPartition("orders", 0)])
    assert info.value.code == ErrorCode._INVALID_ARG and "orders" in str(info.value)
    consumer.close()


def test_create_partitions_grows_a_topic_by_a_scale_and_refuses_shrinking(conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    with pytest.raises(KafkaException) as info:
        admin.create_partitions([NewPartitions("orders", 2)])["orders"].result()
    assert info.value.code == ErrorCode.INVALID_PARTITIONS and "3 partitions" in str(info.value)
    admin.create_partitions([NewPartitions("orders", 5)], validate_only=True)["orders"].result()
    assert len(admin.list_topics("orders").topics["orders"].partitions) == 3  # validated, nothing changed
    admin.create_partitions([NewPartitions("orders", 5)])["orders"].result()
    partitions = admin.list_topics("orders").topics["orders"].partitions
    assert sorted(p.id for p in partitions.values() if not p.sealed) == [3, 4, 5, 6, 7]


def test_purge_drops_queued_records_and_reports_them(conf: dict[str, str]) -> None:
    producer = Producer({**conf, "linger.ms": 60_000})  # nothing is sent before the purge
    reports: list[KafkaError | None] = []
    for i in range(5):
        producer.produce("orders", b"%d" % i, partition=i % 3, on_delivery=lambda e, m: reports.append(e))
    producer.purge()
    assert producer.flush() == 0
    assert [e.code() if e else None for e in reports] == [ErrorCode._PURGE_QUEUE] * 5
    producer.produce("orders", b"after", partition=0, on_delivery=lambda e, m: reports.append(e))
    producer.flush()
    assert reports[-1] is None
    consumer = reader(conf)
    assert [consumer.get_watermark_offsets(TopicPartition("orders", p))[1] for p in range(3)] == [1, 0, 0]
    consumer.close()


def produce_at(conf: dict[str, str], topic: str, timestamps: list[int], partition: int = 0) -> None:
    producer = Producer(conf)
    for i, timestamp in enumerate(timestamps):
        producer.produce(topic, b"%d" % i, partition=partition, timestamp=timestamp)
    producer.flush()


def test_offsets_for_times_finds_the_first_record_at_or_after_a_time(conf: dict[str, str]) -> None:
    """As confluent-kafka's: the earliest offset whose timestamp is >= the one asked, -1 when all are older; out of
    order timestamps count in offset order."""
    produce_at(conf, "single", [1_000, 2_000, 1_500, 3_000, 3_000, 5_000])
    consumer = reader(conf)
    asked = [TopicPartition("single", 0, t) for t in (0, 1_000, 1_200, 2_500, 3_000, 5_000, 5_001)]
    found = consumer.offsets_for_times(asked, timeout=10)
    assert [(tp.topic, tp.partition, tp.offset) for tp in found] == [
        ("single", 0, 0), ("single", 0, 0), ("single", 0, 1), ("single", 0, 3), ("single", 0, 3),
        ("single", 0, 5), ("single", 0, OFFSET_END)]
    consumer.assign([TopicPartition("single", 0, found[3].offset)])  # the usual next step: read from there
    assert [m.timestamp()[1] for m in drain(consumer, 3)] == [3_000, 3_000, 5_000]
    assert error_code(consumer.offsets_for_times, [TopicPartition("nope", 0, 0)]) == "UNKNOWN_TOPIC_OR_PART"
    consumer.close()


def test_offsets_for_times_skips_truncated_records(conf: dict[str, str]) -> None:
    produce_at(conf, "single", [1_000, 2_000, 3_000, 4_000])
    admin = AdminClient(conf)
    admin.delete_records([TopicPartition("single", 0, 2)])[TopicPartition("single", 0)].result()
    consumer = reader(conf)
    assert consumer.offsets_for_times([TopicPartition("single", 0, 1_500)])[0].offset == 2
    consumer.close()


def test_list_offsets_answers_every_offset_spec(conf: dict[str, str]) -> None:
    from onceflow.connector.admin import ListOffsetsResultInfo, OffsetSpec

    produce_at(conf, "single", [1_000, 9_000, 4_000])
    admin = AdminClient(conf)
    tp = TopicPartition("single", 0)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(), "max": OffsetSpec.max_timestamp(),
             "at": OffsetSpec.for_timestamp(2_000), "after": OffsetSpec.for_timestamp(10_000)}
    answers = {}
    for name, spec in specs.items():
        futures = admin.list_offsets({tp: spec})
        assert list(futures) == [tp]
        info = futures[tp].result()
        assert isinstance(info, ListOffsetsResultInfo)
        answers[name] = (info.offset, info.timestamp)
    assert answers == {"earliest": (0, -1), "latest": (3, -1), "max": (1, 9_000), "at": (1, 9_000),
                       "after": (-1, -1)}
    empty = admin.list_offsets({TopicPartition("orders", 1): OffsetSpec.max_timestamp()})
    assert next(iter(empty.values())).result().offset == -1
    with pytest.raises(KafkaException) as info:
        admin.list_offsets({TopicPartition("nope", 0): OffsetSpec.latest()})[TopicPartition("nope", 0)].result()
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PART


def test_describe_topics_lists_every_partition_with_its_leader(conf: dict[str, str]) -> None:
    admin = AdminClient(conf)
    admin.scale_topic("single", 2).result()
    futures = admin.describe_topics(confluent_kafka.TopicCollection(["orders", "single", "nope"]))
    orders, single = futures["orders"].result(), futures["single"].result()
    assert orders.name == "orders" and not orders.is_internal
    assert [p.id for p in orders.partitions] == [0, 1, 2]
    assert [p.id for p in single.partitions] == [0, 1, 2]  # the sealed epoch's and the new one's
    brokers = admin.list_topics().brokers
    assert brokers and all(p.leader.id in brokers for p in orders.partitions)
    assert all(p.leader.id in [r.id for r in p.replicas] for p in orders.partitions)
    with pytest.raises(KafkaException) as info:
        futures["nope"].result()
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert error_code(admin.describe_topics, ["orders"]) == "_INVALID_ARG"  # confluent-kafka: TypeError


def test_cluster_metadata_names_the_brokers(conf: dict[str, str]) -> None:
    metadata = AdminClient(conf).list_topics()
    assert metadata.brokers
    for broker_id, broker in metadata.brokers.items():
        assert broker.id == broker_id and broker.host
    if conf["store.url"].startswith("sqlite://"):
        assert [(b.id, b.host) for b in metadata.brokers.values()] == [(0, conf["store.url"][len("sqlite://"):])]
    else:
        bootstrap_port = int(conf["store.url"].split("//")[1].split("/")[0].split(",")[0].rsplit(":", 1)[1])
        assert bootstrap_port in [b.port for b in metadata.brokers.values()]
    assert metadata.topics["orders"].partitions[0].leader in metadata.brokers


def test_consumer_group_admin_lists_describes_alters_and_deletes(conf: dict[str, str]) -> None:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions

    produce_keyed(conf, "orders", 30)
    admin = AdminClient(conf)
    # Not polled again until the end: a poll interval the admin calls in between cannot outlast on a slow machine.
    member = Consumer(fast_group(conf, "live", **{"max.poll.interval.ms": 300_000}))
    member.subscribe(["orders"])
    drain(member, 30)
    member.commit(asynchronous=False)
    done = Consumer({**conf, "group.id": "done", "enable.auto.commit": False})
    done.commit(offsets=[TopicPartition("orders", 0, 4), TopicPartition("orders", 2, 1)])
    done.close()

    listed = admin.list_consumer_groups().result()
    states = {g.group_id: g.state for g in listed.valid}
    assert states == {"live": ConsumerGroupState.STABLE, "done": ConsumerGroupState.EMPTY}
    only_empty = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result()
    assert [g.group_id for g in only_empty.valid] == ["done"]

    described = admin.describe_consumer_groups(["live", "done", "never"])
    live = described["live"].result()
    assert live.group_id == "live" and live.state == ConsumerGroupState.STABLE and len(live.members) == 1
    assert sorted((tp.topic, tp.partition) for tp in live.members[0].assignment.topic_partitions) == [
        ("orders", 0), ("orders", 1), ("orders", 2)]
    assert member.memberid() == live.members[0].member_id
    assert described["done"].result().members == [] and described["done"].result().state == ConsumerGroupState.EMPTY
    assert described["never"].result().state == ConsumerGroupState.DEAD

    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("done")])["done"].result()
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions] == [
        ("orders", 0, 4), ("orders", 2, 1)]

    def alter(group: str, *partitions: TopicPartition) -> object:
        request = [ConsumerGroupTopicPartitions(group, list(partitions))]
        return admin.alter_consumer_group_offsets(request)[group].result()

    altered = alter("done", TopicPartition("orders", 0, 1), TopicPartition("orders", 1, 2))
    assert [(tp.partition, tp.offset) for tp in altered.topic_partitions] == [(0, 1), (1, 2)]  # type: ignore[attr-defined]
    resumed = Consumer({**conf, "group.id": "done", "enable.auto.commit": False})
    assert [tp.offset for tp in resumed.committed([TopicPartition("orders", p) for p in range(3)])] == [1, 2, 1]
    resumed.close()
    with pytest.raises(KafkaException) as info:
        alter("live", TopicPartition("orders", 0, 0))
    assert info.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    assert error_code(admin.alter_consumer_group_offsets, [ConsumerGroupTopicPartitions("a", []),
                                                           ConsumerGroupTopicPartitions("b", [])]) == "_INVALID_ARG"

    deleted = admin.delete_consumer_groups(["done", "live", "never"])
    assert deleted["done"].result() is None
    for group, code in (("live", ErrorCode.NON_EMPTY_GROUP), ("never", ErrorCode.GROUP_ID_NOT_FOUND)):
        with pytest.raises(KafkaException) as info:
            deleted[group].result()
        assert info.value.code == code, group
    assert [g.group_id for g in admin.list_consumer_groups().result().valid] == ["live"]
    member.close()


def test_serializing_producer_and_deserializing_consumer_use_confluent_kafkas_serdes(conf: dict[str, str]) -> None:
    from confluent_kafka.serialization import (
        IntegerDeserializer,
        IntegerSerializer,
        StringDeserializer,
        StringSerializer,
    )

    from onceflow.connector.serializing import DeserializingConsumer, SerializingProducer

    seen: list[tuple[str, str]] = []

    def value_serializer(value: object, ctx: confluent_kafka.serialization.SerializationContext) -> bytes:
        seen.append((ctx.topic, ctx.field))
        return StringSerializer()(str(value), ctx)

    producer = SerializingProducer({**conf, "key.serializer": IntegerSerializer(),
                                    "value.serializer": value_serializer})
    reports: list[KafkaError | None] = []
    producer.produce("single", key=7, value=3.5, on_delivery=lambda e, m: reports.append(e))
    producer.produce("single", key=8, value="eight")
    producer.flush()
    assert reports == [None] and seen == [("single", "value")] * 2
    consumer = DeserializingConsumer({**conf, "group.id": "serde", "auto.offset.reset": "earliest",
                                      "key.deserializer": IntegerDeserializer(),
                                      "value.deserializer": StringDeserializer("utf_8")})
    consumer.subscribe(["single"], on_assign=lambda c, ps: None)
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            got.append((message.key(), message.value()))
    assert got == [(7, "3.5"), (8, "eight")]
    with pytest.raises(NotImplementedError):
        consumer.consume(1)
    consumer.close()


def test_serde_failures_are_confluent_kafkas_typed_errors(conf: dict[str, str]) -> None:
    from confluent_kafka.serialization import StringSerializer

    from onceflow.connector.serializing import (
        ConsumeError,
        DeserializingConsumer,
        KeySerializationError,
        SerializationError,
        SerializingProducer,
        ValueDeserializationError,
        ValueSerializationError,
    )

    producer = SerializingProducer({**conf, "key.serializer": StringSerializer(),
                                    "value.serializer": StringSerializer()})
    with pytest.raises(KeySerializationError) as key_error:
        producer.produce("single", key=5, value="v")  # StringSerializer refuses an int
    assert key_error.value.code == KafkaError._KEY_SERIALIZATION and isinstance(key_error.value.exception, Exception)
    with pytest.raises(ValueSerializationError) as value_error:
        producer.produce("single", key="k", value=object())
    assert isinstance(value_error.value, SerializationError) and isinstance(value_error.value, KafkaException)
    producer.produce("single", key="k", value="not a number")
    assert producer.flush() == 0
    assert reader(conf).get_watermark_offsets(TopicPartition("single", 0))[1] == 1  # the failed ones queued nothing

    def as_int(data: bytes | None, ctx: object) -> int:
        return int(data or b"")

    consumer = DeserializingConsumer({**conf, "group.id": "bad", "value.deserializer": as_int,
                                      "enable.partition.eof": True})
    consumer.assign([TopicPartition("single", 0, OFFSET_BEGINNING)])
    with pytest.raises(ValueDeserializationError) as info:
        while consumer.poll(10) is None:
            pass
    assert info.value.code == KafkaError._VALUE_DESERIALIZATION
    assert info.value.kafka_message is not None and info.value.kafka_message.value() == b"not a number"
    with pytest.raises(ConsumeError) as eof:
        while consumer.poll(10) is None:
            pass
    assert eof.value.code == KafkaError._PARTITION_EOF
    consumer.close()
    assert error_code(SerializingProducer, {**conf, "key.serializer": "str"}) == "INVALID_CONFIG"
