"""A transactional producer SIGKILLed at every transaction failpoint, on every backend: after a restart, every
acknowledged transaction is visible exactly once, every other one whole or not at all, in commit order, with its
offsets."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow import txn
from onceflow.connect.app import ConnectWorker
from onceflow.connector import Consumer, TopicPartition, cli
from onceflow.connector.admin import AdminClient, ConsumerGroupTopicPartitions
from onceflow.connector.failpoints import FAILPOINTS
from onceflow.connector.store import Record, Store, open_store, read_range
from onceflow.integration.kafka_connect import ConnectWorker as RestClient
from tests.conftest import ABORTS_VISIBLE_ON_TANSU, run_worker, skip_on_tansu, start_worker

pytestmark = pytest.mark.crash

CLAIM = "txn.commit.after_claim"  # only a group member's transaction passes it: tests/crash/test_member_fencing.py
TXN_FAILPOINTS = [name for name in FAILPOINTS if name.startswith("txn.") and name != CLAIM]
RECORDS = 20  # tests/workers/txn_producer.py


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    for name, partitions in (("out", 2), ("audit", 1), ("src", 1)):
        s.create_stream(name, partitions)
    yield s
    s.close()


def acknowledged(stdout: str) -> set[int]:
    return {json.loads(line)["committed"] for line in stdout.splitlines() if "committed" in line}


def check_exactly_once(store: Store, must: set[int], may: set[int]) -> set[int]:
    """Every transaction in ``must`` visible once, others of ``may`` whole or absent; returns the visible ones."""
    per_txn: dict[int, list[int]] = defaultdict(list)
    for partition in store.describe_stream("out").partitions:
        seen_in_partition: list[int] = []
        for m in read_range(store, "out", partition):
            n, i = map(int, (m.value() or b"").split(b":"))
            per_txn[n].append(i)
            if not seen_in_partition or seen_in_partition[-1] != n:
                seen_in_partition.append(n)
        assert seen_in_partition == sorted(set(seen_in_partition)), "each transaction contiguous, in commit order"
    audit = [int(m.value() or b"") for m in read_range(store, "audit", 0)]
    visible = set(per_txn)
    assert len(audit) == len(set(audit)), "no transaction merged twice"
    assert all(sorted(indexes) == list(range(RECORDS)) for indexes in per_txn.values()), "whole, no duplicates"
    assert sorted(audit) == sorted(visible), "both streams of a transaction, or neither"
    assert must <= visible <= must | may
    offset = store.committed_offsets("copier", [("src", 0)]).get(("src", 0))
    assert offset == (audit[-1] + 1 if audit else None), "offsets move exactly with the data"
    return visible


ONE_STEP = "txn.commit.after_one_step"  # the one-step commit of a transaction that never staged


def test_every_transaction_failpoint_is_covered() -> None:
    assert set(TXN_FAILPOINTS) == {"txn.log.after_flush", "txn.commit.after_commit_record", "txn.merge.before_append",
                                   "txn.merge.after_append", "txn.commit.after_merge", ONE_STEP}


@pytest.mark.parametrize("failpoint", TXN_FAILPOINTS)
def test_kill_at_a_transaction_failpoint_then_restart(store: Store, store_url: str, failpoint: str) -> None:
    # Transaction 3 is the one being committed when the point fires (each transaction passes it once or twice).
    hit = {"txn.log.after_flush": 7}.get(failpoint, 3)  # (log flushes: the fence mark, then two a transaction)
    mode = "one-step" if failpoint == ONE_STEP else "staged"
    crashed = run_worker("txn_producer", store_url, "0", "5", "-", "crash-app", mode,
                         failpoints=f"{failpoint}=crash@{hit}", check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    acked = acknowledged(crashed.stdout)
    assert acked and max(acked) < 4
    run_worker("txn_producer", store_url, "100", "0")  # a restart that only calls init_transactions
    visible = check_exactly_once(store, must=acked, may=set(range(5)))
    # Once its COMMIT is stored, init_transactions rolls the crashed transaction forward: it must be there.
    in_flight = max(acked) + 1
    if failpoint != "txn.log.after_flush":
        assert in_flight in visible
    restarted = run_worker("txn_producer", store_url, "100", "2")
    assert acknowledged(restarted.stdout) == {100, 101}
    check_exactly_once(store, must=acked | {100, 101}, may=set(range(5)))


def crash_with_a_commit_unmerged(store_url: str, group: str = "copier", input_records: int = 0) -> int:
    """Kill the producer with a transaction's COMMIT stored and nothing merged (its offsets for ``group``);
    returns that transaction. ``input_records``: written to "src" first (its offsets then lie within it)."""
    if input_records:
        store = open_store(store_url)
        writer = store.open_writer()
        writer.append("src", 0, [Record(str(n).encode(), None) for n in range(input_records)])
        writer.close()
        store.close()
    crashed = run_worker("txn_producer", store_url, "0", "5", "-", "crash-app", "staged", group,
                         failpoints="txn.commit.after_commit_record=crash@3", check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    return max(acknowledged(crashed.stdout)) + 1


def test_a_group_member_that_takes_over_after_a_crash_reads_the_offsets_of_every_decided_transaction(
        store: Store, store_url: str) -> None:
    # The producer dies with transaction 2's COMMIT stored and nothing merged: it is committed (the next merge
    # publishes it), so whoever takes over reading "src" for group "copier" must start after its offsets, or
    # it processes record 2 again and its output is published twice.
    in_flight = crash_with_a_commit_unmerged(store_url)
    consumer = Consumer({"store.url": store_url, "group.id": "copier", "enable.auto.commit": False})
    taken_over_at = consumer.committed([TopicPartition("src", 0)])[0].offset
    consumer.close()
    run_worker("txn_producer", store_url, "100", "0")  # a restart of the producer merges the COMMIT
    assert in_flight in check_exactly_once(store, must={in_flight}, may=set(range(5)))
    assert taken_over_at == in_flight + 1


def test_a_member_that_joins_after_a_crash_starts_after_the_offsets_of_every_decided_transaction(
        store: Store, store_url: str) -> None:
    # As above, through the group: the partition the member gains starts where the decided transactions left it,
    # and the member's look publishes the one the producer left unmerged.
    in_flight = crash_with_a_commit_unmerged(store_url, input_records=10)
    consumer = Consumer({"store.url": store_url, "group.id": "copier", "enable.auto.commit": False})
    consumer.subscribe(["src"])
    try:
        first = next(m for m in iter(lambda: consumer.poll(1.0), "never") if m is not None and m.error() is None)
    finally:
        consumer.close()
    assert first.offset() == in_flight + 1
    assert in_flight in check_exactly_once(store, must={in_flight}, may=set(range(5)))


def test_an_admin_reads_sets_and_deletes_a_groups_offsets_only_after_every_decided_transaction_set_its_own(
        store: Store, store_url: str) -> None:
    # As above, through the admin client (lag monitoring, a reset): it reads the crashed transaction's offsets
    # (require_stable, as Kafka's), and offsets it sets or a group it deletes are not undone by a crashed
    # transaction's merge coming later.
    in_flight = crash_with_a_commit_unmerged(store_url)
    admin = AdminClient({"store.url": store_url})
    try:
        listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("copier")],
                                                   require_stable=True)["copier"].result()
        assert [(tp.topic, tp.partition, tp.offset) for tp in listed.topic_partitions] == [("src", 0, in_flight + 1)]
        crash_with_a_commit_unmerged(store_url)  # another COMMIT left unmerged
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("copier", [TopicPartition("src", 0, 1)])])[
            "copier"].result()
        assert committed_offset(store_url) == 1
        crash_with_a_commit_unmerged(store_url)
        admin.delete_consumer_groups(["copier"])["copier"].result()
        assert committed_offset(store_url) == -1001
    finally:
        admin.close()


def test_a_reset_that_shifts_a_groups_offsets_shifts_them_from_every_decided_transactions(
        store: Store, store_url: str) -> None:
    # kafka-consumer-groups --reset-offsets --shift-by -1: from the crashed transaction's offsets, not from those
    # before it (then the reset's own roll-forward publishes it, and the group would read its input again).
    in_flight = crash_with_a_commit_unmerged(store_url, input_records=10)
    assert cli.main(["--store", store_url, "groups", "reset-offsets", "copier", "--topic", "src", "--shift-by", "-1",
                     "--execute"]) == 0
    assert committed_offset(store_url) == in_flight


def committed_offset(store_url: str, group: str = "copier") -> int:
    """``group``'s committed offset of ("src", 0) as a consumer reads it (after its roll-forward)."""
    consumer = Consumer({"store.url": store_url, "group.id": group, "enable.auto.commit": False})
    try:
        return int(consumer.committed([TopicPartition("src", 0)])[0].offset)
    finally:
        consumer.close()


def test_a_connect_worker_reads_and_resets_a_sink_connectors_offsets_after_every_decided_transaction_set_its_own(
        store: Store, store_url: str) -> None:
    # The same through Kafka Connect's REST API (KIP-875), for a stopped sink connector whose task died between
    # a COMMIT and its merge.
    in_flight = crash_with_a_commit_unmerged(store_url, "connect-copy")
    with ConnectWorker({"store.url": store_url, "listeners": "http://127.0.0.1:0"}) as worker:
        rest = RestClient(worker.url, Path("."))
        config = {"connector.class": "onceflow.connect.stream.StreamSinkConnector", "topics": "src",
                  "topic.format": "${topic}-copy"}
        assert rest.request("POST", "/connectors", {"name": "copy", "config": config,
                                                    "initial_state": "STOPPED"})[0] == 201
        assert rest.request("GET", "/connectors/copy/offsets") == (200, {"offsets": [
            {"partition": {"kafka_partition": 0, "kafka_topic": "src"}, "offset": {"kafka_offset": in_flight + 1}}]})
        crash_with_a_commit_unmerged(store_url, "connect-copy")
        assert rest.request("DELETE", "/connectors/copy/offsets")[0] == 200
    assert committed_offset(store_url, "connect-copy") == 0


def test_a_transaction_whose_offsets_stream_is_deleted_before_its_merge_is_published_without_them(
        store: Store, store_url: str) -> None:
    # The producer dies with transaction 2's COMMIT stored, nothing merged, and offsets in "src"; then "src" is
    # deleted. Its offsets are dropped and it is published: the merge is not stuck on them (Kafka refuses them).
    in_flight = crash_with_a_commit_unmerged(store_url)
    store.delete_stream("src")
    group = txn.open_group({"store.url": store_url})
    group.merge()
    group.close()
    audit = [int(m.value() or b"") for m in read_range(store, "audit", 0)]
    assert audit == list(range(in_flight + 1))


def test_kill_after_fencing_before_aborting_the_predecessors_transaction(store: Store, store_url: str) -> None:
    run_worker("txn_producer", store_url, "0", "2", "leave-open")  # transaction 2 stays open
    crashed = run_worker("txn_producer", store_url, "10", "1", failpoints="producer.init.after_fence=crash",
                         check=False)
    assert crashed.returncode == -signal.SIGKILL
    run_worker("txn_producer", store_url, "20", "1")
    assert check_exactly_once(store, must={0, 1, 20}, may=set()) == {0, 1, 20}


@pytest.mark.multiprocess
def test_producers_in_several_processes_committing_at_once_merge_each_transaction_once(
        store: Store, store_url: str, request: pytest.FixtureRequest) -> None:
    # Rival merges fence each other's Kafka transactions; only read_committed hiding the aborted ones keeps the
    # merge exactly-once, and Tansu does not hide them.
    skip_on_tansu(store_url, request, ABORTS_VISIBLE_ON_TANSU)
    procs = [start_worker("txn_producer", store_url, str(1000 * w), "15", "-", f"app-{w}") for w in range(4)]
    acked: set[int] = set()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        acked |= acknowledged(out)
    assert len(acked) == 60
    per_txn: dict[int, int] = defaultdict(int)
    for partition in store.describe_stream("out").partitions:
        for m in read_range(store, "out", partition):
            per_txn[int((m.value() or b"").split(b":")[0])] += 1
    assert per_txn == {n: RECORDS for n in acked}
    assert sorted(int(m.value() or b"") for m in read_range(store, "audit", 0)) == sorted(acked)


def test_a_one_step_commit_the_store_reports_failed_after_it_landed_counts_once(store: Store, store_url: str) -> None:
    if store_url.startswith("kafka://"):
        pytest.skip("the embedded store's failpoint; Kafka commits no transaction in one step")
    # Each of these small transactions is one atomic append; the third is stored, then reported as failed.
    done = run_worker("txn_producer", store_url, "0", "5", "-", "crash-app", "one-step",
                      failpoints="sqlite.append.after_commit=raise@3")
    assert acknowledged(done.stdout) == {0, 1, 2, 3, 4}
    check_exactly_once(store, must={0, 1, 2, 3, 4}, may=set())


def test_a_commit_stored_before_its_flush_failed_returns_success_and_publishes_once(store: Store,
                                                                                    store_url: str) -> None:
    # Log flushes: 1 the producer's fence mark (init_transactions), 2 the BEGIN of transaction 0 (staged), 3 its
    # COMMIT: stored, then the flush reports a failure. The producer asks the log: COMMITTED, so
    # commit_transaction() returns, and the application does not redo it.
    done = run_worker("txn_producer", store_url, "0", "2", "-", "unknown-outcome", "staged",
                      failpoints="txn.log.after_flush=raise@3")
    assert acknowledged(done.stdout) == {0, 1}
    assert check_exactly_once(store, must={0, 1}, may=set()) == {0, 1}
