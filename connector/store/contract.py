"""The store contract: what every backend (embedded SQLite, Kafka) provides, and nothing more.

It speaks of streams, epochs, partitions, records, writers and consumer groups, never of tables or topics'
internals, so ``txn/`` and the clients work unchanged on every backend. A backend knows nothing of
transactions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from onceflow.connector import partitioner
from onceflow.connector.errors import ErrorCode, KafkaError, fail
from onceflow.connector.message import Headers, Message

PartitionKey = tuple[str, int]
"""(stream name, partition id)."""

INTERNAL_TOPIC_PREFIX = "__onceflow."
"""Streams named so are onceflow's own (transaction logs, staging, progress, sink claims): clients may not create,
change or delete them, and onceflow never scales them (so a view of their partitions never goes stale)."""

NO_SEQUENCE = -1
"""``last_sequence`` of a partition no record with an application sequence number was written to."""


MAX_PARTITIONS = 10_000


def check_partition_count(name: str, partitions: object) -> None:
    """INVALID_PARTITIONS unless ``partitions`` is a whole number from 1 to MAX_PARTITIONS."""
    if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
        fail(ErrorCode.INVALID_PARTITIONS, f"topic {name!r}: partition count must be 1..{MAX_PARTITIONS}, "
             f"got {partitions!r}")


class Record(NamedTuple):
    """A record to append; the store assigns its offset."""

    key: bytes | None
    value: bytes | None
    headers: Headers | None = None
    timestamp: int = -1


RecordFields = tuple[bytes | None, bytes | None, Headers | None, int]
"""A record's (key, value, headers, timestamp) as a plain tuple, the way producers queue records until they are
written: the garbage collector stops tracking a plain tuple of bytes and ints, but tracks a named tuple for as long
as it lives, and full collections over a producer's queue of them took ~17% of ``produce()``."""

_new_record: Callable[[RecordFields], Record] = functools.partial(tuple.__new__, Record)


def records_of(fields: Iterable[RecordFields]) -> list[Record]:
    """Records made from their fields with ``tuple.__new__`` (C), not the named tuple's Python ``__new__``."""
    return list(map(_new_record, fields))


@dataclasses.dataclass(frozen=True)
class Condition:
    """What a CAS append expects of its partition; every field None is an unconditional append.

    ``expected_offset``: the partition's end offset. ``expected_sequence``: its last application sequence
    number (``NO_SEQUENCE`` for none). ``sequence``: the batch's own application sequence number, which must
    exceed the partition's last one; it defaults to ``expected_sequence + 1``.
    """

    expected_offset: int | None = None
    expected_sequence: int | None = None
    sequence: int | None = None

    @property
    def unconditional(self) -> bool:
        return self.expected_offset is None and self.expected_sequence is None and self.sequence is None

    @property
    def new_sequence(self) -> int | None:
        """The application sequence number the batch will carry, if any."""
        if self.sequence is None and self.expected_sequence is not None:
            return self.expected_sequence + 1
        return self.sequence

    def check(self, where: str, end: int, last_sequence: Callable[[], int]) -> None:
        """CAS_MISMATCH or OUT_OF_ORDER_SEQUENCE_NUMBER unless the partition (at ``end``) is as expected.

        ``last_sequence`` is only called when a sequence number is involved (it may cost a read).
        """
        if self.expected_offset is not None and self.expected_offset != end:
            fail(ErrorCode.CAS_MISMATCH, f"{where}: expected end offset {self.expected_offset}, log end is {end}")
        new = self.new_sequence
        if new is None:
            return
        last = last_sequence()
        if self.expected_sequence is not None and self.expected_sequence != last:
            fail(ErrorCode.CAS_MISMATCH, f"{where}: expected last sequence {self.expected_sequence}, log's last "
                 f"sequence is {last}")
        if new <= last:
            fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, f"{where}: sequence {new} does not exceed the partition's "
                 f"last sequence {last}")


class Batch(NamedTuple):
    """The records one atomic append puts into one partition; with ``expected_offset`` the whole append is
    refused (CAS_MISMATCH) unless the partition ends there."""

    stream: str
    partition: int
    records: Sequence[RecordFields]  # Records, or their fields as plain tuples: read by position
    expected_offset: int | None = None


def check_open(closed: bool, store_url: str) -> None:
    """_STATE for an append through a closed writer. A closed writer's sequence numbers are forgotten (on the
    embedded store its producer state too), so an append after close would be numbered as a new session's and
    could be answered as another one's duplicate: "landed", with nothing written."""
    if closed:
        fail(ErrorCode._STATE, f"store {store_url}: this writer is closed; open another one to append")


def check_atomic_batches(batches: Sequence[Batch], offsets: Sequence[OffsetCommit]) -> None:
    """INVALID_RECORD for an atomic append with nothing to write or naming a partition twice."""
    if not batches and not offsets:
        fail(ErrorCode.INVALID_RECORD, "an atomic append needs at least one batch or offset commit")
    keys = [(b.stream, b.partition) for b in batches]
    if len(set(keys)) != len(keys):
        fail(ErrorCode.INVALID_RECORD, f"an atomic append names a partition twice: {keys}")


@dataclasses.dataclass(frozen=True)
class OffsetCommit:
    """A group's next offsets, committed together with an atomic append.

    With ``expected`` the whole append is conditional: it is refused with CAS_MISMATCH unless each listed
    partition's committed offset is the one given (None: the group has none for it). This is how a
    consume-transform-produce loop stores its progress with its output and detects a rival.

    With a ``member_id`` (the group member whose input these offsets follow) it is refused with UNKNOWN_MEMBER_ID
    unless that member still owns every listed partition, checked in the same step: a member that lost them while
    stalled must not commit after the member that took them over read the offsets (Kafka's generation check,
    KIP-447). The embedded store checks it; Kafka cannot within a transaction (INVALID_REQUEST): there a member's
    offsets go through ``TransactionGroup``'s CLAIM and member check.
    """

    group: str
    offsets: Mapping[PartitionKey, int]
    expected: Mapping[PartitionKey, int | None] | None = None
    member_id: str | None = None

    def check(self, committed: Mapping[PartitionKey, int]) -> None:
        """CAS_MISMATCH unless ``committed`` (the group's offsets now) matches ``expected``."""
        for key, want in (self.expected or {}).items():
            if committed.get(key) != want:
                fail(ErrorCode.CAS_MISMATCH, f"group {self.group!r} {key[0]}[{key[1]}]: expected committed offset "
                     f"{want}, found {committed.get(key)}")


@dataclasses.dataclass(frozen=True)
class EpochDescription:
    """One epoch of a stream: its partition ids (global, dense across epochs) and whether it is sealed."""

    epoch: int
    partitions: tuple[int, ...]
    sealed: bool


@dataclasses.dataclass(frozen=True)
class TopicSettings:
    """How a stream's topics are made on a cluster (every epoch's alike): copies and Kafka topic configs
    (``retention.ms``, ``cleanup.policy``, ...); -1 and none take the cluster's defaults. The embedded store keeps
    one copy of everything until ``truncate_before``: it refuses other settings rather than ignore them."""

    replication_factor: int = -1
    config: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StreamDescription:
    """A stream and its epochs, oldest first; only the last epoch is open for appends."""

    name: str
    epochs: tuple[EpochDescription, ...]
    settings: TopicSettings = TopicSettings()

    @property
    def current(self) -> EpochDescription:
        return self.epochs[-1]

    @property
    def compacted(self) -> bool:
        """Kafka keeps the last record of each key only, and refuses a record without a key."""
        return "compact" in self.settings.config.get("cleanup.policy", "")

    def check_keys(self, keys: Iterable[bytes | None]) -> None:
        """INVALID_RECORD if a record without a key is bound for a compacted stream: a transaction checks its
        records before it commits, as its merge could never publish them (Kafka would refuse them every time)."""
        if self.compacted and any(key is None for key in keys):
            fail(ErrorCode.INVALID_RECORD, f"{self.name}: a compacted stream (cleanup.policy=compact) needs a key "
                 "on every record; a record without one was refused")

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(p for epoch in self.epochs for p in epoch.partitions)

    def epoch_of(self, partition: int) -> EpochDescription:
        for epoch in self.epochs:
            if partition in epoch.partitions:
                return epoch
        fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"{self.name}[{partition}]: no such partition "
             f"(partitions {self.partitions[0]}..{self.partitions[-1]})")

    def partition_for_key(self, key: bytes) -> int:
        """The partition of the current epoch whose key range holds ``key``."""
        return partitioner.partition_for_key(key, self.current.partitions)

    def predecessors(self, partition: int) -> tuple[int, ...]:
        """Partitions of the previous epoch whose key ranges overlap ``partition``'s; () in epoch 0."""
        epoch = self.epoch_of(partition)
        if epoch.epoch == 0:
            return ()
        previous = self.epochs[epoch.epoch - 1].partitions
        index = epoch.partitions.index(partition)
        return tuple(previous[i] for i in partitioner.overlapping(index, len(epoch.partitions), len(previous)))


def first_epoch(name: str, partitions: int) -> StreamDescription:
    """The description of a stream just created with ``partitions`` partitions."""
    return StreamDescription(name, (EpochDescription(0, tuple(range(partitions)), False),))


@dataclasses.dataclass(frozen=True)
class PartitionState:
    """Where a partition's log starts and ends, if it is sealed, and the last application sequence in it.

    ``last_sequence`` is found when first asked for, not with the offsets: on Kafka finding it reads the partition
    back from its end until a record carries one (all of it when none does), which a reader that only wants the
    offsets (a consumer's assign, a Spark source's next batch) must not pay."""

    start_offset: int
    end_offset: int
    sealed: bool
    find_last_sequence: Callable[[], int] = dataclasses.field(repr=False, compare=False)
    undecided_from: int | None = None
    """Kafka, a sealed partition: the last stable offset while a transaction with records below the seal is
    undecided (``end_offset`` is then the seal itself, as one may still commit); else None."""

    @functools.cached_property
    def last_sequence(self) -> int:
        return self.find_last_sequence()

    @property
    def stable_end(self) -> int:
        """How far a reader that plans its reads ahead (a Spark batch) may go now: every record below it is
        decided. A reader that took ``end_offset`` (a seal) as read would skip an undecided transaction's records
        below it if that transaction commits."""
        return self.end_offset if self.undecided_from is None else min(self.end_offset, self.undecided_from)


@dataclasses.dataclass(frozen=True)
class AppendResult:
    """Where an appended batch landed; ``duplicate`` is true when a retry found it already written.

    ``offsets`` lists each record's offset when they are not consecutive (on Kafka another producer's records
    may land between them); None means ``base_offset``, ``base_offset + 1``, ...

    ``end_after``: the partition's end offset once the append completed if no other writer appended with it (on
    Kafka a transaction's commit marker follows its records): the offset a conditional append that comes next
    expects; None where the store does not say.
    """

    base_offset: int
    record_count: int
    duplicate: bool = False
    offsets: tuple[int, ...] | None = None
    end_after: int | None = None

    @property
    def last_offset(self) -> int:
        return self.offsets[-1] if self.offsets else self.base_offset + self.record_count - 1

    def offset_of(self, index: int) -> int:
        return self.offsets[index] if self.offsets else self.base_offset + index


AppendCallback = Callable[["AppendResult | None", "KafkaError | None"], None]
"""How an asynchronous append reports its outcome: (result, None) or (None, error)."""


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    """How a member keeps its place in a group (librdkafka's meanings)."""

    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int


@dataclasses.dataclass(frozen=True)
class GroupMemberDescription:
    """A live member of a consumer group and the partitions it owns now."""

    member_id: str
    client_id: str
    host: str
    assignment: tuple[PartitionKey, ...]


@dataclasses.dataclass(frozen=True)
class GroupDescription:
    """A consumer group as the store knows it: its live members (none: the group is empty, or unknown when it has
    no committed offsets either) and its committed next offsets."""

    group: str
    members: tuple[GroupMemberDescription, ...]
    offsets: Mapping[PartitionKey, int]

    @property
    def known(self) -> bool:
        return bool(self.members or self.offsets)


GiveUp = Callable[[frozenset[PartitionKey]], None]
"""Called with owned partitions that are about to move to another member; commit their positions in it."""


class GroupMember(Protocol):
    """One member's session in a consumer group; partitions of the subscribed streams are shared out.

    A partition moves to a new owner only after its owner gave it up (``give_up`` returned) or after the owner's
    session expired, so two live members never own one partition at once.
    """

    @property
    def member_id(self) -> str: ...

    def sync(self, topics: Sequence[str], give_up: GiveUp) -> frozenset[PartitionKey]:
        """Keep the session alive, follow rebalances, and return the partitions this member owns now.

        Call it often (each poll): a member that does not sync for ``max_poll_interval_ms`` leaves its group.
        Partitions missing from ``owned`` without a ``give_up`` call were lost (the session expired).
        """
        ...

    def commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        """Commit next offsets of owned partitions; UNKNOWN_MEMBER_ID if the group moved any of them away."""
        ...

    def leave(self) -> None:
        """Leave the group at once (its partitions go to the others); no ``give_up`` is called."""
        ...


class Writer(Protocol):
    """An appending session: idempotent per partition, and fenced when opened with a ``writer_id``."""

    @property
    def writer_id(self) -> str | None: ...

    @property
    def epoch(self) -> int: ...

    def append(
        self,
        stream: str,
        partition: int,
        records: Sequence[RecordFields],
        *,
        expected_offset: int | None = None,
        expected_sequence: int | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        """Append a batch atomically; retrying after a retriable error never writes it twice.

        ``expected_offset``: refuse with CAS_MISMATCH unless the partition's end offset is this.
        ``expected_sequence``: refuse with CAS_MISMATCH unless the partition's last application sequence
        number is this (``NO_SEQUENCE`` for none). ``sequence``: the batch's application sequence number;
        it must exceed the partition's last one, and defaults to ``expected_sequence + 1`` when that is set.
        """
        ...

    def append_async(self, stream: str, partition: int, records: Sequence[RecordFields],
                     callback: AppendCallback) -> None:
        """An unconditional append whose outcome reaches ``callback`` from :meth:`poll` or :meth:`flush` (at
        once on a backend that writes synchronously). Errors found before anything is sent are raised here;
        retriable ones may be retried, as :meth:`append`'s. A record may also be its fields as a plain tuple
        (:data:`RecordFields`, a Producer's queue): stores read records by position."""
        ...

    def grouped(self) -> contextlib.AbstractContextManager[None]:
        """Asynchronous appends made inside (from one thread) may be written together: on the embedded store in
        one durable write, whose callbacks run when it is committed, at the block's end. An error that fails the
        group reaches every callback in it; each append's own errors still raise (or reach its callback) alone.
        On Kafka it changes nothing: librdkafka batches and pipelines appends itself."""
        ...

    def poll(self, timeout: float = 0) -> None:
        """Run the callbacks of asynchronous appends that completed, waiting up to ``timeout`` s for one."""
        ...

    def flush(self, timeout: float) -> None:
        """Wait until every asynchronous append completed and its callback ran (_TIMED_OUT if they did not)."""
        ...

    def take_over(self, stream: str, partition: int) -> None:
        """Become the one writer whose conditional appends to the partition go through: a conditional append
        another writer left unfinished (its process died in it) is then aborted, and readers of the partition go
        on past it. On Kafka that is its fenced owner's transaction, which only a new owner (or Kafka's
        ``transaction.timeout.ms``) ends; the embedded store leaves none unfinished, so there it does nothing."""
        ...

    def check_not_fenced(self, since: float | None = None) -> None:
        """PRODUCER_FENCED if a newer session of this ``writer_id`` was opened (nothing to check without one).
        ``since``: a look at the sessions this process began strictly after that monotonic time serves (on Kafka
        a round trip saved), else it looks now."""
        ...

    def append_atomic(self, batches: Sequence[Batch], offsets: Sequence[OffsetCommit] = ()) -> list[AppendResult]:
        """Append batches to several partitions and commit group offsets as one: all of it lands or none.

        Readers never see part of it (on Kafka: one Kafka transaction, read_committed). A conditional
        ``OffsetCommit`` or ``Batch`` refuses the whole with CAS_MISMATCH. On Kafka a call may have one condition
        (more is INVALID_REQUEST), checked by a fenced owner: a conditional offset commit (sound among writers that
        use this method for that group), or a conditional batch to one of onceflow's own ``__onceflow`` streams
        (sound among writers that use conditional appends for that partition); a conditional batch to any other
        stream is INVALID_REQUEST: Kafka cannot check a partition's end within a transaction.
        """
        ...

    def close(self) -> None: ...


class Store(Protocol):
    """A backend holding streams of partitioned, append-only record logs."""

    @property
    def url(self) -> str: ...

    @property
    def atomic_conditions(self) -> int:
        """How many conditions (batches' expected offsets, offset commits' expected offsets) one
        :meth:`Writer.append_atomic` may carry; more is INVALID_REQUEST. Declared, so that a caller chooses how
        to write before writing rather than by trying."""
        ...

    @property
    def unusable(self) -> KafkaError | None:
        """The fatal error that made this store unusable, if one did: every append and every read of a stream
        raises it, and only a store opened anew works (Kafka: the catalog went back, the cluster having lost
        acknowledged data)."""
        ...

    @property
    def writer_sessions_outlive_close(self) -> bool:
        """Whether a writer's session stays with the store after the writer is closed (on Kafka the brokers keep a
        producer id for ``producer.id.expiration.ms``): there a process that writes task after task reuses its
        writers. Where closing removes it (the embedded store deletes an anonymous writer's rows), a writer is
        closed after its task instead: one a killed process held open stays for good."""
        ...

    def create_stream(self, name: str, partitions: int, settings: TopicSettings | None = None,
                      validate_only: bool = False) -> StreamDescription:
        """A new stream of ``partitions`` partitions; ``validate_only``: every check, nothing created (the
        description is what would be). TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, TOPIC_EXCEPTION (name),
        INVALID_REPLICATION_FACTOR, INVALID_CONFIG."""
        ...

    def delete_stream(self, name: str) -> None: ...

    def list_streams(self) -> list[str]: ...

    def describe_stream(self, name: str) -> StreamDescription: ...

    def scale_stream(self, name: str, partitions: int) -> StreamDescription:
        """Seal the current epoch's partitions and open a new epoch with ``partitions`` partitions."""
        ...

    def partition_state(self, stream: str, partition: int) -> PartitionState: ...

    def stored_end(self, stream: str, partition: int) -> int:
        """One past the last record stored in the partition, whether readable yet or not. On Kafka a transaction
        still open holds readers (and ``partition_state``'s end offset) below its first record, while records
        stored after it already exist (the high watermark); elsewhere this is the end offset."""
        ...

    def read(self, stream: str, partition: int, offset: int, max_records: int) -> list[Message]:
        """The next records from ``offset`` on, in offset order, in a new list (the caller's to keep and change);
        [] only at the end.

        One call is one fetch, not a read of everything: it returns at most ``max_records`` (the embedded store
        may finish the stored batch it is in, a few more) and may return fewer while more records follow — on
        Kafka, what one fetch brought, however large ``max_records`` is. To read a partition whole (or any
        range), loop from the last offset returned + 1 until the end: :func:`onceflow.connector.store.read_range`
        is that loop; use it rather than one call with a large ``max_records``.

        OFFSET_OUT_OF_RANGE below the start offset or past the end offset.
        """
        ...

    def prefetch(self, positions: Mapping[PartitionKey, int]) -> None:
        """A hint: these partitions will be read from these offsets next. A store that fetches over a network
        starts fetching them all at once, so that their first reads do not each wait for a fetch in turn; one
        that reads on demand does nothing. What a read of a partition would raise is left to that read."""
        ...

    def truncate_before(self, stream: str, partition: int, offset: int) -> int:
        """Drop records below ``offset``; returns the new start offset."""
        ...

    def open_writer(self, writer_id: str | None = None, delivery_timeout_ms: int | None = None) -> Writer:
        """A new appending session; with ``writer_id``, every older session of that id is fenced.

        ``delivery_timeout_ms`` bounds how long an asynchronous append may stay unacknowledged; one still
        unacknowledged then may or may not be written and is reported with ``outcome_unknown()`` (a backend
        whose appends complete before they return never waits)."""
        ...

    def join_group(self, group: str, settings: GroupSettings) -> GroupMember:
        """Join ``group`` as a new member (it owns nothing until its first sync)."""
        ...

    def commit_offsets(self, group: str, offsets: Mapping[PartitionKey, int]) -> None:
        """Store a group's next offsets, outside any membership (as a consumer that only assigns)."""
        ...

    def committed_offsets(self, group: str, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        """Committed next offsets of a group; partitions without one are absent."""
        ...

    def list_groups(self) -> list[str]:
        """Every consumer group with live members or committed offsets, by name."""
        ...

    def describe_group(self, group: str) -> GroupDescription:
        """A group's live members, what each owns, and its committed offsets (nothing for an unknown group)."""
        ...

    def check_member(self, group: str, member_id: str, partitions: Iterable[PartitionKey]) -> None:
        """UNKNOWN_MEMBER_ID unless ``member_id`` is still a member of ``group`` that owns ``partitions``. On Kafka
        membership is what its coordinator says (during a rebalance a member keeps its membership, and its
        partitions move only once it gave them up or was removed), and ownership the member's own view where it
        is a member of this process (else it is not checked)."""
        ...

    def delete_group(self, group: str) -> None:
        """Forget an empty group's committed offsets: GROUP_ID_NOT_FOUND for an unknown group, NON_EMPTY_GROUP while
        it has live members."""
        ...

    def offset_for_time(self, stream: str, partition: int, timestamp: int) -> int | None:
        """The offset of the first record (from the partition's start) whose timestamp is >= ``timestamp`` (ms);
        None when there is none."""
        ...

    def max_timestamp(self, stream: str, partition: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (the first of equals); None when empty."""
        ...

    def brokers(self) -> dict[int, tuple[str, int]]:
        """Broker id -> (host, port) of the servers holding the store (the embedded store: one, id 0, its path)."""
        ...

    def replicas(self, stream: str) -> dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]]:
        """Partition id -> (leader, replicas, in-sync replicas) as broker ids, for every epoch's partitions."""
        ...

    def close(self) -> None: ...
