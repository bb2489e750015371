"""Exactly-once after a quiet spell longer than Kafka's ``offsets.retention.minutes``: Kafka deletes the committed
offsets of a group without members once they are older than that, so nothing that exactly-once depends on may
live there (DESIGN.md, "Long life on a cluster"). The broker here keeps offsets for one minute, not seven days."""

from __future__ import annotations

import collections
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from onceflow import txn
from onceflow.connector.store import Record, Store, open_store, read_range
from onceflow.integration import apache_kafka, brokers
from onceflow.integration.brokers import Broker
from onceflow.txn.sink import ExactlyOnceSink, SinkTask

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

@pytest.fixture(scope="module")
def forgetful_broker() -> Iterator[Broker]:
    """Apache Kafka that expires committed offsets of a group without members after one minute."""
    if not apache_kafka.available():
        pytest.skip("needs Java and Maven (or cached jars) for a local Apache Kafka broker")
    with brokers.apache_kafka_broker(settings=brokers.SHORT_OFFSETS_RETENTION) as broker:
        yield broker


def commit_one(group: txn.TransactionGroup, value: bytes) -> None:
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, f"writer-{value.decode()}", known_open=True)
    writer.produce("out", Record(value, value))
    participant = writer.participant()
    writer.close()
    assert participant is not None
    group.commit(txn_id, [participant])


def wait_until_offsets_expire(store: Store) -> None:
    """Commit a probe group's offset now and poll until the broker expired it: retention has passed since now."""
    store.commit_offsets("retention-probe", {("out", 0): 1})
    deadline = time.monotonic() + 240
    while store.committed_offsets("retention-probe", [("out", 0)]):
        if time.monotonic() > deadline:
            raise AssertionError("the broker did not expire a committed offset within 240 s")
        time.sleep(1)


def published(store: Store) -> collections.Counter[bytes]:
    return collections.Counter(m.value() or b"" for p in store.describe_stream("out").partitions
                               for m in read_range(store, "out", p))


def sink_batch(group: txn.TransactionGroup, store: Store, batch_id: int) -> bool:
    """Batch ``batch_id`` of sink "quiet-sink" (one task, one record): whether its commit published it."""
    task = SinkTask(group, "quiet-sink", batch_id, f"task-{batch_id}-{uuid.uuid4().hex[:6]}", 60_000)
    task.produce("out", Record(None, f"batch-{batch_id}".encode()))
    return ExactlyOnceSink(group, store, "quiet-sink", "out").commit_batch(batch_id, [task.finish()], "query")


class QuietSpell(NamedTuple):
    """What both tests wrote before one quiet spell longer than offset retention (one wait for both)."""

    group_url: str  # a store where group "quiet" committed and merged three transactions, then closed
    sink_store: Store  # a store where a sink committed batch 0 ...
    sink_group: txn.TransactionGroup  # ... through this group, kept open across the spell (a long-lived driver)


@pytest.fixture(scope="module")
def after_a_quiet_spell(forgetful_broker: Broker) -> Iterator[QuietSpell]:
    urls = [f"kafka://{forgetful_broker.bootstrap}/r{uuid.uuid4().hex[:8]}" for _ in range(2)]
    stores = [open_store(url) for url in urls]
    for store in stores:
        store.create_stream("out", 1)
    before = txn.open_group({"store.url": urls[0], "transaction.group": "quiet"})
    for i in range(3):
        commit_one(before, f"before-{i}".encode())
    before.close()
    stores[0].close()
    sink_group = txn.open_group({"store.url": urls[1], "transaction.group": "spark"})
    assert sink_batch(sink_group, stores[1], 0) is True
    wait_until_offsets_expire(stores[1])
    yield QuietSpell(urls[0], stores[1], sink_group)
    sink_group.close()
    stores[1].close()


def test_transactions_merged_before_a_quiet_spell_longer_than_offset_retention_are_not_published_again(
        after_a_quiet_spell: QuietSpell) -> None:
    url = after_a_quiet_spell.group_url
    after = txn.open_group({"store.url": url, "transaction.group": "quiet"})  # a process started after the spell
    commit_one(after, b"after-0")
    after.close()
    with contextlib.closing(open_store(url)) as store:
        assert published(store) == {b"before-0": 1, b"before-1": 1, b"before-2": 1, b"after-0": 1}


def test_a_sink_batch_replayed_after_a_quiet_spell_longer_than_offset_retention_publishes_nothing(
        after_a_quiet_spell: QuietSpell) -> None:
    group, store = after_a_quiet_spell.sink_group, after_a_quiet_spell.sink_store
    assert sink_batch(group, store, 0) is False  # Spark replays the last batch after a restart: it committed already
    assert sink_batch(group, store, 1) is True
    assert published(store) == {b"batch-0": 1, b"batch-1": 1}
