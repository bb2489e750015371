"""A group's commit log read back: every transaction's outcome is derived from the log, never from memory.

The outcome of a transaction is the first terminal record (COMMIT or ABORT) after its BEGIN. Later terminal
records for it, and terminal records for ids that were never begun, change nothing. So a commit racing its
timeout's abort is safe: every process that reads the log agrees on the winner. A COMMIT that joins other
transactions (it names participants staged in them) decides all of them or, if any was decided before, none.

A CLAIM decides nothing: it names the consumer-group partitions whose offsets an open transaction is about to
commit (see ``TransactionGroup`` on members that lost their partitions). It is written as an ABORT naming no
transaction (``claim.<txn id>``), which a reader that does not know claims passes over.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from onceflow.connector.errors import ErrorCode, KafkaException, fail
from onceflow.connector.store import PartitionKey, Store
from onceflow.connector.threads import SharedWork
from onceflow.schemas.txn_log_pb2 import TransactionMetadataEntry
from onceflow.txn import log_codec

log = logging.getLogger(__name__)

_READ_BATCH = 1000
CLAIM_PREFIX = "claim."
STORED_WAIT_S = 30.0  # how long a catch-up waits for entries stored but held back (see CommitLog.catch_up)
_KEEP_STORED = 1024
"""At most this many of this process's entries are kept to be taken as read, and only those at most this far past
what the view read: a view that cannot read on (an entry it cannot decode) keeps none beyond it."""
STORED_POLL_FIRST_S = 0.001
STORED_POLL_MAX_S = 0.05
_TAKE_OVER_AFTER_S = 2.0  # held back this long, the conditional append holding the log is taken over
_REMEMBER_FINISHED = 10_000  # at least this many merged transactions are remembered, at most twice as many
_KEEP_RECENT = 8  # entries last read, kept decoded for the merge that follows (it reads what a commit just read;
# a catch-up may read past it, up to _READ_BATCH entries, and a merge that starts before the last 8 reads the store)


class Outcome(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclasses.dataclass
class LoggedTransaction:
    """What the log says of one transaction; ``decided_at`` is (entry, index) of its deciding record."""

    txn_id: str
    begin_entry: int
    deadline_ms: int
    owner: str
    owner_epoch: int
    outcome: Outcome = Outcome.OPEN
    decided_at: tuple[int, int] | None = None
    reason: str = ""  # of its deciding record (only the string: a parsed record pins its whole entry's memory)
    claims: frozenset[tuple[str, str, int]] = frozenset()  # (consumer group, stream, partition) it claimed


class CommitLog:
    """An incrementally read view of one commit log; thread-safe.

    Another process may truncate the log under it (only entries of finished, merged transactions): reading on
    then skips to the new start, and transactions begun below it are forgotten.

    One reader at a time reads on and applies what it read (``_reading``); the view itself is guarded by
    ``_lock``, held only to look or to apply, never during a read: a merge asking what became of each transaction
    it publishes does not wait for a committer's read-back (with 64 producers committing at once, that wait was
    half of each merge pass).
    """

    def __init__(self, store: Store, stream: str, take_over: Callable[[], None] | None = None) -> None:
        self._store = store
        self.stream = stream
        self._take_over = take_over  # ends a conditional append left unfinished on the log (Writer.take_over)
        self._taken_over_at = float("-inf")
        self._next: int | None = None  # the next entry offset to read
        self._txns: dict[str, LoggedTransaction] = {}
        self._finished: dict[str, LoggedTransaction] = {}  # the latest merged ones, to answer "what became of it"
        # The latest entries read, decoded, and from where on that is all there is: [_recent_from, _next).
        self._recent: collections.deque[tuple[int, list[TransactionMetadataEntry]]] = collections.deque()
        self._recent_from: int | None = None
        self._merge_needed_to = 0  # see merge_needed_to
        self._advanced_at = float("-inf")  # see advanced_at
        self._forgotten_below = 0  # transactions decided below this entry were forgotten (see forget_merged)
        self._unread_below = 0  # entries below this one may never have been read (the log was cut past them)
        self._dropped_through = -1  # transactions decided at entries up to this one may be dropped from _finished
        self._reading = threading.Lock()  # taken first; _next moves only under both
        self._lock = threading.Lock()
        self._reads = SharedWork(self._reading)
        # This process's entries not taken as read yet, in the order stored (offsets ascending), each with the
        # offset the view reads on from once it took it (see appended).
        self._stored: collections.OrderedDict[int, tuple[list[TransactionMetadataEntry], int]] = \
            collections.OrderedDict()

    def catch_up(self, complete: bool = False) -> int:
        """Read every entry readable so far; returns the log's end offset.

        On Kafka entries stored after a transaction still open on the log (a conditional commit's: for a few ms,
        or for up to its producer's ``transaction.timeout.ms`` if its process died in it) are not readable until
        it ends. ``complete``: for a caller whose answer any stored entry may change (the outcome of a transaction,
        the BEGINs a fence must abort), wait for them too, up to :data:`STORED_WAIT_S`, then fail (retriable)."""
        stored = self._store.stored_end(self.stream, 0) if complete else 0
        started = time.monotonic()
        pause = STORED_POLL_FIRST_S
        took_over = False
        while True:
            end = self._read_on()
            if end >= stored:
                return end
            if not took_over and time.monotonic() - started >= _TAKE_OVER_AFTER_S:
                # Longer than a conditional append takes: its process may have died in it. A new owner aborts it.
                took_over = True
                self._settle_held()
                continue  # read again before any timeout: the take-over itself may have taken long
            if time.monotonic() - started >= STORED_WAIT_S:
                fail(ErrorCode._TIMED_OUT, f"commit log {self.stream}: entries stored up to offset {stored} are "
                     f"held back by a transaction open on it (readable up to {end}) for {STORED_WAIT_S:g}s; try "
                     "again", retriable=True)
            time.sleep(pause)
            pause = min(2 * pause, STORED_POLL_MAX_S)

    def take_over(self) -> None:
        """Take over the log's conditional appends now (one this process left open ends: committed, or aborted);
        the catch-ups that follow wait a take-over's wait before they take over again."""
        with self._lock:
            self._taken_over_at = time.monotonic()
        if self._take_over is not None:
            self._take_over()

    def _settle_held(self) -> None:
        """Take over the log's conditional appends, unless this process did less than a take-over's wait ago:
        callers waiting together would each abort what the one before them had let begin."""
        with self._lock:
            now = time.monotonic()
            if self._take_over is None or now - self._taken_over_at < _TAKE_OVER_AFTER_S:
                return
            self._taken_over_at = now  # (checked and set at once: two waiting callers take over once)
        try:
            self._take_over()
        except KafkaException as exc:  # the wait goes on: Kafka's transaction timeout ends it at the latest
            log.warning("commit log %s: taking over its conditional appends failed: %s", self.stream, exc)

    def _read_on(self) -> int:
        """Read every entry readable now; returns the end offset readers see (on Kafka the last stable one)."""
        with self._reading:
            state = self._store.partition_state(self.stream, 0)
            if self._next is None or self._next < state.start_offset:
                self._skip_to(state.start_offset)
            self._take_stored()
            while self._next is not None and self._next < state.end_offset:
                try:
                    entries = list(self._read(self._next, state.end_offset))
                except KafkaException as exc:
                    if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                        raise
                    state = self._store.partition_state(self.stream, 0)  # truncated while reading
                    self._skip_to(max(self._next, state.start_offset))
                    continue
                if not entries:
                    break  # only a transaction marker left (Kafka)
                self._apply_all(entries)
            self._take_stored()  # forget those read back, take those that follow
            return state.end_offset

    def catch_up_to(self, offset: int) -> None:
        """Read at least every entry below ``offset``, an offset known to be stored (a record this process wrote):
        without asking for the log's end first, where the view has read before; else as :meth:`catch_up`.
        Committers share reads (:class:`SharedWork`): one that finds a read on its way waits for it, not for its
        turn, and is served by it if that read (or an entry this process stored, see :meth:`appended`) got there."""
        if not self._reads.share(lambda: self._has_read_to(offset), lambda: self._read_on_to(offset), STORED_WAIT_S):
            self.catch_up(complete=True)

    def _has_read_to(self, offset: int) -> bool:
        read_to = self._next
        return read_to is not None and read_to >= offset

    def _read_on_to(self, offset: int) -> None:
        """Read on from where the view stopped until ``offset``, keeping all that each read gave (entries past
        ``offset`` too: committers that wait for this read find theirs read, where each used to read its own, and
        the store's reader, left where the read ended, seeks nothing). Under ``_reading``."""
        self._take_stored()
        try:
            while self._next is not None and self._next < offset:
                try:
                    entries = self._decoded_through(self._fetched(self._next), offset)
                except KafkaException as exc:
                    if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                        raise
                    break  # truncated under this view: catch_up skips to the new start
                if not entries:
                    break
                self._apply_all(entries)
        finally:
            self._take_stored()

    def appended(self, offset: int, records: list[TransactionMetadataEntry], end_after: int | None = None) -> None:
        """An entry this process stored at ``offset``: taken as read (saves reading it back, a round trip on
        Kafka) once the view has read up to it, now if nobody reads on, else by the read on its way as it ends (or
        by the next). Never waits for a read: the log's writer tells this before it tells the committers waiting
        for their entry. (Left to their own reads, 64 committers of a process read the log ~6 ms a commit.)

        ``end_after``: the log's end right after it, where the store knows nothing else lies in between (its
        Kafka transaction's marker): the view reads on from there (reading a marker took a Kafka read 10-40 ms)."""
        read_on_from = max(offset + 1, end_after or 0)
        with self._lock:
            if self._next == offset and not self._stored and self._reading.acquire(blocking=False):
                try:  # the next entry, and nobody reads on: taken now (a process committing alone, each time)
                    self._apply_locked([(offset, records)], read_on_from)
                finally:
                    self._reading.release()
                return
            if self._next is not None and self._next <= offset < self._next + _KEEP_STORED and \
                    len(self._stored) < _KEEP_STORED:
                self._stored[offset] = (records, read_on_from)
        if not self._reading.acquire(blocking=False):
            return
        try:
            self._take_stored()
        finally:
            self._reading.release()

    def _take_stored(self) -> None:
        """Take the entries this process stored that follow what the view read as read, in order up to the first
        gap (on Kafka a transaction marker may lie between two); forget those read meanwhile. Under ``_reading``."""
        with self._lock:
            if not self._stored:
                return
            taken: list[tuple[int, list[TransactionMetadataEntry]]] = []
            read_to = self._next or 0
            while self._next is not None and read_to in self._stored:
                records, after = self._stored[read_to]
                taken.append((read_to, records))
                read_to = after
            while self._stored and next(iter(self._stored)) < read_to:
                self._stored.popitem(last=False)
        if taken:
            self._apply_all(taken, read_to)

    def _apply_all(self, entries: list[tuple[int, list[TransactionMetadataEntry]]],
                   read_to: int | None = None) -> None:
        """Apply entries read from ``_next`` on, in order, up to ``read_to`` (default: past the last of them);
        keep the latest of them for :meth:`entries`. Under ``_reading``."""
        with self._lock:
            self._apply_locked(entries, read_to)

    def _apply_locked(self, entries: list[tuple[int, list[TransactionMetadataEntry]]],
                      read_to: int | None = None) -> None:
        """:meth:`_apply_all`, under both locks."""
        if self._recent_from is None:
            self._recent_from = self._next
        for offset, records in entries:
            self._apply(offset, records)
            self._recent.append((offset, records))
        self._next = entries[-1][0] + 1 if read_to is None else read_to
        self._advanced_at = time.monotonic()
        while len(self._recent) > _KEEP_RECENT:
            self._recent_from = self._recent.popleft()[0] + 1

    @property
    def advanced_at(self) -> float:
        """When the view last read on (monotonic time): whatever it read was stored before then, so a look made
        after then comes after every write that preceded what the view knows of the log."""
        with self._lock:
            return self._advanced_at

    @property
    def read_to(self) -> int:
        """One past the last entry read (on Kafka the log's end may lie further, past transaction markers)."""
        with self._lock:
            return self._next or 0

    @property
    def merge_needed_to(self) -> int:
        """One past the last entry read whose COMMIT leaves the merge something to do (records staged or carried,
        offsets to commit): where the merge's progress reached it, no transaction committed so far waits to be
        merged, whatever entries follow (BEGINs, ABORTs, COMMITs of one-step commits, which applied themselves)."""
        with self._lock:
            return self._merge_needed_to

    def entries(self, start: int, end: int) -> Iterator[tuple[int, list[TransactionMetadataEntry]]]:
        """Stored entries with offsets in [start, end), decoded: those this view read last from memory, the rest
        from the store."""
        with self._lock:
            recent = list(self._recent) if self._recent_from is not None and self._recent_from <= start else None
            read_to = self._next or 0
        if recent is None or end > read_to:
            return self._read(start, end)
        return iter([(offset, records) for offset, records in recent if start <= offset < end])

    def get(self, txn_id: str) -> LoggedTransaction | None:
        with self._lock:
            return self._txns.get(txn_id) or self._finished.get(txn_id)

    def tells_of(self, entry: int) -> bool:
        """Whether a transaction begun at ``entry`` that :meth:`get` does not know was never begun, as of this view's
        last read: it read the log from there on (or it ends before), and still remembers every transaction decided
        there (else it may have been cut before it was read, or forgotten)."""
        with self._lock:
            return entry >= max(self._unread_below, self._dropped_through + 1)

    def open_transactions(self) -> list[LoggedTransaction]:
        with self._lock:
            return [t for t in self._txns.values() if t.outcome is Outcome.OPEN]

    def live_from(self, merged_to: int) -> int:
        """The first entry still needed: entries below it only hold records of finished, merged transactions.

        Never past what this view read: of entries it did not read, it knows nothing (another process may have
        begun a transaction there). Read the merge's progress first, then :meth:`catch_up`, then ask.
        """
        with self._lock:
            needed = [t.begin_entry for t in self._txns.values()
                      if t.decided_at is None or t.decided_at[0] >= merged_to]
            return min([merged_to, self._next or 0, *needed])

    def finished_and_merged(self, txn_id: str, merged_to: int) -> bool:
        """True when nothing will ever read ``txn_id``'s staged records again: it aborted, or it committed and
        is merged (``merged_to``: the merge's progress). Unknown ids read past are finished and forgotten."""
        entry, _, index = txn_id.partition(".")
        if not (entry.isdigit() and index.isdigit()):
            return False
        with self._lock:
            txn = self._txns.get(txn_id)
            if txn is None:
                return self._next is not None and int(entry) < self._next
            if txn.decided_at is None:
                return False
            return txn.outcome is Outcome.ABORTED or txn.decided_at[0] < merged_to

    def forget_merged(self, merged_to: int) -> None:
        """Drop transactions decided below ``merged_to``: finished and merged, nothing reads them again."""
        with self._lock:
            if merged_to <= self._forgotten_below:
                return  # one-step commits leave the progress behind: most calls would look at the same ones again
            for txn_id, txn in list(self._txns.items()):
                if txn.decided_at is not None and txn.decided_at[0] < merged_to:
                    self._finished[txn_id] = self._txns.pop(txn_id)
            self._forgotten_below = min(merged_to, self._next or 0)  # the view reads on only past _next
            if len(self._finished) > 2 * _REMEMBER_FINISHED:
                # The oldest dropped (dicts keep insertion order), all at once: deleting a dict's first key one at a
                # time leaves holes the next look for the first key walks over (3.2 us a commit, 0.05 now).
                dropped = len(self._finished) - _REMEMBER_FINISHED
                self._dropped_through = max([self._dropped_through, *(t.decided_at[0] for t in itertools.islice(
                    self._finished.values(), dropped) if t.decided_at is not None)])
                self._finished = dict(itertools.islice(self._finished.items(), dropped, None))

    # -- reading -------------------------------------------------------------------------------------------

    def _read(self, start: int, end: int) -> Iterator[tuple[int, list[TransactionMetadataEntry]]]:
        offset = start
        while offset < end:
            fetched = self._fetched(offset)
            for at, value in fetched:
                if at >= end:
                    return
                yield at, self._decoded(at, value)
            if not fetched:
                return
            offset = fetched[-1][0] + 1

    def _fetched(self, offset: int) -> list[tuple[int, bytes]]:
        """The entries one read from ``offset`` gives, not decoded yet ([] at the end)."""
        fetched = []
        for message in self._store.read(self.stream, 0, offset, _READ_BATCH):
            at = message.offset()
            if at is None:
                fail(ErrorCode.CORRUPT_MESSAGE, f"commit log {self.stream}: a record read from offset {offset} has "
                     "no offset")
            fetched.append((at, message.value() or b""))
        return fetched

    def _decoded(self, at: int, value: bytes) -> list[TransactionMetadataEntry]:
        return log_codec.decode(value, f"commit log {self.stream} entry {at}")

    def _decoded_through(self, fetched: list[tuple[int, bytes]],
                         offset: int) -> list[tuple[int, list[TransactionMetadataEntry]]]:
        """``fetched`` decoded: every entry below ``offset`` (raising what one does not decode), and those past it
        up to the first that does not (they decide nothing for the caller; a later read reports it)."""
        decoded = []
        for at, value in fetched:
            try:
                decoded.append((at, self._decoded(at, value)))
            except KafkaException:
                if at < offset:
                    raise
                break
        return decoded

    def _skip_to(self, start: int) -> None:
        """The log was truncated past what this view read: what was cut was finished and merged. Under
        ``_reading``."""
        with self._lock:
            self._txns = {i: t for i, t in self._txns.items() if t.begin_entry >= start}
            self._unread_below = max(self._unread_below, start)
            self._next = start
            self._advanced_at = time.monotonic()
            self._recent.clear()
            self._recent_from = None

    def _apply(self, offset: int, records: list[TransactionMetadataEntry]) -> None:
        for index, record in enumerate(records):
            if record.kind == TransactionMetadataEntry.BEGIN:
                txn_id = f"{offset}.{index}"
                self._txns[txn_id] = LoggedTransaction(txn_id, offset, record.timestamp_ms + record.timeout_ms,
                                                       record.owner, record.owner_epoch)
                continue
            if record.txn_id.startswith(CLAIM_PREFIX):
                self._apply_claim(record)
                continue
            if record.kind == TransactionMetadataEntry.COMMIT and (record.participants or record.inline
                                                                   or record.offsets):
                self._merge_needed_to = offset + 1  # whether it won or not: a merge looks at it either way
            named = _decided_by(record)
            decided = [t for t in map(self._txns.get, named) if t is not None and t.outcome is Outcome.OPEN]
            if len(decided) != len(named):
                continue  # one was never begun, or already decided: the first terminal record won
            for txn in decided:
                txn.outcome = Outcome.COMMITTED if record.kind == TransactionMetadataEntry.COMMIT else Outcome.ABORTED
                txn.decided_at = (offset, index)
                txn.reason = record.reason


    def _apply_claim(self, record: TransactionMetadataEntry) -> None:
        """A CLAIM: its partitions noted on its transaction, while that is open (else it changes nothing)."""
        txn = self._txns.get(record.txn_id.removeprefix(CLAIM_PREFIX))
        if txn is not None and txn.outcome is Outcome.OPEN:
            txn.claims |= {(group.group, o.stream, o.partition) for group in record.offsets for o in group.offsets}

    def claiming(self, consumer_group: str, partitions: Iterable[PartitionKey] | None) -> list[str]:
        """The open transactions (as read so far) that claimed offsets of any of ``partitions`` of
        ``consumer_group`` (None: of any of its partitions)."""
        with self._lock:
            if partitions is None:
                return [t.txn_id for t in self._txns.values()
                        if t.outcome is Outcome.OPEN and any(group == consumer_group for group, _, _ in t.claims)]
            wanted = {(consumer_group, stream, partition) for stream, partition in partitions}
            return [t.txn_id for t in self._txns.values() if t.outcome is Outcome.OPEN and t.claims & wanted]


def _decided_by(record: TransactionMetadataEntry) -> list[str]:
    """The transactions a terminal record decides: its own, and those a COMMIT joins (all or none)."""
    if not record.participants:  # an ABORT, a one-step or an inline COMMIT: only its own
        return [record.txn_id]
    joined = {p.txn_id for p in record.participants if p.txn_id and p.txn_id != record.txn_id}
    return [record.txn_id, *sorted(joined)]

