"""Model-based test: random sequences of client operations on the embedded store, checked after every step
against a small in-memory model of what must be visible (hypothesis stateful testing)."""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from onceflow.connector import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from onceflow.connector.store import Store, open_store, read_range

pytestmark = pytest.mark.slow

TXN, CAS = "txn-out", "cas-out"  # one partition each, so the model is one list per stream
_values = itertools.count()


def error_of(call: object, *args: object) -> str | None:
    try:
        call(*args)  # type: ignore[operator]
    except KafkaException as exc:
        return exc.error.name()
    return None


class StoreModel(RuleBasedStateMachine):
    """A transactional producer, a CAS producer and a read_committed consumer against one store."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.url = f"sqlite://{Path(self.dir.name) / 'model.db'}"
        self.store: Store = open_store(self.url)
        for stream in (TXN, CAS):
            self.store.create_stream(stream, 1)
        self.committed: dict[str, list[str]] = {TXN: [], CAS: []}  # the model: what must be visible
        self.pending: list[str] = []  # the open transaction's records
        self.in_transaction = False
        self.producer = self._transactional()
        self.cas_producer = Producer({"store.url": self.url})
        self.consumer = self._consumer(0, 0)
        self.seen: dict[str, list[str]] = {TXN: [], CAS: []}  # what the consumer read

    def _transactional(self) -> Producer:
        producer = Producer({"store.url": self.url, "transactional.id": "app"})
        producer.init_transactions()
        return producer

    def _consumer(self, txn_position: int, cas_position: int) -> Consumer:
        consumer = Consumer({"store.url": self.url, "group.id": "model", "isolation.level": "read_committed"})
        consumer.assign([TopicPartition(TXN, 0, txn_position), TopicPartition(CAS, 0, cas_position)])
        return consumer

    @precondition(lambda self: not self.in_transaction)
    @rule()
    def begin(self) -> None:
        self.producer.begin_transaction()
        self.in_transaction = True

    @precondition(lambda self: self.in_transaction)
    @rule(count=st.integers(1, 5))
    def produce(self, count: int) -> None:
        for _ in range(count):
            value = f"t{next(_values)}"
            self.producer.produce(TXN, value, partition=0)
            self.pending.append(value)

    @precondition(lambda self: self.in_transaction)
    @rule()
    def stage(self) -> None:
        """Flush: the records are staged (the transaction then commits through the log, not in one step)."""
        self.producer.flush()

    @precondition(lambda self: not self.in_transaction)
    @rule()
    def produce_outside_a_transaction(self) -> None:
        assert error_of(self.producer.produce, TXN, "stray") == "INVALID_TXN_STATE"

    @precondition(lambda self: self.in_transaction)
    @rule()
    def commit(self) -> None:
        self.producer.commit_transaction()
        self.committed[TXN] += self.pending
        self._end_transaction()

    @precondition(lambda self: self.in_transaction)
    @rule()
    def abort(self) -> None:
        self.producer.abort_transaction()
        self._end_transaction()

    @precondition(lambda self: not self.in_transaction)
    @rule()
    def commit_without_a_transaction(self) -> None:
        assert error_of(self.producer.commit_transaction) == "INVALID_TXN_STATE"

    @rule()
    def reinit(self) -> None:
        """A new instance with the same transactional.id fences this one and aborts its open transaction."""
        zombie, self.producer = self.producer, self._transactional()
        if not self.in_transaction:
            zombie.begin_transaction()  # local, as in Kafka: the fence shows when the zombie writes or commits
            zombie.produce(TXN, "zombie", partition=0)
        assert error_of(zombie.commit_transaction) == "PRODUCER_FENCED"
        zombie.close()
        self._end_transaction()

    @rule(off_by=st.sampled_from([0, 0, 1, -1]))
    def cas_append(self, off_by: int) -> None:
        """Expecting the end (wins), or an offset behind or past it (refused, writes nothing)."""
        end = len(self.committed[CAS])
        expected = end + off_by if end + off_by >= 0 else end + 1
        correct = expected == end
        value = f"c{next(_values)}"
        reports: list[tuple[KafkaError | None, Message]] = []
        self.cas_producer.produce(CAS, value, partition=0, expected_offset=expected,
                                  on_delivery=lambda err, msg: reports.append((err, msg)))
        self.cas_producer.flush()
        (err, msg), = reports
        if correct:
            assert err is None and msg.offset() == end
            self.committed[CAS].append(value)
        else:
            assert err is not None and err.name() == "CAS_MISMATCH"

    @rule()
    def poll(self) -> None:
        """The consumer sees exactly the committed records after its position, in order.

        It consumes until it has as many as were committed (one consume returns one fetch pass, which may stop
        before the last partition on a slow machine), then checks."""
        deadline = time.monotonic() + 60
        while True:
            for message in self.consumer.consume(1000, timeout=0.2):
                assert message.error() is None
                self.seen[message.topic() or ""].append((message.value() or b"").decode())
            behind = any(len(self.seen[s]) < len(self.committed[s]) for s in (TXN, CAS))
            if not behind or time.monotonic() > deadline:
                break
        for stream in (TXN, CAS):
            assert self.seen[stream] == self.committed[stream][:len(self.seen[stream])]
            assert len(self.seen[stream]) == len(self.committed[stream]), f"{stream}: committed data not read"

    @rule()
    def crash_and_reopen(self) -> None:
        """Abandon every client without closing it, as a crash would, and open new ones on a new store handle:
        the open transaction is aborted by the new producer's init_transactions; the consumer resumes."""
        self.producer = self._transactional()
        self.cas_producer = Producer({"store.url": self.url})
        self.consumer = self._consumer(len(self.seen[TXN]), len(self.seen[CAS]))
        self._end_transaction()

    @invariant()
    def the_store_matches_the_model(self) -> None:
        for stream in (TXN, CAS):
            stored = [(m.value() or b"").decode() for m in read_range(self.store, stream, 0)]
            assert stored == self.committed[stream]

    def _end_transaction(self) -> None:
        self.in_transaction = False
        self.pending = []

    def teardown(self) -> None:
        for client in (self.producer, self.cas_producer, self.consumer):
            client.close()
        self.store.close()
        self.dir.cleanup()


StoreModel.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestStoreModel = StoreModel.TestCase
