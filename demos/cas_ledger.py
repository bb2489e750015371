"""The main job on the embedded store: CAS appends and fenced writers at work, checked, in real processes.

A ledger is a state machine (an account balance) whose log is one partition. Several processes each
bootstrap the balance by reading the log, then append withdrawals and deposits with ``expected_sequence`` =
the sequence number of the last record they folded (each append numbers its record, the ledger's record count):
a withdrawal is only valid against the balance it was decided on, so without CAS two racers could both spend the
same money. Every refused append makes the loser catch up and decide again. A racer's read may stop short of
the log's end (on Kafka a record a rival just appended may not be fetched yet): the sequence, unlike an end
offset read beside it, then refuses the append whatever the read missed.

The job then checks, from the log alone: one record per offset, in order, every racer's acknowledged
appends are there at the offsets reported, the balance never went negative, and a zombie writer (same
``writer.id``, older epoch) landed nothing after it was fenced.

The job writes only to the two topics it creates: on a store that already has either, it refuses to start
(``onceflow run`` without ``--store`` uses a scratch store of its own).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import random
import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from onceflow.connector.admin import AdminClient
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer
from onceflow.connector.topic import NewTopic, TopicPartition

LEDGER = "ledger"
ZOMBIE_TOPIC = "ledger-audit"


@dataclasses.dataclass
class Racer:
    """One ledger instance: its balance and how many records it was derived from."""

    name: str
    store_url: str
    balance: int = 0
    folded: int = 0  # records folded into the balance: the last one's sequence number is folded - 1

    def catch_up(self, consumer: Consumer) -> None:
        """Fold the records read up to the log's end, as far as this read reaches it (the bootstrap, and each
        retry)."""
        for message in read_to_end(consumer):
            self.balance += json.loads(message.value() or b"{}")["amount"]
            self.folded += 1

    def decide(self, rng: random.Random) -> int:
        """A withdrawal when the balance allows one, else a deposit."""
        if self.balance >= 10 and rng.random() < 0.6:
            return -rng.randint(1, min(self.balance, 50))
        return rng.randint(1, 50)


_start: Any = None  # a racer process's barrier: every racer appends once all are ready
START_WITHIN_S = 120.0


def become_racer(start: Any, job_pid: int) -> None:
    """A racer process's set-up: the start barrier, and an exit as soon as the job's process is gone (the pool's
    own workers outlived a SIGKILLed job, appending for minutes: a pool worker only checks its parent between
    tasks, and a racer's one task is the whole race)."""
    global _start
    _start = start
    threading.Thread(target=_exit_without, args=(job_pid,), name="exit-with-the-job", daemon=True).start()


def _exit_without(job_pid: int) -> None:
    while os.getppid() == job_pid:  # (a process whose parent died is handed to another)
        time.sleep(0.2)
    os._exit(1)


def race(name: str, store_url: str, operations: int, seed: int) -> dict[str, Any]:
    """Run one racer in this process (one of :func:`become_racer`'s) once all are ready."""
    racer = Racer(name, store_url)
    consumer = _reader(store_url)
    consumer.assign([TopicPartition(LEDGER, 0, 0)])
    producer = Producer({"store.url": store_url, "linger.ms": 0})
    rng = random.Random(seed)
    acked: list[tuple[int, int]] = []
    refusals = 0
    outcome: list[tuple[KafkaError | None, Message]] = []
    _start.wait(timeout=START_WITHIN_S)  # (if a racer failed before it got here, the others give up)
    while len(acked) < operations:
        racer.catch_up(consumer)
        amount = racer.decide(rng)
        value = json.dumps({"by": name, "amount": amount}).encode()
        producer.produce(LEDGER, value, partition=0, expected_sequence=racer.folded - 1,
                         on_delivery=lambda err, msg: outcome.append((err, msg)))
        producer.flush()
        err, msg = outcome.pop()
        if err is None:
            acked.append((msg.offset() or 0, amount))
        elif err.code() == ErrorCode.CAS_MISMATCH:
            refusals += 1
        else:
            raise KafkaException(err)
    consumer.close()
    producer.close()
    return {"name": name, "acked": acked, "refusals": refusals}


def zombie_check(store_url: str) -> dict[str, Any]:
    """Two producers with one ``writer.id``: the older one is fenced and lands nothing afterwards."""
    conf = {"store.url": store_url, "writer.id": "ledger-auditor", "linger.ms": 0}
    reports: list[tuple[str, KafkaError | None]] = []
    zombie = Producer(conf)
    zombie.produce(ZOMBIE_TOPIC, b"zombie-before", on_delivery=lambda e, m: reports.append(("before", e)))
    zombie.flush()
    successor = Producer(conf)  # a restarted instance: fences the zombie
    zombie.produce(ZOMBIE_TOPIC, b"zombie-after", on_delivery=lambda e, m: reports.append(("after", e)))
    zombie.flush()
    successor.produce(ZOMBIE_TOPIC, b"successor", on_delivery=lambda e, m: reports.append(("successor", e)))
    successor.flush()
    try:
        zombie.produce(ZOMBIE_TOPIC, b"zombie-again")
        raised = None
    except KafkaException as exc:
        raised = exc.error.name()
    values = [m.value() for m in _read_all(store_url, ZOMBIE_TOPIC)]
    errors = {stage: (e.name() if e else None) for stage, e in reports}
    return {"values": values, "errors": errors, "raised_after_fence": raised}


def _reader(store_url: str) -> Consumer:
    """A consumer that only assign()s and commits nothing (confluent-kafka's API still wants a group.id), and tells
    where it reached a partition's end."""
    return Consumer({"store.url": store_url, "group.id": "onceflow-ledger-reader", "enable.auto.commit": False,
                     "enable.partition.eof": True})


def read_to_end(consumer: Consumer) -> list[Message]:
    """The records of the consumer's one partition from its position to the end it reaches now (its
    _PARTITION_EOF; or a read that found nothing new, as the end was told before)."""
    out: list[Message] = []
    while True:
        got = consumer.consume(10_000, timeout=0.5)
        out += [m for m in got if m.error() is None]
        if not got or any(_at_end(m) for m in got):
            return out


def _at_end(message: Message) -> bool:
    error = message.error()
    return error is not None and error.code() == ErrorCode._PARTITION_EOF


def _read_all(store_url: str, topic: str) -> list[Message]:
    consumer = _reader(store_url)
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = read_to_end(consumer)
    consumer.close()
    return out


def verify(store_url: str, results: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """Checks on the log alone; each is (what, passed, detail)."""
    log = _read_all(store_url, LEDGER)
    offsets = [m.offset() or 0 for m in log]
    by_offset = {m.offset(): json.loads(m.value() or b"{}") for m in log}
    acked = [(r["name"], off, amt) for r in results for off, amt in r["acked"]]
    misplaced = [a for a in acked if by_offset.get(a[1]) != {"by": a[0], "amount": a[2]}]
    balance, lowest = 0, 0
    for m in log:
        balance += by_offset[m.offset()]["amount"]
        lowest = min(lowest, balance)
    return [
        # (dense on the embedded store; on Kafka each CAS append's commit marker takes the offset after it)
        ("one record per offset, in order", offsets == sorted(set(offsets)), f"{len(log)} records"),
        ("every acknowledged append at its offset", not misplaced and len(acked) == len(log),
         f"{len(acked)} acknowledged, {len(misplaced)} missing or moved"),
        ("balance never negative", lowest >= 0, f"final balance {balance}, lowest {lowest}"),
    ]


def create_topics(admin: AdminClient, store_url: str) -> None:
    """Create the job's topics; TOPIC_ALREADY_EXISTS, creating neither, if the store has either (its data is
    someone's: the job never deletes or appends to a topic it did not create)."""
    existing = sorted({LEDGER, ZOMBIE_TOPIC} & set(admin.list_topics().topics))
    if existing:
        fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"store {store_url} already has topic(s) {existing}; the job writes only "
             "to topics it creates: run it without --store (a scratch store) or on a store without them")
    for topic in (LEDGER, ZOMBIE_TOPIC):
        admin.create_topics([NewTopic(topic, 1)])[topic].result()


def run(store_url: str, racers: int = 4, operations: int = 500, console: Console | None = None) -> bool:
    """Run the job; prints a table of checks and returns whether all passed."""
    console = console or Console()
    admin = AdminClient({"store.url": store_url})
    create_topics(admin, store_url)
    console.print(f"[bold]onceflow main job[/] on {store_url}: {racers} processes race CAS appends to one ledger")
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    with ctx.Pool(racers, become_racer, (ctx.Barrier(racers), os.getpid())) as pool, \
            Progress(console=console, transient=True) as progress:
        pending = [pool.apply_async(race, (f"racer-{i}", store_url, operations, i)) for i in range(racers)]
        task = progress.add_task("appending with CAS", total=racers * operations)
        consumer = _reader(store_url)
        consumer.assign([TopicPartition(LEDGER, 0, 0)])
        appended = 0
        while not all(p.ready() for p in pending):
            appended += len([m for m in consumer.consume(10_000, timeout=0.1) if m.error() is None])
            progress.update(task, completed=appended)
        consumer.close()
        results = [p.get() for p in pending]
    elapsed = time.monotonic() - started
    checks = verify(store_url, results)
    zombie = zombie_check(store_url)
    checks += [
        ("zombie writer fenced", zombie["errors"].get("after") == "PRODUCER_FENCED"
         and zombie["raised_after_fence"] == "PRODUCER_FENCED",
         f"delivery report {zombie['errors'].get('after')}, next produce raised {zombie['raised_after_fence']}"),
        ("nothing from the zombie after fencing", zombie["values"] == [b"zombie-before", b"successor"],
         f"log holds {zombie['values']}"),
    ]
    table = Table(title="verified")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for what, passed, detail in checks:
        table.add_row(what, "[green]ok[/]" if passed else "[red]FAILED[/]", escape(detail))
    console.print(table)
    refusals = sum(r["refusals"] for r in results)
    console.print(f"{racers * operations} CAS appends by {racers} processes in {elapsed:.1f}s; "
                  f"{refusals} refused with CAS_MISMATCH and retried after catching up")
    admin.close()
    return all(passed for _, passed, _ in checks)

