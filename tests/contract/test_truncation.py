"""Exactly-once over months: the commit log and staging are truncated while many processes commit, and no
transaction is lost, published twice, or reported failed when it committed."""

from __future__ import annotations

import json
import time

import pytest

from onceflow.connector.store import Record, Store, read_range
from onceflow.txn import Outcome, TransactionGroup
from tests.conftest import ABORTS_VISIBLE_ON_TANSU, finish, run_worker, skip_on_tansu, start_worker
from tests.workers.txn_committer import open_truncating_group

pytestmark = pytest.mark.multiprocess

NO_TRUNCATION_ON_TANSU = ("Tansu answers DeleteRecords by closing the connection (integration/PEER.md), so nothing is "
                          "truncated; and it shows the aborted passes of rival merges, which publish them twice: "
                          + ABORTS_VISIBLE_ON_TANSU)


@pytest.fixture
def out(store: Store) -> Store:
    store.create_stream("out", 2)
    return store


def visible(store: Store) -> list[bytes]:
    return sorted(m.value() or b"" for p in store.describe_stream("out").partitions
                  for m in read_range(store, "out", p))


def wait_merged(store: Store, group: str, txn_id: str, view: TransactionGroup) -> None:
    """Poll until ``txn_id`` committed and the merge reached the log's end."""
    log_stream = f"__onceflow.txn.{group}.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        progress = view.merge_progress()
        if view.outcome(txn_id) is Outcome.COMMITTED and progress == store.partition_state(log_stream, 0).end_offset:
            return
        time.sleep(0.02)
    raise AssertionError(f"transaction {txn_id} was not committed and merged within 60 s")


def test_a_stalled_process_never_truncates_a_transaction_another_one_holds_open(
        out: Store, request: pytest.FixtureRequest) -> None:
    skip_on_tansu(out.url, request, NO_TRUNCATION_ON_TANSU)
    other = open_truncating_group(out.url, "g", 1, 0)
    # The stalled process commits one transaction, then stalls between its merge and its truncation ...
    stalled = start_worker("txn_committer", out.url, "g", "a", "1", "1", "0",
                           failpoints="txn.commit.after_merge=sleep:4000")
    wait_merged(out, "g", "0.0", other)
    # ... while another process begins a long transaction and commits and merges others past its BEGIN.
    held = other.begin(3_600_000)
    writer = other.writer(held, "held")
    writer.produce("out", Record(b"held", b"held"))
    participant = writer.participant()
    assert participant is not None
    for _ in range(3):
        other.commit(other.begin(60_000), [])
    stdout, stderr = finish(stalled)
    assert stalled.returncode == 0, stderr
    assert '"committed": 0' in stdout
    assert out.partition_state(other.log_stream, 0).start_offset > 0  # it did truncate
    fresh = open_truncating_group(out.url, "g", 1, 0)  # a process started now reads the log from its start
    assert fresh.outcome(held) is Outcome.OPEN
    fresh.commit(held, [participant])
    assert visible(out) == [b"a:0", b"held"]
    for group in (other, fresh):
        group.close()


def test_many_processes_committing_while_truncating_lose_duplicate_and_misreport_nothing(
        out: Store, request: pytest.FixtureRequest) -> None:
    skip_on_tansu(out.url, request, NO_TRUNCATION_ON_TANSU)
    processes, count = 8, 30
    workers = [start_worker("txn_committer", out.url, "busy", f"w{w}", str(count), "1", "300")
               for w in range(processes)]
    reports = []
    for worker in workers:
        stdout, stderr = finish(worker)
        assert worker.returncode == 0, stderr
        reports += [json.loads(line) for line in stdout.splitlines()]
    assert [r for r in reports if "error" in r] == []
    assert visible(out) == sorted(f"w{w}:{i}".encode() for w in range(processes) for i in range(count))
    assert out.partition_state("__onceflow.txn.busy.log", 0).start_offset > 0
    assert any(out.partition_state("__onceflow.txn.busy.staging", p).start_offset > 0
               for p in out.describe_stream("__onceflow.txn.busy.staging").partitions)


def test_a_commit_whose_log_flush_failed_after_storing_it_says_its_outcome_is_unknown(out: Store) -> None:
    # The second flush of the commit-log writer is the first COMMIT: stored, then its writer fails.
    done = run_worker("txn_committer", out.url, "flaky", "f", "2", "1024", "0",
                      failpoints="txn.log.after_flush=raise@2", timeout=90)
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert reports[0]["error"] and reports[0]["outcome_unknown"] is True, reports
    assert reports[1:] == [{"committed": 1}, {"done": True}]  # the writer survived: later commits work
    group = open_truncating_group(out.url, "flaky", 1024, 0)
    assert group.outcome(reports[0]["txn"]) is Outcome.COMMITTED  # what a caller asks after an unknown outcome
    assert visible(out) == [b"f:0", b"f:1"]
    group.close()


def test_a_retried_flush_stages_each_record_once(sqlite_url: str) -> None:
    from onceflow.connector.store import open_store

    store = open_store(sqlite_url)
    store.create_stream("out", 1)
    # Appends: 1 the BEGIN, 2 the flush's one append of both staged batches: it fails, rolled back.
    done = run_worker("txn_stage_retry", sqlite_url, "retry", failpoints="sqlite.append.before_commit=raise@2")
    assert json.loads(done.stdout)["failed_flushes"] == 1
    assert [(m.value() or b"")[:2] for m in store.read("out", 0, 0, 100)] == [b"0:", b"1:", b"2:"]
    store.close()


def test_a_process_that_begins_but_never_commits_forgets_the_merged_transactions(out: Store) -> None:
    """Its view of the commit log held every transaction of the group: a load run's memory grew with each one."""
    committer = open_truncating_group(out.url, "forget", 1_000_000, 0)  # the log keeps every entry
    for i in range(40):
        txn_id = committer.begin(60_000)
        writer = committer.writer(txn_id, f"w{i}", known_open=True)
        writer.produce("out", Record(b"k", b"%d" % i))
        participant = writer.participant()
        committer.commit(txn_id, [participant] if participant else [])
    beginner = open_truncating_group(out.url, "forget", 1_000_000, 0)  # another process of the group
    left_open = beginner.begin(60_000)  # its upkeep reads the whole log: 40 transactions, all merged
    assert [t.txn_id for t in beginner.open_transactions()] == [left_open]
    assert len(beginner._log._txns) <= 2  # its own, and at most one not yet merged
    assert len(visible(out)) == 40
    committer.close()
    beginner.close()
