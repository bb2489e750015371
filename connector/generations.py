"""A group member's generation as this process sees it: which partitions it gave up after a point in time.

Kafka refuses a transaction's offsets whose consumer metadata is older than the member's generation, which moves
with every rebalance. onceflow's stores check that the member is in its group and owns the partitions whose
offsets it commits; a partition that left the member and came back to it under the same member id, while a
transaction stayed open across both rebalances, passed those checks, though the member that held it in between
may have processed its records (they were published twice). So the Consumer counts its own rebalances (each
gain or loss of partitions: its generation, carried in ``ConsumerGroupMetadata.generation_id``), and a
transaction's commit is refused if a member of this process gave up any of the committed partitions after the
metadata sent with their offsets was taken. A partition first gained after it passes: its records were read
from the offset the member before it committed. A member of another process is not looked at
(docs/transactions.md)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping

from onceflow.connector.store.contract import PartitionKey

_LIVE: weakref.WeakSet[MemberGenerations] = weakref.WeakSet()  # this process's subscribed consumers
_LIVE_LOCK = threading.Lock()  # (a WeakSet iterated while another thread adds to it raises)


class MemberGenerations:
    """One consumer's rebalances: its generation, the partitions it holds, when it last gave each one up."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.member_id: str | None = None
        self._generation = 0
        self._held: set[PartitionKey] = set()
        self._dropped_at: dict[PartitionKey, int] = {}
        self._lock = threading.Lock()
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def gained(self, member_id: str, partitions: Iterable[PartitionKey]) -> None:
        with self._lock:
            self.member_id = member_id
            self._generation += 1
            self._held.update(partitions)

    def dropped(self, partitions: Iterable[PartitionKey]) -> None:
        """The member gave ``partitions`` up (revoked or lost)."""
        with self._lock:
            self._generation += 1
            for key in partitions:
                self._held.discard(key)
                self._dropped_at[key] = self._generation

    def left(self) -> None:
        """The member left its group: no commit looks at it any more (a later member id is another member)."""
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def dropped_after(self, sent: Mapping[PartitionKey, int]) -> tuple[list[PartitionKey], list[PartitionKey]]:
        """Of ``sent`` (partition -> a generation), those given up after their generation: (held again, not held)."""
        with self._lock:
            moved = sorted(key for key, generation in sent.items() if self._dropped_at.get(key, 0) > generation)
            return [key for key in moved if key in self._held], [key for key in moved if key not in self._held]


def dropped_since(group_id: str, member_id: str,
                  sent: Mapping[PartitionKey, int]) -> tuple[list[PartitionKey], list[PartitionKey]]:
    """Of ``sent`` (a partition whose offset a transaction commits -> the generation in the metadata sent with
    it), those that the member ``member_id`` of ``group_id`` gave up after that generation: (held again now, not
    held now); ([], []) if no member of this process has that id."""
    with _LIVE_LOCK:
        member = next((m for m in _LIVE if m.group_id == group_id and m.member_id == member_id), None)
    return member.dropped_after(sent) if member is not None else ([], [])
