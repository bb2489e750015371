"""The batched transaction log (PIP-160) on a real store: thresholds, positions, switching, metrics, and
truncation of entries whose transactions are finished and merged."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import Future

import pytest
from prometheus_client import REGISTRY

from onceflow import txn
from onceflow.connector import failpoints
from onceflow.connector.config import TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Record, Store, open_store, read_range
from onceflow.integration.brokers import free_port
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn import BatchedLogWriter, Position, commit_log, log_codec
from onceflow.txn.commit_log import CommitLog, Outcome


@pytest.fixture
def store(sqlite_url: str) -> Store:
    s = open_store(sqlite_url)
    s.create_stream("log", 1)
    return s


def begin() -> TransactionMetadataEntry:
    return TransactionMetadataEntry(kind=TransactionMetadataEntry.BEGIN, timeout_ms=60_000, timestamp_ms=1)


def flushes(group: str, trigger: str) -> float:
    return REGISTRY.get_sample_value("onceflow_txn_log_flushes_total", {"group": group, "trigger": trigger}) or 0.0


def stored_entries(store: Store) -> list[bytes]:
    return [m.value() or b"" for m in read_range(store, "log", 0)]


def writer(store: Store, group: str, **settings: object) -> BatchedLogWriter:
    config = TransactionConfig(group=group, **settings)  # type: ignore[arg-type]
    return BatchedLogWriter(store.open_writer(), "log", config)


def test_concurrent_callers_share_entries_and_each_gets_its_own_position(store: Store) -> None:
    log = writer(store, "t1", log_batch_max_records=16, log_batch_max_delay_ms=200.0)
    futures: list[Future[Position]] = []
    lock = threading.Lock()

    def submit() -> None:
        for _ in range(8):
            future = log.submit(begin())
            with lock:
                futures.append(future)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    positions = [f.result(timeout=10) for f in futures]
    log.close()
    assert len(set(positions)) == 64
    entries = stored_entries(store)
    assert all(len(log_codec.decode(e, "e")) <= 16 for e in entries)
    assert sum(len(log_codec.decode(e, "e")) for e in entries) == 64
    assert all(p.size == len(log_codec.decode(entries[p.entry], "e")) for p in positions)
    assert flushes("t1", "max_records") >= 1
    view = CommitLog(store, "log")
    view.catch_up()
    assert {t.txn_id for t in view.open_transactions()} == {p.txn_id for p in positions}


def test_an_entry_stored_but_reported_failed_is_retried_as_itself_and_stored_once(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry must be the same append to the writer: written again, a COMMIT's caller got the second copy's
    position, which is not the one that decided, and was told its committed transaction was not its commit."""
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("sqlite.append.after_commit=raise@1"))
    log_writer = writer(store, "retried", log_batching=False)
    position = log_writer.append(begin())
    log_writer.close()
    assert len(stored_entries(store)) == 1 and position.entry == 0


def test_an_entry_perhaps_stored_then_refused_on_retry_is_reported_with_its_outcome_unknown(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt stored the entry and reported a retriable error; the writer was closed before the retry,
    which is refused (_STATE). The caller must not be told "not stored": a COMMIT would be taken for not done."""
    monkeypatch.setattr(failpoints, "_ARMED", failpoints._parse("sqlite.append.after_commit=raise@1"))
    log_writer = writer(store, "refused", log_batching=False)
    sleep = time.sleep

    def closed_during_the_backoff(seconds: float) -> None:
        log_writer._writer.close()  # as close() may, between two attempts
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", closed_during_the_backoff)
    with pytest.raises(KafkaException) as info:
        log_writer.append(begin())
    monkeypatch.setattr(time, "sleep", sleep)
    log_writer.close()
    assert info.value.error.outcome_unknown() and len(stored_entries(store)) == 1


def test_a_lone_record_is_flushed_after_the_max_delay(store: Store) -> None:
    log = writer(store, "t2", log_batch_max_delay_ms=5.0)
    position = log.append(begin())
    assert position == Position(0, 0, 1)
    assert flushes("t2", "max_delay") == 1
    log.close()


def test_the_byte_threshold_flushes_big_records_early(store: Store) -> None:
    log = writer(store, "t3", log_batch_max_bytes=300, log_batch_max_delay_ms=10_000.0)
    big = TransactionMetadataEntry(kind=TransactionMetadataEntry.BEGIN, timeout_ms=1, owner="x" * 200)
    first, second = log.submit(big), log.submit(big)
    assert first.result(timeout=5).size == 1  # long before the 10 s delay: the two would not fit one entry
    assert flushes("t3", "max_bytes") == 1
    log.close()  # closing flushes what waits
    assert second.result(timeout=5).size == 1
    assert flushes("t3", "forced") == 1


def test_batching_switched_off_and_on_while_running_keeps_every_entry_readable(store: Store) -> None:
    log = writer(store, "t4")
    batched = log.append(begin())
    log.set_batching(False)
    unbatched = log.append(begin())
    log.set_batching(True)
    again = log.append(begin())
    log.close()
    entries = stored_entries(store)
    assert entries[batched.entry][:2] == b"\x0e\x01" and entries[again.entry][:2] == b"\x0e\x01"
    assert entries[unbatched.entry][:1] == b"\x08"
    view = CommitLog(store, "log")
    view.catch_up()
    assert {t.txn_id for t in view.open_transactions()} == {batched.txn_id, unbatched.txn_id, again.txn_id}


def test_finished_merged_entries_and_their_staged_records_are_truncated(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    store.create_stream("out", 1)
    group = txn.open_group({"store.url": sqlite_url, "transaction.group": "trunc",
                            "transaction.log.truncate.every.entries": 10, "transaction.log.truncate.delay.ms": 0})

    def commit_one(i: int) -> None:
        t = group.begin(60_000)
        w = group.writer(t, "w")
        w.produce("out", Record(None, str(i).encode()), 0)
        group.commit(t, [w.participant()])  # type: ignore[list-item]

    for i in range(15):
        commit_one(i)
    still_open = group.begin(3_600_000)
    open_writer = group.writer(still_open, "w")  # the same staging partition as every writer "w"
    open_writer.produce("out", Record(None, b"open"), 0)
    open_participant = open_writer.participant()
    assert open_participant is not None
    for i in range(15, 30):
        commit_one(i)
    log_start = store.partition_state(group.log_stream, 0).start_offset
    assert log_start == int(still_open.split(".")[0]) > 0  # everything before the open transaction's BEGIN is gone
    staged_start = store.partition_state(group.staging_stream, open_participant.staging_partition).start_offset
    assert staged_start == open_participant.first_offset > 0  # staged records of merged transactions are gone
    late = group.begin(3_600_000)
    group.commit(still_open, [open_participant])
    for _ in range(12):
        group.commit(group.begin(60_000), [])
    assert store.partition_state(group.log_stream, 0).start_offset > log_start
    assert group.outcome(late) is Outcome.OPEN
    assert store.partition_state(group.staging_stream, open_participant.staging_partition).start_offset > staged_start
    assert sorted(m.value() for m in read_range(store, "out", 0)) == sorted(
        [str(i).encode() for i in range(30)] + [b"open"])
    group.close()


def test_metrics_are_served_when_a_port_is_configured(sqlite_url: str) -> None:
    port = free_port()
    group = txn.open_group({"store.url": sqlite_url, "transaction.group": "metered", "metrics.port": port})
    group.commit(group.begin(60_000), [])
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    group.close()
    assert 'onceflow_txn_log_batch_records_count{group="metered"}' in body
    assert 'onceflow_txn_commit_seconds_count{group="metered"} 1.0' in body


def test_entries_stay_under_message_max_bytes_and_an_oversized_record_fails_only_its_caller(sqlite_url: str) -> None:
    # The log batches up to transaction.log.batch.max.bytes (4 MiB) by default; the store takes 1 MB records.
    group = txn.open_group({"store.url": sqlite_url, "transaction.group": "sizes",
                            "transaction.log.batch.max.delay.ms": 300})
    big = [group.begin_async(60_000, owner="b" * 600_000) for _ in range(2)]  # fit one by one, not together
    too_big = group.begin_async(60_000, owner="x" * 1_500_000)
    small = group.begin_async(60_000, owner="small")
    assert small.result(timeout=30).txn_id
    assert len({f.result(timeout=30).entry for f in big}) == 2  # stored, in two entries
    error = too_big.exception(timeout=30)
    assert isinstance(error, KafkaException) and error.code == ErrorCode.MSG_SIZE_TOO_LARGE
    group.close()


def test_by_default_a_burst_shares_entries_without_holding_any_record_back(store: Store) -> None:
    """Delay 0: each entry is written as soon as the flusher is free, and what was submitted while it wrote goes
    into the next one."""
    assert TransactionConfig().log_batch_max_delay_ms == 0
    log = writer(store, "t9")
    futures = [log.submit(begin()) for _ in range(200)]
    positions = [f.result(timeout=10) for f in futures]
    log.close()
    assert len(set(positions)) == 200
    assert len(stored_entries(store)) < 100  # a stored entry takes far longer than submitting a record


@pytest.mark.parametrize(("delay", "accepted"), [(0.0, True), (-1.0, False)])
def test_the_max_delay_may_be_zero_but_not_negative(delay: float, accepted: bool) -> None:
    if accepted:
        assert TransactionConfig(log_batch_max_delay_ms=delay).log_batch_max_delay_ms == delay
    else:
        with pytest.raises(KafkaException) as raised:
            TransactionConfig(log_batch_max_delay_ms=delay)
        assert raised.value.code == ErrorCode.INVALID_CONFIG
        assert "transaction.log.batch.max.delay.ms" in str(raised.value)


def test_what_the_view_knows_is_answered_while_another_thread_reads_the_log_on(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge asks the view what became of each transaction it publishes while committers read their COMMITs
    back: the answer comes from memory, without waiting for a read in progress (a slow read: a round trip)."""
    log = writer(store, "t10")
    first = log.append(begin())
    view = CommitLog(store, "log")
    view.catch_up()
    second = log.append(begin())
    reading, release = threading.Event(), threading.Event()
    read = store.read

    def slow_read(*args: object, **kwargs: object) -> object:
        reading.set()
        release.wait(30)
        return read(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "read", slow_read)
    reader = threading.Thread(target=view.catch_up_to, args=(second.entry + 1,))
    reader.start()
    assert reading.wait(10)
    answers: list[object] = []
    asker = threading.Thread(target=lambda: answers.extend([view.get(first.txn_id), view.read_to]))
    asker.start()
    asker.join(10)
    answered_during_the_read = not asker.is_alive()
    release.set()
    reader.join(10)
    asker.join(10)
    log.close()
    assert answered_during_the_read
    assert answers[1] == first.entry + 1  # what had been read before
    assert view.read_to == second.entry + 1


def test_a_committer_reading_its_entry_back_keeps_the_entries_read_past_it(store: Store) -> None:
    """Committers of one process wait in turn to read their entries back: the first keeps all that its read gave,
    so those behind it find theirs read (on Kafka each read of its own moved the shared reader back)."""
    view = CommitLog(store, "log")
    view.catch_up()
    log = writer(store, "t11")
    positions = [log.append(begin()) for _ in range(6)]
    log.close()
    reads: list[int] = []
    read = store.read
    store.read = lambda *args, **kwargs: reads.append(args[2]) or read(*args, **kwargs)  # type: ignore[method-assign]
    view.catch_up_to(positions[0].entry + 1)
    view.catch_up_to(positions[-1].entry + 1)
    assert view.read_to == positions[-1].entry + 1
    assert reads == [positions[0].entry]  # one read served both
    assert all(view.get(p.txn_id) is not None for p in positions)


def test_an_entry_stored_while_another_thread_reads_the_log_is_taken_as_read_when_that_read_ends(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log's writer hands each entry it stored to the view; one handed over while another thread reads the log
    (a merge, a truncation) is taken as read as that read ends, so its committer reads nothing back (with 64
    producers of one process on Kafka, committers read their entries back ~6 ms a commit)."""
    view = CommitLog(store, "log")
    view.catch_up()
    log = BatchedLogWriter(store.open_writer(), "log", TransactionConfig(group="t14"), on_stored=view.appended)
    first = log.append(begin())
    reading, release = threading.Event(), threading.Event()
    state_of = store.partition_state

    def held_state(*args: object, **kwargs: object) -> object:
        state = state_of(*args, **kwargs)  # type: ignore[arg-type]
        reading.set()
        release.wait(30)  # the read goes on to the end it found, before the entry stored meanwhile
        return state

    monkeypatch.setattr(store, "partition_state", held_state)
    reader = threading.Thread(target=view.catch_up)
    reader.start()
    assert reading.wait(10)
    second = log.append(begin())
    release.set()
    reader.join(10)
    reads: list[int] = []
    read = store.read
    monkeypatch.setattr(store, "read", lambda *args, **kwargs: reads.append(args[2]) or read(*args, **kwargs))
    view.catch_up_to(second.entry + 1)
    log.close()
    assert reads == []
    assert view.read_to == second.entry + 1
    assert view.get(first.txn_id) is not None and view.get(second.txn_id) is not None


def test_a_view_that_cannot_read_on_keeps_a_bounded_number_of_this_process_s_entries(store: Store) -> None:
    """An entry the view cannot decode (a newer writer's, or damaged) stops its reads; the entries this process
    stores after it are kept to be taken as read only up to a bound, not for as long as the process runs."""
    view = CommitLog(store, "log")
    view.catch_up()
    store.open_writer().append("log", 0, [Record(None, b"\xff\xffnot an entry")])
    log = BatchedLogWriter(store.open_writer(), "log", TransactionConfig(group="t15"), on_stored=view.appended)
    for _ in range(commit_log._KEEP_STORED + 500):
        log.append(begin())
    log.close()
    assert len(view._stored) <= commit_log._KEEP_STORED
    with pytest.raises(KafkaException):
        view.catch_up()


def test_an_entry_that_does_not_decode_past_the_one_read_back_is_left_to_a_later_read(store: Store) -> None:
    """A committer's own entry decides its transaction: another's past it that this version cannot decode (a newer
    writer's, or damaged) does not make that commit's outcome unknown."""
    view = CommitLog(store, "log")
    view.catch_up()
    log = writer(store, "t12")
    mine = log.append(begin())
    log.close()
    store.open_writer().append("log", 0, [Record(None, b"\xff\xffnot an entry")])
    view.catch_up_to(mine.entry + 1)
    assert view.get(mine.txn_id) is not None and view.read_to == mine.entry + 1
    with pytest.raises(KafkaException):
        view.catch_up_to(mine.entry + 2)  # the read that needs it reports it


def test_a_view_remembers_the_latest_merged_transactions_and_forgets_the_oldest(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process answers "what became of it" for the transactions merged last; older ones are forgotten, so its
    memory stays bounded (between one and two times ``_REMEMBER_FINISHED``) however long it runs."""
    monkeypatch.setattr(commit_log, "_REMEMBER_FINISHED", 5)
    view = CommitLog(store, "log")
    log = writer(store, "t12")
    txn_ids = []
    for _ in range(30):
        txn_id = log.append(begin()).txn_id
        log.append(TransactionMetadataEntry(kind=TransactionMetadataEntry.COMMIT, txn_id=txn_id))
        txn_ids.append(txn_id)
        view.catch_up()
        view.forget_merged(view.read_to)
    log.close()
    remembered = [txn_id for txn_id in txn_ids if view.get(txn_id) is not None]
    assert 5 <= len(remembered) <= 10 and remembered == txn_ids[-len(remembered):]
    assert all(getattr(view.get(txn_id), "outcome", None) is Outcome.COMMITTED for txn_id in remembered)
