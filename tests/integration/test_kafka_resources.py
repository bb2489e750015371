"""What the Kafka backend holds: memory for partitions it read once, clients per operation."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import confluent_kafka as ck
import pytest

from onceflow.connector import Consumer, Producer, TopicPartition
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.connector.store import Record, Writer, kafka, open_store, read_range
from onceflow.connector.store.kafka import reader
from onceflow.connector.store.kafka import store as kafka_store
from onceflow.connector.store.kafka import writer as kafka_writer
from onceflow.integration.brokers import Broker

pytestmark = pytest.mark.kafka


def test_a_partition_read_once_and_left_is_not_fetched_into_memory_forever(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "READ_AHEAD", 100)
    monkeypatch.setattr(reader, "IDLE_S", 0.0)  # "left" counts as not being read from its first read on
    store = open_store(f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    with contextlib.closing(store):
        store.create_stream("left", 1)
        store.create_stream("busy", 1)
        writer = store.open_writer()
        writer.append("left", 0, [Record(None, b"first")])
        writer.append("busy", 0, [Record(None, b"only")])
        assert [m.value() for m in store.read("left", 0, 0, 1)] == [b"first"]
        for round_ in range(10):  # "left" grows while only "busy" is read
            writer.append("left", 0, [Record(None, b"%d-%d" % (round_, i)) for i in range(100)])
            for _ in range(5):
                store.read("busy", 0, 1, 1)
        topic, local, _ = store._topic_of("left", 0)
        held = len(store._reader._buffers[(topic, local)])
        assert held <= 300, f"the reader holds {held} records of a partition nobody reads"
        rest = read_range(store, "left", 0, 1, 1001)  # paused, it still reads on in order
        assert [m.value() for m in rest] == [b"%d-%d" % (r, i) for r in range(10) for i in range(100)]
        writer.close()


def test_truncating_and_creating_topics_reuse_the_stores_admin_client(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin client is a librdkafka instance (threads, connections): truncation runs after merges, often."""
    store = open_store(f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}")
    made: list[object] = []

    class Counted(kafka_store.AdminClient):  # type: ignore[misc]
        def __init__(self, conf: dict[str, object]) -> None:
            made.append(self)
            super().__init__(conf)

    for module in (kafka_store, reader):  # where the store makes them
        monkeypatch.setattr(module, "AdminClient", Counted)
    with contextlib.closing(store):
        store.create_stream("t", 1)
        store.scale_stream("t", 2)
        writer = store.open_writer()
        for i in range(5):
            writer.append("t", 1, [Record(None, b"%d" % i)])
            store.truncate_before("t", 1, i + 1)
        assert store.partition_state("t", 1).start_offset == 5
        writer.close()
    assert made == []


def test_closing_a_writer_closes_the_producers_it_made(kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CAS append takes over its partition with a fenced producer of its own; a writer that left those open
    kept their threads and connections until collected (logging refused connections once the broker was gone)."""
    store = open_store(f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}")
    made: list[Counted] = []

    class Counted(kafka_writer.ck.Producer):  # type: ignore[misc]
        def __init__(self, conf: dict[str, object]) -> None:
            self.closed = False
            made.append(self)
            super().__init__(conf)

        def close(self, *args: object) -> bool:
            self.closed = True
            return bool(super().close(*args))

    monkeypatch.setattr(kafka_writer.ck, "Producer", Counted)
    with contextlib.closing(store):
        store.create_stream("t", 2)
        writer = store.open_writer()
        writer.append("t", 0, [Record(None, b"a")], expected_offset=0)
        writer.append("t", 1, [Record(None, b"b")], expected_offset=0)
        assert len(made) >= 3  # the writer's own and one owner per partition
        writer.close()
        writer.close()  # again: nothing more to do
    assert [p for p in made if not p.closed] == []


def test_a_tail_read_from_below_the_start_reads_on_from_the_start(kafka_broker: Broker) -> None:
    """Another process truncated the partition before this reader's first read of it (commit logs are truncated
    while other processes read them): the read goes on from the new start."""
    url = f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store, contextlib.closing(open_store(url)) as other:
        store.create_stream("t", 1)
        writer = store.open_writer()
        writer.append("t", 0, [Record(None, b"%d" % i) for i in range(5)])
        store.truncate_before("t", 0, 3)
        assert isinstance(other, kafka.KafkaStore)
        topic, local, _ = other._topic_of("t", 0)
        assert [m.value() for m in other._tail.read_range(topic, local, 0, 5)] == [b"3", b"4"]
        writer.close()


def one_unread_and_one_busy(store: kafka.KafkaStore, unread: str, records: int) -> Writer:
    """Two streams: ``unread`` holding ``records`` records, its first one read, and "busy" holding one, whose
    reads leave ``unread`` alone; the writer that wrote them."""
    store.create_stream(unread, 1)
    store.create_stream("busy", 1)
    writer = store.open_writer()
    writer.append(unread, 0, [Record(None, b"%d" % i) for i in range(records)])
    writer.append("busy", 0, [Record(None, b"only")])
    assert [m.value() for m in store.read(unread, 0, 0, 1)] == [b"0"]
    return writer


def test_a_paused_partition_read_again_from_an_earlier_offset_is_fetched(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition the reader paused (it held records nobody read) and then read from another offset (a consumer
    seeking back) is assigned anew: it must be fetched, not left paused (the read waited its whole timeout)."""
    monkeypatch.setattr(reader, "READ_AHEAD", 100)
    monkeypatch.setattr(reader, "IDLE_S", 0.0)
    store = open_store(f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    with contextlib.closing(store):
        writer = one_unread_and_one_busy(store, "left", 1000)
        for _ in range(20):  # "left" is fetched ahead and paused while only "busy" is read
            store.read("busy", 0, 0, 1)
        topic, local, _ = store._topic_of("left", 0)
        assert (topic, local) in store._reader._paused
        monkeypatch.setattr(reader, "TIMEOUT_S", 5.0)
        again = store.read("left", 0, 0, 1)  # not where the reader stopped: a seek
        assert [m.value() for m in again] == [b"0"]
        writer.close()


def test_a_writer_keeps_a_bounded_number_of_fenced_owners_and_cas_stays_sound(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fenced owner is a transactional producer (threads, connections): a writer that CASes into ever new
    partitions for months must not keep one per partition. One it closed takes ownership afresh, and its
    expectations are checked against the partition again."""
    monkeypatch.setattr(kafka_writer, "MAX_OWNERS", 2)
    store = open_store(f"kafka://{kafka_broker.bootstrap}/o{uuid.uuid4().hex[:6]}")
    with contextlib.closing(store):
        store.create_stream("many", 4)
        writer = store.open_writer()
        assert isinstance(writer, kafka_writer.KafkaWriter)
        for round_ in range(2):
            for partition in range(4):
                writer.append("many", partition, [Record(None, b"%d" % round_)], expected_offset=round_ * 2)
                assert len(writer._owners) <= 2
        with pytest.raises(KafkaException) as stale:  # an owner made anew still checks the partition's end
            writer.append("many", 0, [Record(None, b"late")], expected_offset=2)
        assert stale.value.code == ErrorCode.CAS_MISMATCH
        monkeypatch.setattr(kafka_writer, "OWNER_IDLE_S", 0.0)
        writer.append("many", 1, [Record(None, b"2")], expected_offset=4)
        assert list(writer._owners) == [f"{store._topic_of('many', 1)[0]}-1"]  # the idle ones were closed
        assert [m.value() for m in read_range(store, "many", 0, 0, 100)] == [b"0", b"1"]
        writer.close()


def test_a_partition_nobody_reads_any_more_is_unassigned_and_reads_on_when_read_again(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that runs for months reads ever new partitions: one left unread is let go (its fetched records
    dropped, no longer fetched), and a later read of it goes on where it is asked to."""
    monkeypatch.setattr(reader, "FORGET_AFTER_S", 0.0)  # every partition is idle at once
    store = open_store(f"kafka://{kafka_broker.bootstrap}/f{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    with contextlib.closing(store):
        writer = one_unread_and_one_busy(store, "once", 100)
        store.read("busy", 0, 0, 1)
        topic, local, _ = store._topic_of("once", 0)
        assignment = {(tp.topic, tp.partition) for tp in store._reader._consumer.assignment()}
        assert (topic, local) not in assignment
        assert (topic, local) not in store._reader._buffers
        rest = read_range(store, "once", 0, 1, 100)
        assert [m.value() for m in rest] == [b"%d" % i for i in range(1, 100)]
        writer.close()


def test_threads_asking_for_a_groups_offsets_at_once_share_one_client(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store is shared by a process's threads; each client it makes on first use (a group's offsets client, the
    high watermarks' for seals) is one librdkafka instance, made once: a second one, made by a thread that asked
    at the same moment, was left open (its threads and connections) and never closed."""
    made: list[Counted] = []

    class Counted(kafka_store.ck.Consumer):  # type: ignore[misc]
        def __init__(self, conf: dict[str, object]) -> None:
            made.append(self)
            time.sleep(0.05)  # a client takes a moment to make: the window in which another thread asks too
            super().__init__(conf)

    store = open_store(f"kafka://{kafka_broker.bootstrap}/c{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    with contextlib.closing(store):
        store.create_stream("t", 1)
        topic, local, _ = store._topic_of("t", 0)
        monkeypatch.setattr(kafka_store.ck, "Consumer", Counted)
        start = threading.Barrier(4)

        def ask(_: int) -> None:
            start.wait()
            assert store.committed_offsets("g", [("t", 0)]) == {}
            start.wait()
            assert store._high_watermark(topic, local) == 0

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(ask, range(4)))
        assert len(made) == 2  # the group's client and the high watermarks' (offsets_client makes a Consumer)


def test_a_groups_offsets_client_nobody_used_for_long_is_closed_and_made_again_when_needed(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that runs for months commits offsets for groups that come and go (Connect's connectors): each
    group's client (threads, connections) is closed once nobody used it for long, and the offsets stay readable."""
    monkeypatch.setattr(kafka_store, "GROUP_CLIENT_IDLE_S", 0.0)
    store = open_store(f"kafka://{kafka_broker.bootstrap}/g{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    with contextlib.closing(store):
        store.create_stream("t", 1)
        store.commit_offsets("old", {("t", 0): 0})
        store.commit_offsets("new", {("t", 0): 0})  # making the new group's client closes the old one's
        assert list(store._group_clients) == ["new"]
        assert store.committed_offsets("old", [("t", 0)]) == {("t", 0): 0}
        assert list(store._group_clients) == ["old"]


def test_a_partitions_offsets_are_read_without_reading_the_partition_back_for_its_last_sequence(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer's assign, a Spark source's next batch, get_watermark_offsets: each asks a partition's state for
    its offsets. Finding its last application sequence reads the partition back from its end until a record
    carries one (all of it, where none does): only what asks for that sequence pays for it."""
    url = f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as setup:
        setup.create_stream("plain", 1)
        writer = setup.open_writer()
        writer.append("plain", 0, [Record(None, b"%d" % i) for i in range(500)])
        writer.append("plain", 0, [Record(None, b"numbered")], sequence=7)
        writer.append("plain", 0, [Record(None, b"%d" % i) for i in range(500)])
        writer.close()
    store = open_store(url)  # a fresh process's view: nothing scanned yet
    assert isinstance(store, kafka.KafkaStore)
    read: list[int] = []
    read_range_of_reader = store._tail.read_range
    monkeypatch.setattr(store._tail, "read_range", lambda *args: read.append(len(got := read_range_of_reader(*args)))
                        or got)
    with contextlib.closing(store):
        state = store.partition_state("plain", 0)
        assert (state.start_offset, state.end_offset) == (0, 1002)  # 1001 records, the numbered one's commit marker
        assert sum(read) <= 1, f"reading the offsets read {sum(read)} records"  # the last one: the true end
        assert state.last_sequence == 7  # asked for: found, reading back to the numbered record
        assert 500 <= sum(read) <= 1002


def test_a_partition_truncated_under_the_fetch_loses_no_record_fetched_with_it(kafka_broker: Broker) -> None:
    """The consumer returns the records and errors of all the partitions a store reads in one batch. A partition
    cut past its fetch position (staging, truncated after each merge, while the fetch lagged) returns an error;
    the commit-log entries fetched in the same batch must still be read, not dropped with the error (the crash
    matrix's merges then skipped a COMMIT, and a committer found its own transaction undecided)."""
    store = open_store(f"kafka://{kafka_broker.bootstrap}/t{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    with contextlib.closing(store):
        store.create_stream("log", 1)
        store.create_stream("staging", 1)
        writer = store.open_writer()
        writer.append("log", 0, [Record(None, b"0")])
        writer.append("staging", 0, [Record(None, b"s0")])
        assert [m.value() for m in store.read("staging", 0, 0, 10)] == [b"s0"]  # both fetched from now on
        assert [m.value() for m in store.read("log", 0, 0, 10)] == [b"0"]
        staging = ck.TopicPartition(*store._topic_of("staging", 0)[:2])
        consumer = store._reader._consumer
        consumer.pause([staging])  # the fetch of staging lags ...
        writer.append("staging", 0, [Record(None, b"s%d" % i) for i in (1, 2, 3)])
        store.truncate_before("staging", 0, 3)  # ... while another process cuts it past the fetch position
        consumer.resume([staging])
        time.sleep(1.0)  # its fetch fails: the error waits in the consumer's queue
        writer.append("log", 0, [Record(None, b"1"), Record(None, b"2")])
        time.sleep(1.0)  # fetched behind the error
        assert [m.value() for m in read_range(store, "log", 0, 1, 3)] == [b"1", b"2"]
        with pytest.raises(KafkaException) as cut:  # the truncated partition: read again where asked
            store.read("staging", 0, 1, 10)
        assert cut.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert [m.value() for m in store.read("staging", 0, 3, 10)] == [b"s3"]
        writer.close()


def test_closed_clients_the_application_still_holds_keep_no_librdkafka_threads(kafka_broker: Broker) -> None:
    """An application (or a Connect worker, a Spark executor) may keep a closed Producer or Consumer referenced
    for long. Each held ~4 librdkafka clients, with their threads and connections, until it was freed: the
    store's AdminClients (which have no close()) and its catalog's producer, never closed."""
    url = f"kafka://{kafka_broker.bootstrap}/c{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("orders", 1)

    def used_and_closed(n: int) -> list[object]:
        producer = Producer({"store.url": url, "transactional.id": f"closing-{n}"})
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("orders", b"v", partition=0)
        producer.commit_transaction()
        producer.close()
        consumer = Consumer({"store.url": url, "group.id": f"closing-{n}", "auto.offset.reset": "earliest"})
        consumer.subscribe(["orders"])
        consumer.poll(1.0)
        consumer.close()
        return [producer, consumer]

    held = used_and_closed(0)  # the first also opens what a process shares
    gc.collect()
    before = os_threads()
    for n in range(1, 4):
        held += used_and_closed(n)
    gc.collect()  # the cyclic garbage of what was made meanwhile
    assert os_threads() - before < 4, "closed clients still hold threads"  # ~15 per closed Producer before


def os_threads() -> int:
    """The threads of this process, librdkafka's included (Python's threading module does not see those)."""
    return len(os.listdir("/proc/self/task"))


def test_a_commit_asking_a_replaced_reader_for_stable_offsets_is_answered(kafka_broker: Broker) -> None:
    """Deleting a stream replaces the store's readers; a commit in another thread may still be asking the old
    one whether its records are readable. Its AdminClient keeps answering (it is let go only when the store
    closes), instead of failing the commit with a closed client."""
    store = open_store(f"kafka://{kafka_broker.bootstrap}/d{uuid.uuid4().hex[:6]}")
    assert isinstance(store, kafka.KafkaStore)
    store.create_stream("kept", 1)
    store.create_stream("deleted", 1)
    writer = store.open_writer()
    writer.append("kept", 0, [Record(None, b"v")])
    asked_meanwhile = store._tail  # the reader a commit in flight holds
    store.delete_stream("deleted")
    topic, local, _ = store._topic_of("kept", 0)
    asked_meanwhile.await_stable({(topic, local): 1}, "a commit in flight")
    writer.close()
    store.close()


def wide_stream(kafka_broker: Broker) -> tuple[str, set[tuple[str, int]]]:
    """A store URL with a stream of four partitions holding one record each (b"0".."3"), and their topics."""
    url = f"kafka://{kafka_broker.bootstrap}/r{uuid.uuid4().hex[:6]}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("wide", 4)
        writer = store.open_writer()
        for partition in range(4):
            writer.append("wide", partition, [Record(None, b"%d" % partition)])
        writer.close()
        return url, {store._topic_of("wide", p)[:2] for p in range(4)}


def consumed(consumer: Consumer, seconds: float) -> tuple[list[bytes | None], list[ErrorCode]]:
    """The values a Consumer returns within ``seconds`` (until it has four), and the codes its calls raised."""
    values: list[bytes | None] = []
    errors: list[ErrorCode] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(values) < 4:
        try:
            values += [m.value() for m in consumer.consume(10, timeout=0.2)]
        except KafkaException as exc:
            errors.append(exc.code)
    return sorted(values, key=lambda v: v or b""), errors


def test_a_failed_look_while_starting_partitions_costs_no_partition_its_records(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stable offsets of the partitions being started are asked before anything changes: when the ask failed
    (once), every later read of those partitions failed with KeyError until the store was reopened."""
    url, _ = wide_stream(kafka_broker)
    stable_ends, failed = reader.Reader.stable_ends, []

    def failing_once(self: reader.Reader, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        partitions = list(partitions)
        if not failed and len(partitions) > 1:
            failed.append(partitions)
            raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, "injected: no answer", retriable=True))
        return stable_ends(self, partitions)

    monkeypatch.setattr(reader.Reader, "stable_ends", failing_once)
    consumer = Consumer({"store.url": url, "group.id": "wide-reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("wide", p, 0) for p in range(4)])
        assert consumed(consumer, 30) == ([b"0", b"1", b"2", b"3"], [])
        assert failed
    finally:
        consumer.close()


def test_a_partition_that_cannot_be_read_holds_up_no_other(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started together, a partition that fails is left to its own read, which raises: the others are read. Its
    looks fail slowly (0.3 s, over a pass's 0.1 s), as a leader that is down does: a pass that spent its time
    failing to start it read nothing, and said nothing, for as long as the leader was down."""
    url, topics = wide_stream(kafka_broker)
    unreachable = sorted(topics)[-1]
    watermarks, stable_ends = reader.Reader.watermarks, reader.Reader.stable_ends

    def down() -> NoReturn:
        time.sleep(0.3)
        raise KafkaException(KafkaError(ErrorCode._TIMED_OUT, "injected: its leader is down"))

    def watermarks_but_one(self: reader.Reader, topic: str, local: int) -> tuple[int, int]:
        return down() if (topic, local) == unreachable else watermarks(self, topic, local)

    def stable_ends_but_one(self: reader.Reader,
                            partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        partitions = list(partitions)
        return down() if unreachable in partitions else stable_ends(self, partitions)

    monkeypatch.setattr(reader.Reader, "watermarks", watermarks_but_one)
    monkeypatch.setattr(reader.Reader, "stable_ends", stable_ends_but_one)
    consumer = Consumer({"store.url": url, "group.id": "wide-reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("wide", p, 0) for p in range(4)])
        values, errors = consumed(consumer, 5)
        assert len(values) == 3 and set(errors) == {ErrorCode._TIMED_OUT}
    finally:
        consumer.close()


def test_a_consumers_first_read_starts_fetching_every_partition_it_reads(
    kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All are assigned before the first read waits for its fetch: reads that each waited for their partition's
    first fetch in turn made a Consumer of four partitions wait 35-180 ms for its first records (confluent-kafka:
    16-29 ms)."""
    url, topics = wide_stream(kafka_broker)
    assigned_at_first_fetch: list[set[tuple[str, int]]] = []
    pump = reader.Reader._pump

    def noting_pump(self: reader.Reader, reading: tuple[str, int], wait_s: float) -> None:
        if not assigned_at_first_fetch:
            assigned_at_first_fetch.append({(tp.topic, tp.partition) for tp in self._consumer.assignment()})
        pump(self, reading, wait_s)

    monkeypatch.setattr(reader.Reader, "_pump", noting_pump)
    consumer = Consumer({"store.url": url, "group.id": "wide-reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("wide", p, 0) for p in range(4)])
        read = [consumer.poll(30) for _ in range(4)]
        assert sorted(m.value() for m in read if m is not None) == [b"0", b"1", b"2", b"3"]
        assert assigned_at_first_fetch == [topics]
    finally:
        consumer.close()
