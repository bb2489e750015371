"""The merge's progress: the next commit-log offset to merge, kept as the last record of the group's progress
stream ``__onceflow.txn.G.progress`` and written by the same atomic append as what the merge merged.

Not a consumer group's committed offset: Kafka deletes the offsets of a group without members once they are
older than ``offsets.retention.minutes`` (7 days by default), and a merge that lost its progress would publish
every transaction still in the commit log again. The progress stream is one of onceflow's own, which never
expire. A pass appends its progress record on the condition that the stream still ends where it ended when the
progress was read, so of two processes merging the same entries one lands and the other gets CAS_MISMATCH (on
Kafka the fenced owner of the stream's partition checks it, inside the pass's Kafka transaction).

Groups merged before the progress stream existed kept their progress in consumer group
``__onceflow.txn.G.merge``: it is read while the stream is still empty, and the first pass moves it over.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.message import Message
from onceflow.connector.store import Batch, PartitionKey, Record, Store
from onceflow.txn.commit_log import STORED_POLL_FIRST_S, STORED_POLL_MAX_S, STORED_WAIT_S

_READ_BATCH = 100
_FIRST_WINDOW = 4  # a pass adds one record (and on Kafka its commit marker): the last one is near the end


@dataclasses.dataclass(frozen=True)
class Progress:
    """The merge's progress as read: ``merged_to`` (None before the first merge), the stream's end offset then
    (the condition of the next pass) and the offset of the record holding it (None if none does)."""

    merged_to: int | None
    end: int
    at: int | None


class ProgressStream:
    """Reads and writes one group's merge progress; holds no state, so any number of processes share it."""

    def __init__(self, store: Store, stream: str, legacy_group: str, legacy_key: PartitionKey) -> None:
        self._store = store
        self.stream = stream
        self._legacy_group = legacy_group
        self._legacy_key = legacy_key

    def read(self) -> Progress:
        """The progress stored now (its last record), with the end offset a pass must find to store the next."""
        last, end = last_record(self._store, self.stream)
        if last is None:
            return Progress(self._legacy(), end, None)
        return Progress(_decode(last, self.stream), end, last.offset())

    def advance(self, read: Progress, merged_to: int) -> Batch:
        """The batch that stores ``merged_to``, refused (CAS_MISMATCH) unless nothing was stored since ``read``."""
        return Batch(self.stream, 0, [Record(None, str(merged_to).encode())], expected_offset=read.end)

    def _legacy(self) -> int | None:
        return self._store.committed_offsets(self._legacy_group, [self._legacy_key]).get(self._legacy_key)


def kept_in_stream(group: str) -> bool:
    """True for onceflow's own groups (``__onceflow.`` names): a merge keeps their offsets as the last record of
    the stream named like the group, when that stream exists, instead of committing them to the group (where
    Kafka's ``offsets.retention.minutes`` would delete them). Such a record holds all of the group's offsets."""
    return group.startswith("__onceflow.")


def encode_offsets(offsets: Mapping[PartitionKey, int]) -> bytes:
    return json.dumps(sorted([stream, partition, offset] for (stream, partition), offset in offsets.items())).encode()


def kept_offsets(store: Store, group: str, keys: Sequence[PartitionKey]) -> dict[PartitionKey, int]:
    """The offsets of an onceflow group kept in its stream (see :func:`kept_in_stream`); the group's committed
    offsets while the stream holds none (kept there before).

    Read once every record stored in the stream is decided: a merge writes the record in one Kafka transaction
    with its progress, whose markers are written partition by partition, so a reader that saw the progress move
    may not see the record yet. A Spark sink reading a batch's offsets that stale took a replay of a batch another
    process had merged for the next batch, and published it twice."""
    last, _ = last_record(store, group, complete=True)
    if last is None:
        return store.committed_offsets(group, keys)
    try:
        positions = {(stream, partition): offset for stream, partition, offset in json.loads(last.value() or b"")}
    except (ValueError, TypeError) as exc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{group} record {last.offset()}: not a group's offsets ({exc})")
    return {key: positions[key] for key in keys if key in positions}


def last_record(store: Store, stream: str, complete: bool = False) -> tuple[Message | None, int]:
    """The last record of a one-partition stream and the stream's end offset when it was read. ``complete``: once
    the records stored before the call are readable (on Kafka an undecided transaction holds readers back; see
    :meth:`Store.stored_end`), up to :data:`STORED_WAIT_S`, then a retriable _TIMED_OUT."""
    stored = store.stored_end(stream, 0) if complete else 0
    deadline, pause = time.monotonic() + STORED_WAIT_S, STORED_POLL_FIRST_S
    while True:
        state = store.partition_state(stream, 0)
        if state.end_offset < stored:
            if time.monotonic() > deadline:
                fail(ErrorCode._TIMED_OUT, f"{stream}: records stored up to offset {stored} are held back by an "
                     f"undecided transaction (readable up to {state.end_offset}) for {STORED_WAIT_S:g}s; try "
                     "again", retriable=True)
            time.sleep(pause)
            pause = min(2 * pause, STORED_POLL_MAX_S)
            continue
        try:
            return _last_record(store, stream, state.start_offset, state.end_offset), state.end_offset
        except KafkaException as exc:
            if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            # truncated while read (a later record is there): look again


def _last_record(store: Store, stream: str, start: int, end: int) -> Message | None:
    """The last record below ``end``, looking back from it in growing windows."""
    window = _FIRST_WINDOW
    while True:
        first = max(start, end - window)
        last = _last_in(store, stream, first, end)
        if last is not None or first == start:
            return last
        window *= 8


def _last_in(store: Store, stream: str, first: int, end: int) -> Message | None:
    last = None
    offset = first
    while offset < end:
        messages = [m for m in store.read(stream, 0, offset, _READ_BATCH) if (m.offset() or 0) < end]
        if not messages:
            break
        last = messages[-1]
        offset = (last.offset() or offset) + 1
    return last


def _decode(message: Message, stream: str) -> int:
    value = message.value() or b""
    if not value.isdigit():
        fail(ErrorCode.CORRUPT_MESSAGE, f"{stream} record {message.offset()}: not a merge progress: {value[:40]!r}")
    return int(value)
