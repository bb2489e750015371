"""A reader's side of :mod:`onceflow.txn.offset_writers`: before a consumer reads its group's committed offsets,
every transaction group registered as a committer of them is rolled forward, so that no decided transaction's
offsets are missing (as Kafka's offset fetch waits on them: ``UNSTABLE_OFFSET_COMMIT``, KIP-447).

Rolling forward writes (a merge pass, through the merge's fenced owner), so on Kafka a consumer of such a group
needs write access to the transaction groups' topics, as their producers have.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection

from onceflow.connector.config import StoreConfig, TransactionConfig
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import PartitionKey, Store, describe_if_exists
from onceflow.txn import shared
from onceflow.txn.group import TransactionGroup, stream_names
from onceflow.txn.offset_writers import OffsetWriters


class StableOffsets:
    """One client's view (a consumer's, an admin client's): the registry as it read it, and the transaction groups
    it opened to merge. Thread-safe."""

    def __init__(self, store: Store, store_config: StoreConfig) -> None:
        self._store = store
        self._store_config = store_config
        self._registry = OffsetWriters(store)
        self._groups: dict[str, TransactionGroup] = {}
        self._lock = threading.Lock()

    def settle(self, consumer_group: str, aborting_claims: bool = False) -> None:
        """Merge every transaction whose COMMIT is stored so far in the groups registered for ``consumer_group``.
        ``aborting_claims``: first abort every open transaction that claimed offsets of the group, unless it
        committed (``TransactionGroup.abort_claims``): for a caller about to set the offsets of a group without
        members, whose members may have claimed before they were removed. A registered group whose commit log is
        gone (deleted with its streams) has nothing left to merge."""
        def settle(group: TransactionGroup) -> None:
            if aborting_claims:
                group.abort_claims(consumer_group, None)
            group.merge(complete=True)

        with self._lock:
            self._each(consumer_group, settle)

    def abort_claims(self, consumer_group: str, gained: Collection[PartitionKey]) -> None:
        """A member of ``consumer_group`` gained partitions: abort every open transaction of the registered groups
        that claimed offsets of them (its member lost them), unless it committed (``TransactionGroup.abort_claims``);
        before the member starts them anywhere (from the committed offsets, or where it seeks)."""
        with self._lock:
            self._each(consumer_group, lambda group: group.abort_claims(consumer_group, gained))

    def _each(self, consumer_group: str, action: Callable[[TransactionGroup], None]) -> None:
        """``action`` on each transaction group registered for ``consumer_group`` whose log exists."""
        for name in sorted(self._registry.of(consumer_group)):
            group = self._groups.get(name)
            if group is None:
                if not self._log_exists(name):
                    continue
                group = self._groups[name] = shared.acquire(self._store_config, TransactionConfig(group=name))
            try:
                action(group)
            except KafkaException as exc:
                if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PART or self._log_exists(name):
                    raise
                shared.release(self._groups.pop(name))  # deleted since it was opened

    def _log_exists(self, group: str) -> bool:
        return describe_if_exists(self._store, stream_names(group)[0]) is not None

    def close(self) -> None:
        """Release every group opened here, each even when one before it raised."""
        with self._lock, contextlib.ExitStack() as releasing:
            for group in self._groups.values():
                releasing.callback(shared.release, group)
            self._groups.clear()
