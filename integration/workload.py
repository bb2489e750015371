"""The processes of the crash matrix: each role runs a client workload and records every operation.

Run one as ``python -m onceflow.integration.workload ROLE STORE_URL HISTORY_DIR PROCESS INCARNATION OPS``. A role does
OPS operations (or stops early when ``HISTORY_DIR/writers.stop`` appears) and can be killed at any point and
started again with the next incarnation: values are unique per (process, incarnation), so the checker can tell
every write apart. Roles:

- ``appender``: plain appends by a fenced writer (``writer.id`` = the process name; a restart fences the dead
  instance);
- ``cas``: CAS appends racing on one partition, each expecting the end it just read;
- ``bank``: ``THREADS`` threads, each a transactional Producer of its own (``transactional.id`` =
  ``<process>.t<k>``) moving amounts between two streams; every fifth transfer is aborted, every other one is
  staged before its commit (else the embedded store commits it in one step);
- ``multi``: ``THREADS`` threads sharing one ``TransactionGroup`` (as docs/transactions.md says to), each
  committing transactions written by two other processes (its children), naming the participants that reported
  back; every fourth one is aborted;
- ``sink``: the exactly-once sink's protocol without Spark: each batch staged by two task transactions and
  committed by its batch id; a restart replays the batch it had not seen committed, as Spark does;
- ``scaler``: scales the appenders' stream and one of the bank's once, a moment after the start;
- ``open-txn``: leaves two transactions open and never commits them (a Producer's and one staged into the
  ``multi`` group), then waits to be killed or told to stop: what they staged must never become visible;
- ``reader``: a consumer group member reading every stream until ``HISTORY_DIR/readers.stop`` appears, or it is
  told to leave the group (``HISTORY_DIR/leave.<process>``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from onceflow import txn
from onceflow.connector import Consumer, ErrorCode, KafkaError, KafkaException, Message, Producer, TopicPartition
from onceflow.connector.store import Record, open_store, read_range
from onceflow.integration.brokers import FAST_GROUP_CONFIG
from onceflow.integration.history import Recorder
from onceflow.txn.sink import ExactlyOnceSink, SinkTask
from onceflow.txn.staging import StagingWriter

# stream -> partitions; the matrix creates them before any role starts.
STREAMS = {"plain": 2, "cas": 1, "bank-a": 2, "bank-b": 2, "multi": 2, "sink-out": 2}
READ_STREAMS = tuple(STREAMS)
MODULE = "onceflow.integration.workload"  # not __name__: run with -m, that is "__main__"
TXN_TIMEOUT_MS = 10_000
SCALE_AFTER_S = 0.3  # while the appenders write
SCALED = ("plain", "bank-a")
PACE_S = 0.02
THREADS = 2  # per bank and multi process: clients of one process used at once from several threads
# Every transaction group truncates its commit log and staging after each merged entry, while other processes
# commit, stall and die in it; entries are cut 2 s after a round found them finished.
TRUNCATING = {"transaction.log.truncate.every.entries": 1, "transaction.log.truncate.delay.ms": 2_000}


@dataclasses.dataclass(frozen=True)
class Context:
    """What a role knows: where to write, what to call itself, how much to do."""

    store_url: str
    history: Path
    process: str
    incarnation: int
    ops: int

    @property
    def name(self) -> str:
        """This incarnation's name, the prefix of its values."""
        return f"{self.process}.{self.incarnation}"

    def recorder(self, thread: int | None = None) -> Recorder:
        """This incarnation's recorder, or one thread's (its own history file: the checker sees a process)."""
        return Recorder(self.history, self.name if thread is None else f"{self.name}.t{thread}")

    def steps(self) -> Iterator[int]:
        """The operation numbers, from when every process is ready, until OPS or until the writers are told to
        stop; paced, so that the processes' operations interleave."""
        self.wait_for_start()
        for i in range(self.ops):
            if (self.history / "writers.stop").exists():
                return
            yield i
            time.sleep(PACE_S)

    def wait_for_start(self) -> None:
        """Say this process is ready, then wait until the matrix says go (all at once, for real races)."""
        (self.history / f"ready.{self.name}").touch()
        while not (self.history / "go").exists():
            time.sleep(0.01)

    def conf(self, **extra: Any) -> dict[str, Any]:
        return {"store.url": self.store_url, **extra}

    def txn_conf(self, **extra: Any) -> dict[str, Any]:
        """The config of a transactional client: its group truncates after every merged entry."""
        return self.conf(**TRUNCATING, **extra)


def appender(ctx: Context) -> None:
    rec = ctx.recorder()
    with rec.operation("fence", writer=ctx.process, incarnation=ctx.incarnation):
        producer = Producer(ctx.conf(**{"writer.id": ctx.process}))

    def delivered(op: int) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                rec.ok(op, partition=msg.partition(), offset=msg.offset())
            else:
                rec.failed(op, err)
        return report

    try:
        for i in ctx.steps():
            value = f"{ctx.name}.{i}"
            op = rec.invoke("append", stream="plain", value=value, writer=ctx.process, incarnation=ctx.incarnation)
            producer.produce("plain", value, key=str(i % 7), on_delivery=delivered(op))
            if i % 5 == 4:
                producer.flush()
        producer.flush()
    except KafkaException as exc:
        if exc.code != ErrorCode.PRODUCER_FENCED:
            raise  # a newer instance took over: this one stops
    producer.close()


def cas(ctx: Context) -> None:
    rec = ctx.recorder()
    producer = Producer(ctx.conf())
    consumer = Consumer(ctx.conf(**{"group.id": f"{ctx.name}-watermarks"}))
    for i in ctx.steps():
        _low, end = consumer.get_watermark_offsets(TopicPartition("cas", 0))
        value = f"{ctx.name}.{i}"
        with contextlib.suppress(KafkaException), rec.operation(
                "cas", stream="cas", partition=0, expected=end, value=value) as result:
            result["offset"] = _deliver(producer, "cas", value, partition=0, expected_offset=end).offset()
    consumer.close()
    producer.close()


def _deliver(producer: Producer, topic: str, value: str, **produce_args: Any) -> Message:
    """Produce one record and wait for its delivery report; its error raised."""
    reports: list[tuple[KafkaError | None, Message]] = []
    producer.produce(topic, value, on_delivery=lambda err, msg: reports.append((err, msg)), **produce_args)
    producer.flush()
    (err, msg), = reports
    if err is not None:
        raise KafkaException(err)
    return msg


def in_threads(work: Callable[[int], None]) -> None:
    """Run ``work(k)`` in ``THREADS`` threads at once; the first exception of any is raised once all ended."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,), name=f"worker-{k}") for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def bank(ctx: Context) -> None:
    in_threads(lambda k: bank_thread(ctx, k))


def bank_thread(ctx: Context, k: int) -> None:
    rec, name = ctx.recorder(k), f"{ctx.name}.t{k}"
    producer = Producer(ctx.txn_conf(**{"transactional.id": f"{ctx.process}.t{k}",
                                        "transaction.timeout.ms": TXN_TIMEOUT_MS}))
    with rec.operation("fence", writer=f"txn:{ctx.process}.t{k}", incarnation=ctx.incarnation):
        producer.init_transactions()
    for i in ctx.steps():
        amount = 1 + i % 9
        debit, credit = f"{name}.{i}.a", f"{name}.{i}.b"
        writes = [["bank-a", debit, -amount], ["bank-b", credit, amount]]
        abort = i % 5 == 4
        try:
            with rec.operation("txn", txn=f"{name}.{i}", writes=writes) as r:
                producer.begin_transaction()
                producer.produce("bank-a", debit, key=str(i % 3))
                producer.produce("bank-b", credit, key=str(i % 3))
                if i % 2:
                    producer.flush()  # staged; else the embedded store commits it in one step
                if abort:
                    producer.abort_transaction()
                else:
                    producer.commit_transaction()
                r["outcome"] = "aborted" if abort else "committed"
        except KafkaException as exc:
            if not exc.error.fatal():  # abort, as librdkafka's users do (a COMMIT stored first still wins);
                with contextlib.suppress(KafkaException):  # if that fails too, after the next transfer's error
                    producer.abort_transaction()
    producer.close()


def multi(ctx: Context) -> None:
    group = txn.open_group(ctx.txn_conf(**{"transaction.group": "multi"}))
    in_threads(lambda k: multi_thread(ctx, group, k))
    group.close()


def multi_thread(ctx: Context, group: txn.TransactionGroup, k: int) -> None:
    """One thread of ``multi``: its own children and history, the process's group."""
    rec, name = ctx.recorder(k), f"{ctx.name}.t{k}"
    writers: dict[int, subprocess.Popen[str]] = {}
    for i in ctx.steps():
        txn_id = group.begin(TXN_TIMEOUT_MS)
        participants: list[txn.Participant] = []
        for slot in (0, 1):
            participant = _stage_in_child(ctx, name, writers, slot, txn_id)
            if participant is not None:
                participants.append(participant)
        names = [[txn_id, p.writer_id] for p in participants]
        abort = i % 4 == 3
        with contextlib.suppress(KafkaException), rec.operation("txn", txn=txn_id, participants=names) as result:
            if abort:
                group.abort(txn_id)
            else:
                group.commit(txn_id, participants)
            result["outcome"] = "aborted" if abort else "committed"
    for child in writers.values():
        child.kill()


def _stage_in_child(ctx: Context, name: str, writers: dict[int, subprocess.Popen[str]], slot: int,
                    txn_id: str) -> txn.Participant | None:
    """Have writer ``slot`` of ``name`` (a child process, started again if it died) stage into ``txn_id``; its
    participant, or None if it died on the way (the transaction then goes on without it)."""
    child = writers.get(slot)
    if child is None or child.poll() is not None:
        n = sum(1 for _ in ctx.history.glob(f"{name}.w{slot}.*.jsonl"))
        child = writers[slot] = subprocess.Popen(
            [sys.executable, "-m", MODULE, "multi-writer", ctx.store_url, str(ctx.history),
             f"{name}.w{slot}", str(n), "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(txn_id + "\n")
        child.stdin.flush()
    except BrokenPipeError:
        return None
    line = child.stdout.readline()
    return txn.Participant(**json.loads(line)) if line else None


def multi_writer(ctx: Context) -> None:
    """A child of ``multi``: stages three records into each transaction id it reads from stdin."""
    rec = ctx.recorder()
    group = txn.open_group(ctx.txn_conf(**{"transaction.group": "multi"}))
    for n, line in enumerate(sys.stdin):
        txn_id = line.strip()
        writer = _stage(rec, group, txn_id, ctx.name, [["multi", f"{ctx.name}.{n}.{k}"] for k in range(3)])
        participant = writer.participant()
        print(json.dumps(dataclasses.asdict(participant) if participant else None), flush=True)
    group.close()


def _stage(rec: Recorder, group: txn.TransactionGroup, txn_id: str, writer_id: str,
           writes: list[list[str]]) -> StagingWriter:
    """Stage ``writes`` (``[stream, value]`` each) into an open transaction, recorded as a ``stage``."""
    with rec.operation("stage", txn=txn_id, writer=writer_id, writes=writes):
        writer = group.writer(txn_id, writer_id, known_open=True)
        for stream, value in writes:
            writer.produce(stream, Record(value.encode(), value.encode()))
        writer.flush()
    return writer


def sink(ctx: Context) -> None:
    """Batches of the exactly-once sink; the batch to run next is the sink's own record of its last commit
    (``HISTORY_DIR/<process>.batch``), as Spark's commit log: a batch committed but not recorded is replayed."""
    rec = ctx.recorder()
    group = txn.open_group(ctx.txn_conf(**{"transaction.group": f"sink-{ctx.process}"}))
    driver = ExactlyOnceSink(group, group.store, ctx.process, "sink-out")
    done_file = ctx.history / f"{ctx.process}.batch"
    start = int(done_file.read_text()) + 1 if done_file.exists() else 0
    for step in ctx.steps():
        batch = start + step
        writes = [["sink-out", f"{ctx.process}.b{batch}.p{part}.{i}"] for part in (0, 1) for i in range(3)]
        with contextlib.suppress(KafkaException), rec.operation("txn", txn=f"{ctx.process}.b{batch}",
                                                                writes=writes) as result:
            parts = []
            for part in (0, 1):
                task = SinkTask(group, ctx.process, batch, f"{ctx.process}-b{batch}-p{part}-{ctx.incarnation}",
                                TXN_TIMEOUT_MS)
                for _stream, value in writes[part * 3:part * 3 + 3]:
                    task.produce("sink-out", Record(value.encode(), value.encode()))
                parts.append(task.finish())
            driver.commit_batch(batch, parts, "query")
            result["outcome"] = "committed"  # newly, or already by the attempt this one replays
            scratch = done_file.with_suffix(".next")  # replaced whole: a kill never leaves it empty
            scratch.write_text(str(batch))
            os.replace(scratch, done_file)
    group.close()


def open_txn(ctx: Context) -> None:
    """Stage records into a Producer transaction and a group transaction, then hold both open, uncommitted. A
    process that never commits knows its transactions can have no effect, so each is recorded as failed (the
    Producer's) or as staged and never named by a COMMIT (the group's): the checker reports any of it read."""
    rec = ctx.recorder()
    producer = Producer(ctx.txn_conf(**{"transactional.id": ctx.process, "transaction.timeout.ms": TXN_TIMEOUT_MS}))
    with rec.operation("fence", writer=f"txn:{ctx.process}", incarnation=ctx.incarnation):
        producer.init_transactions()
    ctx.wait_for_start()
    writes = [["bank-a", f"{ctx.name}.open.a"], ["bank-b", f"{ctx.name}.open.b"]]
    op = rec.invoke("txn", txn=f"{ctx.name}.open", writes=writes)
    producer.begin_transaction()
    for stream, value in writes:
        producer.produce(stream, value, key="0")
    producer.flush()
    rec.fail(op, "never committed")
    group = txn.open_group(ctx.txn_conf(**{"transaction.group": "multi"}))
    txn_id = group.begin(TXN_TIMEOUT_MS)
    _stage(rec, group, txn_id, ctx.name, [["multi", f"{ctx.name}.open.{k}"] for k in range(3)])
    while not (ctx.history / "writers.stop").exists():
        time.sleep(0.05)
    group.close()
    producer.close()


def scaler(ctx: Context) -> None:
    ctx.wait_for_start()
    time.sleep(SCALE_AFTER_S)
    store = open_store(ctx.store_url)
    for stream in SCALED:  # "bank-a" while transfers into it are open, and staged ones are merged
        if len(store.describe_stream(stream).epochs) == 1:
            store.scale_stream(stream, 3)
    store.close()


def reader(ctx: Context) -> None:
    rec = ctx.recorder()
    consumer = Consumer(ctx.conf(**{"group.id": "readers", "auto.offset.reset": "earliest",
                                    "enable.auto.commit": False, **FAST_GROUP_CONFIG}))
    consumer.subscribe(list(READ_STREAMS))
    ctx.wait_for_start()
    session = ctx.name  # a commit that failed starts a new read session: see below
    try:
        while not (ctx.history / "readers.stop").exists() and not (ctx.history / f"leave.{ctx.process}").exists():
            messages = [m for m in consumer.consume(100, timeout=0.2) if m.error() is None]
            if messages:
                rec.read(session, [[m.topic(), m.partition(), m.offset(), (m.value() or b"").decode()]
                                   for m in messages])
                try:
                    consumer.commit(asynchronous=False)
                except KafkaException:
                    # UNKNOWN_MEMBER_ID after a rebalance, or no coordinator to answer: the group hands these
                    # partitions out again from the last commit, maybe to this member, which then reads them
                    # again (at least once, as Kafka's consumers): a new session, not a reader going backwards.
                    session = f"{ctx.name}+{time.monotonic_ns()}"
    finally:
        consumer.close()  # librdkafka can hang at exit with a consumer left open


def read_everything(store_url: str, history: Path) -> None:
    """The complete reader: every partition of every stream from its start to its end, after all writers."""
    rec = Recorder(history, "final-reader")
    store = open_store(store_url)
    records = [[stream, p, m.offset(), (m.value() or b"").decode()]
               for stream in READ_STREAMS for p in store.describe_stream(stream).partitions
               for m in read_range(store, stream, p)]
    rec.read("final-reader", records, complete=READ_STREAMS)
    store.close()


def settle(store_url: str) -> None:
    """Merge every transaction group of the store, as the next process to open it would: a commit returns once its
    COMMIT is stored even when the merge after it failed (a node was down), and any later merge publishes it. (The
    crash matrix does not settle: its restarted processes must merge by themselves.)"""
    store = open_store(store_url)
    groups = [found.group(1) for name in store.list_streams() if (found := _COMMIT_LOG.fullmatch(name))]
    store.close()
    for name in groups:
        group = txn.open_group({"store.url": store_url, "transaction.group": name})
        group.merge()
        group.close()


_COMMIT_LOG = re.compile(r"__onceflow\.txn\.(.+)\.log")

ROLES: dict[str, Callable[[Context], None]] = {
    "appender": appender, "cas": cas, "bank": bank, "multi": multi, "multi-writer": multi_writer, "sink": sink,
    "open-txn": open_txn, "scaler": scaler, "reader": reader,
}


if __name__ == "__main__":
    role, store_url, history, process, incarnation, ops = sys.argv[1:7]
    ROLES[role](Context(store_url, Path(history), process, int(incarnation), int(ops)))
