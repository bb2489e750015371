"""A group member that lost its partitions while it stalled (a "zombie") cannot publish the transaction it had
open: its successor reads the offsets from before it, and nothing of it becomes visible (KIP-447's generation
check, done here by the member check and the CLAIM of ``TransactionGroup._claim``)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.connector import (
    Consumer,
    ConsumerGroupMetadata,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from onceflow.connector.admin import AdminClient, ConsumerGroupTopicPartitions, NewTopic
from onceflow.integration.brokers import FAST_GROUP_CONFIG
from tests.conftest import finish, next_line, start_worker, wait_paused

pytestmark = pytest.mark.crash

INPUT = 4


@pytest.fixture
def conf(store_url: str) -> dict[str, str]:
    admin = AdminClient({"store.url": store_url})
    for future in admin.create_topics([NewTopic("single", 1), NewTopic("copies", 1)]).values():
        future.result()
    with contextlib.closing(Producer({"store.url": store_url})) as producer:
        for i in range(INPUT):
            producer.produce("single", b"%d" % i, key=b"%d" % i)
        producer.flush()
    return {"store.url": store_url}


@pytest.fixture
def closing() -> Iterator[contextlib.ExitStack]:
    """Clients closed after the test, also when it failed (a producer left open retries a stopped broker)."""
    with contextlib.ExitStack() as stack:
        yield stack


def member(conf: dict[str, str], closing: contextlib.ExitStack, seek_on_assign: bool = False,
           topic: str = "single", max_poll_interval_ms: int = FAST_GROUP_CONFIG["max.poll.interval.ms"]) -> Consumer:
    """A member of "copier" subscribed to ``topic``; ``seek_on_assign``: one that starts each partition it is
    given at offset 0 from its assign callback (as a Connect sink task rewinds), not at the committed offset."""
    consumer = closing.enter_context(contextlib.closing(Consumer({
        **conf, "group.id": "copier", "auto.offset.reset": "earliest", "enable.auto.commit": False,
        **FAST_GROUP_CONFIG, "heartbeat.interval.ms": 50, "max.poll.interval.ms": max_poll_interval_ms})))

    def from_the_start(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for partition in partitions:
            partition.offset = 0

    consumer.subscribe([topic], **({"on_assign": from_the_start} if seek_on_assign else {}))
    return consumer


def drain(consumer: Consumer, count: int, timeout: float = 90) -> list[Message]:
    deadline, out = time.monotonic() + timeout, []
    while len(out) < count and time.monotonic() < deadline:
        out += [m for m in consumer.consume(count, timeout=0.2) if m.error() is None]
    return out


def copies(conf: dict[str, str]) -> list[bytes]:
    """Every committed record of "copies": read until none came for 2 s (on Kafka its end counts transaction
    markers and aborted records, which a position may never reach)."""
    with contextlib.closing(Consumer({**conf, "group.id": "checker", "enable.auto.commit": False})) as reader:
        reader.assign([TopicPartition("copies", 0, 0)])
        out, quiet_since = [], time.monotonic()
        while time.monotonic() - quiet_since < 2:
            got = [m.value() or b"" for m in reader.consume(100, timeout=0.2) if m.error() is None]
            if got:
                out, quiet_since = out + got, time.monotonic()
        return out


def stop(worker: subprocess.Popen[str]) -> None:
    """A worker the test did not finish (it failed first): killed, waited for, its pipes closed."""
    if worker.returncode is None:
        worker.kill()
        finish(worker)


def stalled_worker(store_url: str, closing: contextlib.ExitStack, release: Path) -> subprocess.Popen[str]:
    """A member (tests/workers/stalled_member.py) held right after it claimed its offsets' partitions and passed
    its member check, before its COMMIT, until ``release`` exists; it stops polling meanwhile, so its poll interval
    runs out (its heartbeats go on)."""
    worker = start_worker("stalled_member", store_url, "copier", str(INPUT),
                          failpoints="txn.commit.after_claim=pause", release=release)
    closing.callback(stop, worker)
    assert next_line(worker) == {"committing": True}
    wait_paused(worker, release)
    return worker


def resumed(worker: subprocess.Popen[str], release: Path) -> dict[str, str]:
    """What the held worker's commit ended with, once released."""
    release.touch()
    out, err = finish(worker)
    assert worker.returncode == 0, err
    result: dict[str, str] = json.loads(out.splitlines()[-1])
    return result


@pytest.mark.parametrize(("staged", "metadata_after_stall"), [(False, False), (True, False), (False, True)],
                         ids=["at-once", "staged", "metadata-taken-after-the-stall"])
def test_a_member_that_lost_its_partition_while_it_stalled_cannot_commit_its_transaction(
        conf: dict[str, str], closing: contextlib.ExitStack, staged: bool, metadata_after_stall: bool) -> None:
    """a consumes, copies and sends its offsets with its group metadata, then stalls past max.poll.interval.ms;
    b takes the partition over and reads it from the start. a's commit is then refused (abortable), and nothing
    of it is visible. At once: the embedded store checks the member in the commit's own step; staged (and on
    Kafka always): by the member check after its CLAIM. Metadata taken after the stall, before a polls again,
    names a member that is out of the group (on Kafka: no member id at all) and is refused as well."""
    a = member(conf, closing)
    consumed = drain(a, INPUT)
    producer = closing.enter_context(contextlib.closing(Producer({**conf, "transactional.id": "copier-a"})))
    producer.init_transactions()
    producer.begin_transaction()
    for message in consumed:
        producer.produce("copies", message.value(), key=message.key())
    if staged:
        producer.flush()
    metadata = a.consumer_group_metadata()
    b = member(conf, closing)  # a stalls from here on: it polls no more
    assert [m.offset() for m in drain(b, INPUT)] == list(range(INPUT))
    if metadata_after_stall:
        metadata = a.consumer_group_metadata()
    producer.send_offsets_to_transaction([TopicPartition("single", 0, INPUT)], metadata)
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction()
    assert refused.value.args[0].name() == "UNKNOWN_MEMBER_ID" and refused.value.args[0].txn_requires_abort()
    producer.abort_transaction()
    assert copies(conf) == []


@pytest.mark.parametrize("seek_on_assign", [False, True], ids=["from-committed-offsets", "seeking-on-assign"])
def test_a_member_that_stalls_between_its_claim_and_its_commit_loses_to_the_member_that_took_over(
        conf: dict[str, str], closing: contextlib.ExitStack, store_url: str, seek_on_assign: bool,
        tmp_path: Path) -> None:
    """The member check passed, then the member stalled before its COMMIT (held at the failpoint) and lost the
    partition: its successor aborts the claimed transaction as it gains the partition, before it reads the
    offsets or its assign callback positions it, so the COMMIT that comes after loses, and the successor reads
    every record again with nothing published twice."""
    worker = stalled_worker(store_url, closing, tmp_path / "release")
    b = member(conf, closing, seek_on_assign)
    assert [m.offset() for m in drain(b, INPUT)] == list(range(INPUT))
    refused = resumed(worker, tmp_path / "release")
    # Not refused at its check (it was still a member then): its COMMIT came after the successor's ABORT.
    assert refused.get("error") == "UNKNOWN_MEMBER_ID" and "it was aborted by" in refused["reason"], refused
    assert copies(conf) == [b"warm-up"]


def test_an_admin_that_sets_the_offsets_of_a_group_its_stalled_member_left_aborts_what_that_member_claimed(
        conf: dict[str, str], closing: contextlib.ExitStack, store_url: str, tmp_path: Path) -> None:
    """The member stalls after its check and is removed from the group, which is then empty: an admin's
    alter_consumer_group_offsets aborts its claimed transaction first, so the COMMIT that comes after loses and
    does not set the offsets over the admin's."""
    worker = stalled_worker(store_url, closing, tmp_path / "release")
    admin = AdminClient(conf)
    deadline = time.monotonic() + 25
    while admin.describe_consumer_groups(["copier"])["copier"].result().members and time.monotonic() < deadline:
        time.sleep(0.5)
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("copier", [TopicPartition("single", 0, 2)])]
                                       )["copier"].result()
    refused = resumed(worker, tmp_path / "release")
    assert refused.get("error") == "UNKNOWN_MEMBER_ID" and "it was aborted by" in refused["reason"], refused
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("copier")], require_stable=True)
    assert [tp.offset for tp in listed["copier"].result().topic_partitions] == [2]
    assert copies(conf) == [b"warm-up"]


def _a_member_with_a_transaction_open_and_a_second_member(
        conf: dict[str, str], closing: contextlib.ExitStack
) -> tuple[Consumer, Consumer, Producer, ConsumerGroupMetadata]:
    """a reads both partitions of "pair" (two records each), copies them in a transaction it keeps open, and takes
    its metadata; then b joins. Returns a, b, a's producer and that metadata."""
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("pair", 2)])["pair"].result()
    with contextlib.closing(Producer(conf)) as plain:
        for partition in (0, 1):
            for i in range(2):
                plain.produce("pair", b"%d-%d" % (partition, i), partition=partition)
        plain.flush()
    # a is not polled while its producer starts (seconds on a loaded machine), and must not be taken for stalled.
    a = member(conf, closing, topic="pair", max_poll_interval_ms=60_000)
    read = drain(a, 4)
    producer = closing.enter_context(contextlib.closing(Producer({**conf, "transactional.id": "copier-a"})))
    producer.init_transactions()
    producer.begin_transaction()
    for message in read:
        producer.produce("copies", message.value())
    metadata = a.consumer_group_metadata()
    return a, member(conf, closing, topic="pair"), producer, metadata


def _take_over(a: Consumer, b: Consumer) -> list[Message]:
    """Both poll until the rebalance moved a partition from a to b and b read it from its committed offset (the
    start): b's records."""
    taken_over: list[Message] = []
    deadline = time.monotonic() + 90
    while not taken_over and time.monotonic() < deadline:
        assert [m for m in a.consume(10, timeout=0.1) if m.error() is None] == []
        taken_over = [m for m in b.consume(10, timeout=0.1) if m.error() is None]
    assert [m.offset() for m in taken_over] == [0, 1] and a.assignment(), (taken_over, a.assignment())
    return taken_over


def _refused_and_aborted(conf: dict[str, str], producer: Producer, metadata: ConsumerGroupMetadata,
                         error_name: str) -> KafkaError:
    """a's producer commits the offsets after both partitions' records with ``metadata``: refused with
    ``error_name`` (abort it), and nothing was published."""
    producer.send_offsets_to_transaction([TopicPartition("pair", p, 2) for p in (0, 1)], metadata)
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction()
    error: KafkaError = refused.value.args[0]
    assert error.name() == error_name and error.txn_requires_abort(), error
    producer.abort_transaction()
    assert copies(conf) == []
    return error


def test_a_live_member_whose_partition_moved_to_another_cannot_commit_the_offsets_it_read_before(
        conf: dict[str, str], closing: contextlib.ExitStack) -> None:
    """a reads both partitions of "pair" and keeps a transaction carrying their offsets open (its metadata taken
    then) while b joins: the rebalance moves a partition to b, which reads it from its committed offset, while a
    stays in the group. a's commit is then refused: it no longer owns that partition (Kafka refuses a's metadata
    by its generation). A check of membership alone let it publish the partition's records a second time."""
    a, b, producer, metadata = _a_member_with_a_transaction_open_and_a_second_member(conf, closing)
    _take_over(a, b)
    _refused_and_aborted(conf, producer, metadata, "UNKNOWN_MEMBER_ID")


def test_a_member_that_gave_a_partition_up_and_got_it_back_cannot_commit_the_offsets_it_read_before(
        conf: dict[str, str], closing: contextlib.ExitStack) -> None:
    """As above, then b leaves and the partition comes back to a, under the same member id, before a commits: a
    owns both partitions again, but b read one of them in between. a's metadata predates that, so its commit is
    refused (Kafka: by the generation); membership and ownership checks alone let a publish it a second time."""
    a, b, producer, metadata = _a_member_with_a_transaction_open_and_a_second_member(conf, closing)
    taken_over = _take_over(a, b)
    b.close()  # leaves: its partition goes back to a
    deadline = time.monotonic() + 90
    while len(a.assignment()) < 2:
        assert time.monotonic() < deadline, a.assignment()
        a.consume(10, timeout=0.1)
    error = _refused_and_aborted(conf, producer, metadata, "ILLEGAL_GENERATION")
    assert f"[('pair', {taken_over[0].partition()})]" in error.str(), error.str()
