"""Which transaction groups commit offsets for which consumer groups, so that a reader rolls them forward first.

A staged (or inline, or conditional) transaction's consumer-group offsets reach the group when its merge publishes
it, with its records, not when its COMMIT is stored (a one-step commit's land with it). A producer that dies between
the two leaves a decided transaction whose offsets the consumer group does not have yet: a member that took its
input partitions over and read the committed offsets then would process those input records again, and the next
merge would publish the output of both. Kafka answers this with ``UNSTABLE_OFFSET_COMMIT`` (KIP-447): an offset
fetch waits while a transaction carrying offsets for the group is undecided or unpublished.

Here a transaction group registers itself for a consumer group before its first such COMMIT that carries offsets for
it, and a consumer merges every transaction group registered for its group before it reads committed offsets
(:meth:`~onceflow.connector.Consumer.committed`, and the start of each partition it gains;
:mod:`onceflow.txn.stable_offsets`). The registry is one stream that never expires, a record per (consumer group,
transaction group) pair, written once: each process remembers what it read and reads only what was added since.

A member that lost its partitions while it was stalled (a "zombie") and commits its open transaction after the
new member read the offsets is fenced by its transaction's CLAIM (``TransactionGroup._claim``), as Kafka fences it
by the group generation (KIP-447): the new member aborts claimed transactions before it reads.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Record, Store, describe_if_exists, ensure_stream, read_range

STREAM = "__onceflow.offset_writers"
"""The registry: one partition; a record's key is a consumer group, its value a transaction group (UTF-8)."""


class OffsetWriters:
    """The registry as this process read it; thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._read_to = 0
        self._writers: defaultdict[str, set[str]] = defaultdict(set)  # consumer group -> transaction groups

    def add(self, consumer_group: str, txn_group: str) -> None:
        """Register ``txn_group`` as a committer of ``consumer_group``'s offsets; stored when this returns."""
        with self._lock:
            if txn_group in self._writers[consumer_group]:
                return
            ensure_stream(self._store, STREAM, 1)
            self._catch_up()
            if txn_group in self._writers[consumer_group]:
                return
            writer = self._store.open_writer()
            try:
                writer.append(STREAM, 0, [Record(consumer_group.encode(), txn_group.encode())])
            finally:
                writer.close()
            self._writers[consumer_group].add(txn_group)

    def of(self, consumer_group: str) -> set[str]:
        """The transaction groups registered for ``consumer_group`` so far (read from the store now)."""
        with self._lock:
            try:
                self._catch_up()
            except KafkaException as exc:  # (one look: the registry's partition, which it lacks before any pair)
                if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART or describe_if_exists(self._store, STREAM) is not None:
                    raise
            return set(self._writers[consumer_group])

    def _catch_up(self) -> None:
        for message in read_range(self._store, STREAM, 0, self._read_to):
            self._writers[(message.key() or b"").decode()].add((message.value() or b"").decode())
            self._read_to = (message.offset() or 0) + 1  # (what a fetch did not return is read next time)
