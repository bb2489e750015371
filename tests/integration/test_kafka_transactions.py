"""On Kafka, the merge is an exactly-once consume-transform-produce loop: a plain confluent-kafka consumer with
isolation.level=read_committed reading a target topic sees exactly the committed records, in commit order."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from typing import Any

import confluent_kafka as ck
import pytest

from onceflow import txn
from onceflow.connector import Consumer, ErrorCode, KafkaError, KafkaException, Producer, TopicPartition, failpoints
from onceflow.connector.store import Record, TopicSettings, open_store, read_range
from onceflow.connector.store.kafka import catalog, writer
from onceflow.integration.brokers import Broker
from onceflow.txn import batched_writer, offset_writers

pytestmark = pytest.mark.kafka


def read_topic(bootstrap: str, topic: str, want: int, timeout_s: float = 60) -> list[bytes]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex[:6]}",
                            "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message.value())
    # Then a quiet second: nothing more may arrive.
    quiet = time.monotonic() + 1.0
    while time.monotonic() < quiet:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    return got


def test_a_plain_read_committed_kafka_consumer_sees_exactly_the_committed_records(kafka_broker: Broker) -> None:
    namespace = f"raw{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    store = open_store(url)
    store.create_stream("orders", 1)
    producer = Producer({"store.url": url, "transactional.id": "raw-reader-test"})
    producer.init_transactions()
    for n, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        for i in range(5):
            producer.produce("orders", f"{n}:{i}", partition=0)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    store.close()
    got = read_topic(kafka_broker.bootstrap, f"{namespace}.orders", want=10)
    assert got == [f"{n}:{i}".encode() for n in (0, 2) for i in range(5)]


def transactional_producer(kafka_broker: Broker, namespace: str) -> Producer:
    """A transactional producer on its own namespace, whose one-partition stream ``orders`` exists."""
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("orders", 1)
    producer = Producer({"store.url": url, "transactional.id": f"{namespace}-producer"})
    producer.init_transactions()
    return producer


def counted_looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each look at the catalog from now on was for (each a round trip to the broker); a merge's routing
    look takes the one made before it however slow this machine is."""
    monkeypatch.setattr(writer, "ROUTING_LOOK_MAX_AGE_S", 60.0)
    looks: list[str] = []
    through_leader_changes = catalog.through_leader_changes
    monkeypatch.setattr(catalog, "through_leader_changes",
                        lambda ask, doing, **kw: looks.append(doing) or through_leader_changes(ask, doing, **kw))
    return looks


@pytest.mark.parametrize("staged", [False, True], ids=["at-hand", "staged"])
def test_a_record_without_a_key_for_a_compacted_stream_fails_its_transaction_not_the_group(
        kafka_broker: Broker, staged: bool) -> None:
    """Kafka refuses it: committed, the merge would fail on it every time, and nothing of the group would be
    published again (another producer's init_transactions failed with INVALID_RECORD)."""
    url = f"kafka://{kafka_broker.bootstrap}/compacted{uuid.uuid4().hex[:6]}"
    store = open_store(url)
    store.create_stream("latest", 1, TopicSettings(config={"cleanup.policy": "compact"}))
    conf = {"store.url": url, "transactional.id": "keys", **({"batch.num.messages": 1} if staged else {})}
    producer = Producer(conf)
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("latest", "keyed", key="k")
    with pytest.raises(KafkaException) as info:
        producer.produce("latest", "no key")
        producer.commit_transaction()
    assert "INVALID_RECORD" in str(info.value) and info.value.args[0].txn_requires_abort()  # (staged: the commit
    # reports the failed transaction, INVALID_TXN_STATE, naming the staging failure)
    producer.abort_transaction()
    producer.begin_transaction()
    producer.produce("latest", "kept", key="k")
    producer.commit_transaction()
    other = Producer({"store.url": url, "transactional.id": "other"})
    other.init_transactions()
    assert [m.value() for m in read_range(store, "latest", 0)] == [b"kept"]
    producer.close()
    other.close()


def test_a_stream_whose_max_message_bytes_is_below_onceflows_batches_is_refused(kafka_broker: Broker) -> None:
    """Kafka would refuse the batches onceflow writes into it: a committed transaction's merge failed on them
    every time, and nothing of its group was published again."""
    store = open_store(f"kafka://{kafka_broker.bootstrap}/small{uuid.uuid4().hex[:6]}")
    for room in ("2000", "lots"):
        with pytest.raises(KafkaException) as info:
            store.create_stream("small", 1, TopicSettings(config={"max.message.bytes": room}))
        assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "small" not in store.list_streams()
    store.create_stream("small", 1, TopicSettings(config={"max.message.bytes": "1048588"}))  # Kafka's default
    store.close()


def test_a_small_transaction_commits_with_two_looks_at_the_catalog(kafka_broker: Broker,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each look at the catalog is a round trip to the broker. A commit needs two: whether its producer was fenced
    (made at begin_transaction, after the commit log last moved), and whether a scale sealed a partition under the
    records it wrote. The commit routes its records by the first, made a few ms before, instead of a third."""
    producer = transactional_producer(kafka_broker, f"looks{uuid.uuid4().hex[:6]}")

    def commit(n: int) -> None:
        producer.begin_transaction()
        for i in range(10):
            producer.produce("orders", f"{n}:{i}", partition=0)
        producer.commit_transaction()

    commit(0)  # the first one also learns the group's streams
    looks = counted_looks(monkeypatch)
    for n in range(1, 6):
        commit(n)
    producer.close()
    assert looks.count("reading the catalog's end offset") == 2 * 5


def test_the_look_for_fencing_is_made_while_the_application_waits_and_spares_the_commit(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any look at the catalog made after the commit log last moved serves a commit's check for fencing, so one is
    made at begin_transaction, while the application waits for its input (as a consume-transform-produce loop
    does): its commit then makes only the look for seals, a round trip less."""
    namespace = f"ahead{uuid.uuid4().hex[:6]}"
    producer = transactional_producer(kafka_broker, namespace)
    looks = counted_looks(monkeypatch)
    looks_in_commits = 0
    for n in range(6):
        begun, deadline = len(looks), time.monotonic() + 30  # before: the look may be made before this reads it
        producer.begin_transaction()
        while len(looks) == begun:  # the application waits for its input; the look is made meanwhile
            assert time.monotonic() < deadline, "no look at the catalog after the transaction began"
            time.sleep(0.01)
        for i in range(10):
            producer.produce("orders", f"{n}:{i}", partition=0)
        before = len(looks)
        producer.commit_transaction()
        if n > 0:  # the first commit also learns the group's streams
            looks_in_commits += len(looks) - before
    producer.close()
    assert looks_in_commits == 5  # for seals, once its records landed
    got = read_topic(kafka_broker.bootstrap, f"{namespace}.orders", want=60)
    assert got == [f"{n}:{i}".encode() for n in range(6) for i in range(10)]


class HeldLog:
    """A conditional commit (a Spark batch's) of another view of group ``g``, held open: a Kafka transaction on the
    group's commit log, its entry sent, not committed. While it is open, read_committed readers of the log stop
    below it; entries stored after it exist, not readable yet."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.group = txn.open_group({"store.url": url, "transaction.group": "g"})
        self._held, self._release = threading.Event(), threading.Event()
        commit = writer.KafkaWriter._commit

        def held_open(kafka_writer: writer.KafkaWriter, producer: ck.Producer, witness: object,
                      ends: dict[tuple[str, int], int], where: str) -> dict[tuple[str, int], int]:
            if self.group.log_stream in where:
                self._held.set()
                assert self._release.wait(60)
            return commit(kafka_writer, producer, witness, ends, where)  # type: ignore[arg-type]

        monkeypatch.setattr(writer.KafkaWriter, "_commit", held_open)
        self._thread = threading.Thread(target=self._commit, daemon=True)

    def _commit(self) -> None:
        with contextlib.suppress(KafkaException):  # taken over: its transaction aborted, it may retry or give up
            self.group.commit_when([], lambda: True)

    def hold(self) -> None:
        self._thread.start()
        assert self._held.wait(60)

    def release_in(self, seconds: float) -> None:
        threading.Timer(seconds, self._release.set).start()

    def close(self) -> None:
        self._release.set()
        self._thread.join(60)
        self.group.close()


@pytest.mark.parametrize("begun", ["before", "while it is open"])
def test_a_commit_waits_for_a_transaction_open_on_the_log_instead_of_failing(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch, begun: str) -> None:
    """Another process's transaction whose COMMIT (and BEGIN) land above a transaction open on the log waits to
    read them back, and commits, instead of being told it was never begun or already aborted (an application
    would then publish a committed transaction again)."""
    namespace = f"held{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("orders", 1)
    holder = HeldLog(url, monkeypatch)
    other = txn.open_group({"store.url": url, "transaction.group": "g"})
    if begun == "before":
        txn_id = other.begin(60_000)
    holder.hold()
    if begun != "before":
        txn_id = other.begin(60_000)
    staging = other.writer(txn_id, "w", known_open=True)
    staging.produce("orders", Record(None, b"staged"), 0)
    participant = staging.participant()
    assert participant is not None
    holder.release_in(0.5)
    other.commit(txn_id, [participant])
    holder.close()
    assert other.outcome(txn_id) is txn.Outcome.COMMITTED
    assert read_topic(kafka_broker.bootstrap, f"{namespace}.orders", want=1) == [b"staged"]
    staging.close()
    other.close()


def test_a_fence_aborts_a_zombies_transaction_begun_above_a_transaction_open_on_the_log(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new instance of a transactional.id aborts the open transactions of the old one: it waits for their
    BEGINs stored above a transaction open on the log, so the zombie cannot commit after it was fenced."""
    namespace = f"fence{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    store = open_store(url)
    store.create_stream("orders", 1)
    holder = HeldLog(url, monkeypatch)
    zombie = Producer({"store.url": url, "transactional.id": "app", "transaction.group": "g"})
    zombie.init_transactions()
    holder.hold()
    stored = store.stored_end(holder.group.log_stream, 0)
    zombie.begin_transaction()
    zombie.produce("orders", b"zombie", partition=0)
    zombie.flush()  # staged: its BEGIN is written now, above the open transaction
    deadline = time.monotonic() + 30
    while store.stored_end(holder.group.log_stream, 0) == stored:
        assert time.monotonic() < deadline, "the zombie's BEGIN was not stored"
        time.sleep(0.01)
    holder.release_in(1.0)
    successor = Producer({"store.url": url, "transactional.id": "app", "transaction.group": "g"})
    successor.init_transactions()
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction()
    assert fenced.value.code.name == "PRODUCER_FENCED"
    successor.begin_transaction()
    successor.produce("orders", b"successor", partition=0)
    successor.commit_transaction()
    assert read_topic(kafka_broker.bootstrap, f"{namespace}.orders", want=1) == [b"successor"]
    holder.close()
    for producer in (zombie, successor):
        producer.close()
    store.close()


class Zombie:
    """A transactional Producer ("app", group "g") with one record in a transaction, whose commit_transaction runs in
    a thread and waits after its look for fencing until ``go_on`` is set: a successor may take over meanwhile."""

    def __init__(self, url: str, monkeypatch: pytest.MonkeyPatch, go_on: threading.Event) -> None:
        self.settings = {"store.url": url, "transactional.id": "app", "transaction.group": "g"}
        self.producer = Producer(self.settings)
        self.producer.init_transactions()
        self.looked = threading.Event()
        self.errors: list[KafkaException] = []
        self.committed_at: list[float] = []  # monotonic time its commit returned, if it did
        not_fenced = txn.TransactionGroup._not_fenced

        def look_then_wait(group: txn.TransactionGroup, steps: list[Any]) -> list[Any]:
            kept = not_fenced(group, steps)
            if not self.looked.is_set():
                self.looked.set()
                assert go_on.wait(60), "the successor did not take over"
            return kept

        monkeypatch.setattr(txn.TransactionGroup, "_not_fenced", look_then_wait)
        self.producer.begin_transaction()
        self.producer.produce("orders", b"zombie", partition=0)
        self._thread = threading.Thread(target=self._commit)

    def _commit(self) -> None:
        try:
            self.producer.commit_transaction()
            self.committed_at.append(time.monotonic())
        except KafkaException as exc:
            self.errors.append(exc)

    def commit_until_looked(self) -> None:
        self._thread.start()
        assert self.looked.wait(60), "the zombie's commit made no look"

    def join(self) -> None:
        self._thread.join(60)


def test_a_zombie_fenced_between_its_look_and_its_one_step_commit_does_not_commit(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-step commit checks its producer's fencing by a look at the catalog, then appends in a Kafka transaction
    of the log's owner, which no epoch of the producer's fences. A successor that takes over in between writes a
    fence mark in the log: the zombie's append, which expects the log's end it knew, fails its condition, and the
    zombie finds itself fenced (without the mark it committed after its successor's init_transactions)."""
    namespace = f"race{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    store = open_store(url)
    store.create_stream("orders", 1)
    taken_over = threading.Event()
    zombie = Zombie(url, monkeypatch, taken_over)
    zombie.commit_until_looked()
    successor = Producer(zombie.settings)
    successor.init_transactions()
    taken_over.set()
    zombie.join()
    assert [e.code for e in zombie.errors] == [ErrorCode.PRODUCER_FENCED]
    successor.begin_transaction()
    successor.produce("orders", b"successor", partition=0)
    successor.commit_transaction()
    assert read_topic(kafka_broker.bootstrap, f"{namespace}.orders", want=1) == [b"successor"]
    for producer in (zombie.producer, successor):
        producer.close()
    store.close()


def test_a_zombie_whose_one_step_entry_landed_before_the_fence_mark_does_not_commit_after_its_successor(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zombie's one-step entry lands between its successor's read of the log and the successor's fence mark,
    its Kafka transaction still open: the successor's init_transactions waits for that transaction to end (or
    takes it over) before it returns, so the zombie's commit, if it succeeds, comes first (before: after)."""
    url = f"kafka://{kafka_broker.bootstrap}/rv{uuid.uuid4().hex[:6]}"
    store = open_store(url)
    store.create_stream("orders", 1)
    successor_read, zombie_landed, marked = threading.Event(), threading.Event(), threading.Event()
    zombie = Zombie(url, monkeypatch, successor_read)
    submit = batched_writer.BatchedLogWriter.submit

    def held_submit(self: Any, record: Any) -> Any:
        if record.txn_id.startswith("fence.") and zombie.looked.is_set() and not successor_read.is_set():
            successor_read.set()  # the successor's fence read the log (catch_up) already
            assert zombie_landed.wait(60)
            stored = submit(self, record)
            marked.set()
            return stored
        return submit(self, record)

    commit = writer.KafkaWriter._commit

    def held_commit(kw: Any, producer: Any, witness: Any, ends: Any, where: str) -> Any:
        if "__onceflow.txn.g.log" in where and zombie.looked.is_set() and not zombie_landed.is_set():
            zombie_landed.set()  # log entry and records landed, in the open Kafka transaction
            assert marked.wait(60)
            time.sleep(0.5)  # the successor is past its mark meanwhile
        return commit(kw, producer, witness, ends, where)

    monkeypatch.setattr(batched_writer.BatchedLogWriter, "submit", held_submit)
    monkeypatch.setattr(writer.KafkaWriter, "_commit", held_commit)
    zombie.commit_until_looked()
    successor = Producer(zombie.settings)
    successor.init_transactions()
    inited_at = time.monotonic()
    zombie.join()
    assert zombie.errors or zombie.committed_at[0] < inited_at, \
        "the zombie committed after its successor's init_transactions"
    for producer in (zombie.producer, successor):
        producer.close()
    store.close()


def test_a_writer_fenced_while_it_commits_reports_it_and_closes(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer.id's append whose records landed, fenced before its commit: the append fails PRODUCER_FENCED,
    nothing of it is readable, and closing the zombie raises nothing and warns nothing (librdkafka raises its
    fatal error once more from the next flush, and its close() warns that it could not abort: the crash matrix's
    zombie appender died of it in close())."""
    namespace = f"zombie{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    store = open_store(url)
    store.create_stream("plain", 1)
    landed, fenced = threading.Event(), threading.Event()

    def hold(name: str) -> None:
        if name == "kafka.txn.before_commit" and not landed.is_set():
            landed.set()
            assert fenced.wait(60), "the successor did not start"

    monkeypatch.setattr(failpoints, "_ARMED", {"kafka.txn.before_commit": None})
    monkeypatch.setattr(failpoints, "_trigger", hold)
    zombie = Producer({"store.url": url, "writer.id": "app", "linger.ms": 0})
    reports: list[KafkaError | None] = []

    def append() -> None:
        zombie.produce("plain", b"zombie", partition=0, on_delivery=lambda err, _msg: reports.append(err))
        zombie.flush()

    appending = threading.Thread(target=append)
    appending.start()
    assert landed.wait(60), "the zombie's append did not reach its commit"
    successor = Producer({"store.url": url, "writer.id": "app", "linger.ms": 0})  # fences the zombie
    fenced.set()
    appending.join(60)
    assert not appending.is_alive()
    assert [err.code() if err else None for err in reports] == [ErrorCode.PRODUCER_FENCED]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zombie.close()
    successor.produce("plain", b"successor", partition=0)
    successor.close()
    assert read_topic(kafka_broker.bootstrap, f"{namespace}.plain", want=1) == [b"successor"]
    store.close()


def test_a_conditional_commit_left_unfinished_on_the_log_is_taken_over(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that died inside a conditional commit leaves its Kafka transaction open on the log, and only a new
    owner of the log's conditional appends (or Kafka's transaction timeout, a minute) ends it. A caller that must
    read every stored entry (what became of a transaction begun above it) takes over after waiting as long as a
    conditional append takes, and is answered."""
    url = f"kafka://{kafka_broker.bootstrap}/dead{uuid.uuid4().hex[:6]}"
    holder = HeldLog(url, monkeypatch)  # never released while it matters: as if its process had died
    other = txn.open_group({"store.url": url, "transaction.group": "g"})
    holder.hold()
    txn_id = other.begin(60_000)
    assert other.outcome(txn_id) is txn.Outcome.OPEN
    holder.close()
    other.close()


def test_a_consumer_reads_the_offsets_of_a_commit_stored_above_a_transaction_open_on_the_log(
        kafka_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A committer stopped right after its COMMIT was stored above a transaction open on the log, before it read
    it back and merged: a consumer of the group its offsets are for rolls it forward before it reads them (waiting
    for the open transaction, and taking it over), rather than reading the log only as far as it is readable."""
    namespace = f"stable{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_broker.bootstrap}/{namespace}"
    with contextlib.closing(open_store(url)) as store:
        store.create_stream("orders", 1)
        store.create_stream("src", 1)
    holder = HeldLog(url, monkeypatch)
    other = txn.open_group({"store.url": url, "transaction.group": "g"})
    txn_id = other.begin(60_000)
    staging = other.writer(txn_id, "w", known_open=True)
    staging.produce("orders", Record(None, b"staged"), 0)
    participant = staging.participant()
    assert participant is not None
    register = offset_writers.OffsetWriters.add

    def register_then_hold(registry: offset_writers.OffsetWriters, consumer_group: str, txn_group: str) -> None:
        register(registry, consumer_group, txn_group)
        holder.hold()  # after the commit read the log, before it appends its COMMIT

    monkeypatch.setattr(offset_writers.OffsetWriters, "add", register_then_hold)
    stored, resume = threading.Event(), threading.Event()

    def stop_after_the_commit(name: str) -> None:
        if name == "txn.log.after_flush" and not stored.is_set():
            stored.set()
            resume.wait(60)

    monkeypatch.setattr(failpoints, "_ARMED", {"txn.log.after_flush": None})
    monkeypatch.setattr(failpoints, "_trigger", stop_after_the_commit)
    committer = threading.Thread(target=lambda: other.commit(txn_id, [participant], {"copier": {("src", 0): 7}}),
                                 daemon=True)
    committer.start()
    assert stored.wait(60)
    monkeypatch.setattr(offset_writers.OffsetWriters, "add", register)
    consumer = Consumer({"store.url": url, "group.id": "copier"})
    try:
        assert consumer.committed([TopicPartition("src", 0)])[0].offset == 7
    finally:
        consumer.close()
        resume.set()
        committer.join(60)
        holder.close()
        staging.close()
        other.close()
    assert read_topic(kafka_broker.bootstrap, f"{namespace}.orders", want=1) == [b"staged"]
