"""Records a Producer queues per partition before it sends them: its per-record hot path.

``Accumulator.add`` is what ``Producer.produce`` does for the usual record (bytes or None key and value, no headers,
a partition chosen by the partitioner or one the producer knows, no CAS; in a transaction, once the Producer lets
records in), and :func:`fast_produce` makes ``produce`` call it first. Everything else, and every error, is the
Producer's full path: ``add`` changes nothing and returns ``NOT_QUEUED``, and ``produce`` runs as written. It runs
once per record, so ``_accumulator.c`` does both where pip built it: a Python ``produce`` cost 1.5 us a record, the
compiled one ~0.5. This module stays the reference the tests compare the compiled one with, and the fallback where
there is no C compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from onceflow.connector.errors import KafkaError
from onceflow.connector.message import Message
from onceflow.connector.partitioner import partition_for_key
from onceflow.connector.store import PartitionKey, RecordFields

try:  # built by pip where a C compiler is (see _accumulator.c); else the classes below do it all
    from onceflow.connector import _accumulator as _compiled
except ImportError:
    _compiled = None

DeliveryCallback = Callable[[KafkaError | None, Message], Any]

# What add and enqueue return. FULL and DUE: the record is queued, and batches should be sent now (every batch when
# one is full: on the embedded store, in one write; the due ones when linger.ms has passed for one).
NOT_QUEUED, QUEUED, FULL, DUE = 0, 1, 2, 3


@dataclasses.dataclass(slots=True)
class Batch:
    """Records queued for one partition. A record waits as a plain tuple of its fields (:data:`RecordFields`), and
    goes to the store as it is (stores read records by position): the collector tracks named tuples, and one made
    per record cost an embedded store a fifth of its speed. Only the exceptions cost a step per record: a delivery
    callback (by the record's index) and a partition the producer did not choose (``pinned``: a scaled stream's
    records are re-routed, except these)."""

    deadline: float
    fields: list[RecordFields] = dataclasses.field(default_factory=list)
    callbacks: dict[int, DeliveryCallback] = dataclasses.field(default_factory=dict)
    pinned: set[int] = dataclasses.field(default_factory=set)
    size: int = 0

    def __len__(self) -> int:
        return len(self.fields)


def batch_of_one(fields: RecordFields, callback: DeliveryCallback | None, routed: bool) -> Batch:
    """A batch of one record, sent alone (a CAS append, a record failed alone)."""
    return Batch(0.0, [fields], {} if callback is None else {0: callback}, set() if routed else {0})


class Accumulator:
    """A Producer's queued batches and what routing them needs: the partitions of each topic's open epoch
    (``current``), every partition id of each topic (``partitions``) and the partition its unkeyed records stick to
    (``sticky``), as the Producer last described them. A ``transactional`` Producer's records wait for their
    transaction: none lingers, and the limits apply to all its queued records together (what a transaction holds
    in memory); the Producer then takes them all (:meth:`take`) and stages them. ``add`` takes the Producer's lock
    (given here); the caller of the other methods holds it."""

    __slots__ = (
        "_batch_bytes",
        "_batch_records",
        "_linger_s",
        "_lock",
        "_max_bytes",
        "_max_queued",
        "accepting",
        "batches",
        "current",
        "default_callback",
        "in_flight",
        "next_due",
        "partitions",
        "queued",
        "queued_bytes",
        "sticky",
        "transactional",
    )

    def __init__(self, lock: AbstractContextManager[Any], linger_s: float, batch_records: int, batch_bytes: int,
                 max_queued: int, max_bytes: int, default_callback: DeliveryCallback | None,
                 transactional: bool) -> None:
        self.batches: dict[PartitionKey, Batch] = {}
        self.current: dict[str, tuple[int, ...]] = {}
        self.partitions: dict[str, frozenset[int]] = {}
        self.sticky: dict[str, int] = {}
        # Produced records whose delivery report was not served yet (of a transaction's, those with a callback: the
        # others are the transaction's to hold, and its commit or abort to end)
        self.in_flight = 0
        self.next_due = float("inf")  # when the first batch's linger.ms is up
        self.accepting = True  # False: every record takes the Producer's full path (transactional, or failed)
        self.default_callback = default_callback
        self.transactional = transactional
        self.queued = self.queued_bytes = 0  # in all batches: counted for a transaction's records only
        self._lock = lock
        self._linger_s = linger_s
        self._batch_records = batch_records
        self._batch_bytes = batch_bytes
        self._max_queued = max_queued
        self._max_bytes = max_bytes

    def add(self, topic: str, value: object, key: object, partition: object, callback: DeliveryCallback | None,
            timestamp: object) -> int:
        """Queue a usual record (see the module); NOT_QUEUED if it is not one, having changed nothing."""
        with self._lock:
            return self._add(topic, value, key, partition, callback, timestamp)

    def _add(self, topic: str, value: object, key: object, partition: object, callback: DeliveryCallback | None,
             timestamp: object) -> int:
        if not self.accepting or self.in_flight >= self._max_queued:
            return NOT_QUEUED
        if not (value is None or value.__class__ is bytes) or not (key is None or key.__class__ is bytes):
            return NOT_QUEUED
        if not (timestamp.__class__ is int and (partition is None or partition.__class__ is int)):
            return NOT_QUEUED
        size = (0 if key is None else len(key)) + (0 if value is None else len(value))
        if size > self._max_bytes:
            return NOT_QUEUED
        routed = partition is None or partition == -1
        target = self.route(topic, key) if routed else partition
        if target is None or (not routed and target not in self.partitions.get(topic, ())):
            return NOT_QUEUED
        fields = (key, value, None, timestamp or int(time.time() * 1000))
        callback = callback or self.default_callback
        if not self.accepting:  # checked again, as _accumulator.c does (Python code may have ended a transaction)
            return NOT_QUEUED
        if not self.transactional or callback is not None:
            self.in_flight += 1
        return self.enqueue((topic, target), fields, callback, routed, size)

    def route(self, topic: str, key: bytes | None) -> int | None:
        """The partition of the topic's open epoch a record of this key goes to (the sticky one for no key); None
        if the topic's epoch is not known yet."""
        current = self.current.get(topic)
        if current is None:
            return None
        if key is not None:
            return partition_for_key(key, current)
        sticky = self.sticky.get(topic)
        if sticky is None or sticky not in current:
            sticky = self.sticky[topic] = current[0]
        return sticky

    def enqueue(self, tp: PartitionKey, fields: RecordFields, callback: DeliveryCallback | None, routed: bool,
                size: int) -> int:
        """Add a record to its partition's batch (opened now if there is none): QUEUED, FULL or DUE."""
        batch = self.batches.get(tp)
        if batch is None:  # setdefault: a collection's finalizer may have produced here while the batch was made
            batch = self.batches.setdefault(tp, Batch(math.inf if self.transactional
                                                      else time.monotonic() + self._linger_s))
            self.next_due = min(self.next_due, batch.deadline)
        queued = batch.fields
        if callback is not None:
            batch.callbacks[len(queued)] = callback
        if not routed:
            batch.pinned.add(len(queued))
        queued.append(fields)
        batch.size += size
        if self.transactional:
            self.queued += 1
            self.queued_bytes += size
            return FULL if self.queued >= self._batch_records or self.queued_bytes >= self._batch_bytes else QUEUED
        if len(queued) >= self._batch_records or batch.size >= self._batch_bytes:
            return FULL
        return DUE if self.next_due <= time.monotonic() else QUEUED

    def take(self) -> dict[PartitionKey, Batch]:
        """Every batch, leaving none."""
        taken = dict(self.batches)
        self.batches.clear()
        self.queued = self.queued_bytes = 0
        self.next_due = math.inf
        return taken


def accumulator(lock: AbstractContextManager[Any], linger_s: float, batch_records: int, batch_bytes: int,
                max_queued: int, max_bytes: int, default_callback: DeliveryCallback | None,
                transactional: bool) -> Accumulator:
    """An accumulator: the compiled one where pip built it. A limit past what a C size holds is no limit."""
    kind = Accumulator if _compiled is None else _compiled.Accumulator
    return kind(lock, linger_s, min(batch_records, sys.maxsize), min(batch_bytes, sys.maxsize),
                min(max_queued, sys.maxsize), min(max_bytes, sys.maxsize), default_callback, transactional)


class Accumulating(Protocol):
    """What :func:`fast_produce` needs of a Producer."""

    _queue: Accumulator

    def _send_queued(self, queued: int) -> None:
        """Send what ``queued`` (FULL or DUE) says is ready, taking the Producer's lock."""


P = TypeVar("P", bound=Callable[..., None])


def fast_produce(full: P) -> P:
    """``produce`` as a Producer's method: the usual record queued by its accumulator (``self._queue``) in one call,
    any other call to ``full``, the method as written, with its arguments as given. Compiled where pip built it
    (``self._queue`` must then be a compiled accumulator too, else ``full`` does it all)."""
    if _compiled is not None:
        return _compiled.Produce(full)

    @functools.wraps(full)
    def produce(self: Accumulating, topic: str, value: object = None, key: object = None, partition: object = -1,
                on_delivery: DeliveryCallback | None = None, timestamp: object = 0, headers: object = None, *,
                callback: DeliveryCallback | None = None, expected_offset: int | None = None,
                expected_sequence: int | None = None, sequence: int | None = None) -> None:
        if headers is None and expected_offset is None and expected_sequence is None and sequence is None:
            queued = self._queue.add(topic, value, key, partition, callback or on_delivery, timestamp)
            if queued:
                if queued >= FULL:
                    self._send_queued(queued)
                return
        full(self, topic, value, key, partition, on_delivery, timestamp, headers, callback=callback,
             expected_offset=expected_offset, expected_sequence=expected_sequence, sequence=sequence)

    return produce  # type: ignore[return-value]
