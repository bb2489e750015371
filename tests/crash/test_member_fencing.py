"""A group member that lost its partitions while it stalled (a "zombie") cannot publish the transaction it had
open: its successor reads the offsets from before it, and nothing of it becomes visible (KIP-447's generation
check, done here by the member check and the CLAIM of ``TransactionGroup._claim``)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator

import pytest

from onceflow.connector import Consumer, KafkaException, Message, Producer, TopicPartition
from onceflow.connector.admin import AdminClient, NewTopic
from onceflow.integration.brokers import FAST_GROUP_CONFIG
from tests.conftest import finish, next_line, start_worker

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


def member(conf: dict[str, str], closing: contextlib.ExitStack) -> Consumer:
    consumer = closing.enter_context(contextlib.closing(Consumer({
        **conf, "group.id": "copier", "auto.offset.reset": "earliest", "enable.auto.commit": False,
        **FAST_GROUP_CONFIG, "heartbeat.interval.ms": 50})))
    consumer.subscribe(["single"])
    return consumer


def drain(consumer: Consumer, count: int, timeout: float = 90) -> list[Message]:
    deadline, out = time.monotonic() + timeout, []
    while len(out) < count and time.monotonic() < deadline:
        out += [m for m in consumer.consume(count, timeout=0.2) if m.error() is None]
    return out


def copies(conf: dict[str, str]) -> list[bytes]:
    with contextlib.closing(Consumer({**conf, "group.id": "checker", "enable.auto.commit": False})) as reader:
        reader.assign([TopicPartition("copies", 0, 0)])
        _, end = reader.get_watermark_offsets(TopicPartition("copies", 0))
        return [m.value() or b"" for m in drain(reader, end, timeout=30)]


def stop(worker: subprocess.Popen[str]) -> None:
    """A worker the test did not finish (it failed first): killed, waited for, its pipes closed."""
    if worker.returncode is None:
        worker.kill()
        finish(worker)


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


def test_a_member_that_stalls_between_its_claim_and_its_commit_loses_to_the_member_that_took_over(
        conf: dict[str, str], closing: contextlib.ExitStack, store_url: str) -> None:
    """The member check passed, then the member stalled before its COMMIT (the failpoint sleeps) and lost the
    partition: its successor aborts the claimed transaction before it reads the offsets, so the COMMIT that
    comes after loses, and the successor reads every record after the member's first transaction again, with
    nothing published twice."""
    worker = start_worker("stalled_member", store_url, "copier", str(INPUT),
                          failpoints="txn.commit.after_claim=sleep:20000@2")  # (its second transaction's)
    closing.callback(stop, worker)
    assert next_line(worker) == {"committing": True}
    time.sleep(2)  # its CLAIM and member check take milliseconds; then it sleeps in the failpoint
    b = member(conf, closing)
    assert [m.offset() for m in drain(b, INPUT - 1)] == list(range(1, INPUT))
    out, err = finish(worker)
    assert worker.returncode == 0, err
    # (not refused at its check: it was still a member then; its COMMIT came after the successor's ABORT)
    assert out.splitlines()[-1] == '{"error": "UNKNOWN_MEMBER_ID"}', out
    assert copies(conf) == [b"0"]
