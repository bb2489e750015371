"""What a process may share between its threads: one TransactionGroup, and the Spark worker's cached groups and
stores (a Python worker runs several tasks at once when Spark reuses it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from onceflow import txn
from onceflow.connector import KafkaException, Producer
from onceflow.connector.store import Record, open_store, read_range
from onceflow.spark_sinks import options, tasks
from tests.conftest import ABORTS_VISIBLE_ON_TANSU, skip_on_tansu

T = TypeVar("T")


def in_threads(count: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` in ``count`` threads started together; their results (a thread's error fails the test)."""
    start = threading.Barrier(count)
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return [results[i] for i in range(count)]


def test_tasks_running_at_once_in_one_spark_worker_share_one_group_and_one_store(sqlite_url: str) -> None:
    opts = options.parse({"store.url": sqlite_url, "topic": "out", "transaction.group": "spark"})
    groups = in_threads(8, lambda i: tasks.group_of(opts))
    stores = in_threads(8, lambda i: tasks.store_of(sqlite_url))
    assert len({id(g) for g in groups}) == 1 and len({id(s) for s in stores}) == 1
    groups[0].close()
    stores[0].close()


def test_threads_sharing_one_group_commit_each_transaction_exactly_once(store_url: str,
                                                                        request: pytest.FixtureRequest) -> None:
    """On Kafka the threads' merges read the progress through the store's one reader: when two reads at once
    took each other's records, a merge found no progress and published the first transactions again."""
    skip_on_tansu(store_url, request, ABORTS_VISIBLE_ON_TANSU)
    store = open_store(store_url)
    store.create_stream("out", 2)
    group = txn.open_group({"store.url": store_url, "transaction.group": "shared",
                            "transaction.log.truncate.every.entries": 1, "transaction.log.truncate.delay.ms": 0})

    def commit_some(thread: int) -> list[str]:
        failures = []
        for i in range(15):
            txn_id = group.begin(60_000)
            writer = group.writer(txn_id, f"t{thread}-{i}")
            writer.produce("out", Record(f"{thread}-{i}".encode(), f"{thread}:{i}".encode()))
            try:
                group.commit(txn_id, [writer.participant()])  # type: ignore[list-item]
            except KafkaException as exc:
                failures.append(str(exc))
        return failures

    assert in_threads(6, commit_some) == [[]] * 6
    values = sorted(m.value() or b"" for p in (0, 1) for m in read_range(store, "out", p))
    assert values == sorted(f"{t}:{i}".encode() for t in range(6) for i in range(15))
    group.close()
    store.close()


def test_threads_sharing_one_store_create_and_see_every_stream(store_url: str) -> None:
    """On Kafka every thread's refresh of the store's catalog drained the one catalog consumer: records applied
    out of catalog order were dropped (each is based on the one before), so streams went missing."""
    store = open_store(store_url)

    def create_and_list(thread: int) -> list[str]:
        for i in range(4):
            store.create_stream(f"s{thread}-{i}", 1)
            store.list_streams()
        return store.list_streams()

    listed = in_threads(6, create_and_list)
    for thread, names in enumerate(listed):  # after its own creations, a thread sees each of them
        assert {f"s{thread}-{i}" for i in range(4)} <= set(names)
    assert {f"s{t}-{i}" for t in range(6) for i in range(4)} <= set(store.list_streams())
    store.close()


def test_threads_sharing_one_producer_write_each_record_once(store_url: str) -> None:
    """A confluent-kafka Producer is shared by threads (one polls, others produce). Threads inside the embedded
    store's grouped write at once deadlocked on each other's open SQLite transaction."""
    admin_store = open_store(store_url)
    admin_store.create_stream("t", 4)
    producer = Producer({"store.url": store_url, "linger.ms": 1})
    acked: list[bytes] = []
    stop = threading.Event()

    def poll_until_stopped() -> None:
        while not stop.is_set():
            producer.poll(0.05)

    poller = threading.Thread(target=poll_until_stopped)
    poller.start()

    def produce_some(thread: int) -> None:
        for i in range(300):
            producer.produce("t", f"{thread}.{i}".encode(), key=str(i).encode(),
                             on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)

    in_threads(6, produce_some)
    stop.set()
    poller.join(timeout=60)
    assert producer.flush(60) == 0
    expected = sorted(f"{t}.{i}".encode() for t in range(6) for i in range(300))
    assert sorted(acked) == expected
    assert sorted(m.value() or b"" for p in range(4) for m in read_range(admin_store, "t", p)) == expected
    producer.close()
    admin_store.close()
