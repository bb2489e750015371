"""A group member's generation as this process sees it: which partitions it gained after a point in time.

Kafka refuses a transaction's offsets whose consumer metadata is older than the member's generation, and the
generation moves with every rebalance. onceflow's stores check that the member is in its group and owns the
partitions whose offsets it commits; a partition that left the member and came back to it under the same member
id, while a transaction stayed open across both rebalances, passed those checks, though the member that held it
in between may have processed its records (they were published twice). So the Consumer counts its own
rebalances that gained partitions (its generation, carried in ``ConsumerGroupMetadata.generation_id``), and a
transaction's commit is refused if a member of this process gained any of the committed partitions after the
metadata was taken. A member of another process is not looked at (docs/transactions.md)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

from onceflow.connector.store.contract import PartitionKey

_LIVE: weakref.WeakSet[MemberGenerations] = weakref.WeakSet()  # this process's subscribed consumers
_LIVE_LOCK = threading.Lock()  # (a WeakSet iterated while another thread adds to it raises)


class MemberGenerations:
    """One consumer's rebalances that gained partitions, and when each partition it owns was last gained."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.member_id: str | None = None
        self._generation = 0
        self._gained_at: dict[PartitionKey, int] = {}
        self._lock = threading.Lock()
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def gained(self, member_id: str, partitions: Iterable[PartitionKey]) -> None:
        """A rebalance gave the member ``partitions``: a new generation."""
        with self._lock:
            self.member_id = member_id
            self._generation += 1
            self._gained_at.update(dict.fromkeys(partitions, self._generation))

    def dropped(self, partitions: Iterable[PartitionKey]) -> None:
        with self._lock:
            for key in partitions:
                self._gained_at.pop(key, None)

    def left(self) -> None:
        """The member left its group: it owns nothing, and a later member id is another member."""
        with self._lock:
            self.member_id = None
            self._gained_at.clear()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def gained_after(self, generation: int, partitions: Iterable[PartitionKey]) -> list[PartitionKey]:
        with self._lock:
            return sorted(key for key in partitions if self._gained_at.get(key, 0) > generation)


def gained_since(group_id: str, member_id: str, generation: int,
                 partitions: Iterable[PartitionKey]) -> tuple[list[PartitionKey], int]:
    """Of ``partitions``, those that the member ``member_id`` of ``group_id`` gained after its ``generation``
    (as a member of this process counts them), and its generation now; ([], -1) if no member of this process
    has that id."""
    with _LIVE_LOCK:
        members = [m for m in _LIVE if m.group_id == group_id and m.member_id == member_id]
    for member in members:
        return member.gained_after(generation, partitions), member.generation
    return [], -1
