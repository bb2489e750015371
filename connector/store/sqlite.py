"""The embedded store: SQLite in WAL mode, one row per record batch, safe for many processes on one machine.

Every write is one ``BEGIN IMMEDIATE`` transaction, so a process killed at any point leaves a whole batch
or none of it (the failpoints between the steps let the crash tests prove it). Each thread and each process
gets its own connection; a connection is never used across a fork.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import sys
import threading
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from onceflow.connector.config import StoreConfig
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.failpoints import failpoint
from onceflow.connector.message import Message
from onceflow.connector.store import batch_codec
from onceflow.connector.store.contract import (
    AppendCallback,
    AppendResult,
    Batch,
    Condition,
    EpochDescription,
    GroupDescription,
    GroupSettings,
    OffsetCommit,
    PartitionKey,
    PartitionState,
    RecordFields,
    StreamDescription,
    TopicSettings,
    check_atomic_batches,
    check_open,
    check_partition_count,
    first_epoch,
)
from onceflow.connector.store.sqlite_group import (
    SqliteGroupMember,
    check_owner,
    committed_in,
    delete_in,
    describe_in,
    group_names,
    write_offsets,
)

log = logging.getLogger(__name__)

_RETRY_BACKOFF_S = 0.05
_TIMESTAMPS_AT = batch_codec._HEADER.size + 1  # SQLite's substr() counts from 1
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# One look per appended batch: its writer's current epoch (for fencing), the partition (no row: there is no such
# partition) and the writer's state in it (NULLs where it never wrote there).
_PARTITION_AND_STATE = (
    "SELECT (SELECT epoch FROM producers WHERE producer_id = ?), p.stream_id, p.end_offset, p.last_sequence, "
    "p.sealed, ps.epoch, ps.last_sequence, ps.last_base_sequence, ps.last_base_offset "
    "FROM partitions p JOIN streams s USING (stream_id) "
    "LEFT JOIN producer_state ps ON ps.stream_id = p.stream_id AND ps.partition = p.partition "
    "AND ps.producer_id = ? WHERE s.name = ? AND p.partition = ?")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS streams (
    stream_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS epochs (
    stream_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    first_partition INTEGER NOT NULL,
    partition_count INTEGER NOT NULL,
    sealed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream_id, epoch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partitions (
    stream_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    start_offset INTEGER NOT NULL DEFAULT 0,
    end_offset INTEGER NOT NULL DEFAULT 0,
    last_sequence INTEGER NOT NULL DEFAULT -1,
    sealed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
    stream_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    base_offset INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS batches_by_last_offset ON batches (stream_id, partition, last_offset);
CREATE TABLE IF NOT EXISTS producers (
    producer_id INTEGER PRIMARY KEY AUTOINCREMENT,
    writer_id TEXT UNIQUE,
    epoch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS producer_state (
    stream_id INTEGER NOT NULL,
    partition INTEGER NOT NULL,
    producer_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    last_sequence INTEGER NOT NULL,
    last_base_sequence INTEGER NOT NULL,
    last_base_offset INTEGER NOT NULL,
    PRIMARY KEY (stream_id, partition, producer_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_members (
    group_id TEXT NOT NULL,
    member_id TEXT NOT NULL,
    topics TEXT NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    session_timeout_ms INTEGER NOT NULL,
    PRIMARY KEY (group_id, member_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_owners (
    group_id TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    member_id TEXT NOT NULL,
    PRIMARY KEY (group_id, stream, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, stream, partition)
) WITHOUT ROWID;
"""


class SqliteStore:
    """A store in one SQLite database file; see the module docstring for the guarantees."""

    def __init__(self, path: str, config: StoreConfig) -> None:
        self._path = os.path.abspath(path)
        self._config = config
        self._local = threading.local()
        with self._write() as db:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)  # CREATE ... IF NOT EXISTS: processes may race here

    @property
    def url(self) -> str:
        return f"sqlite://{self._path}"

    @property
    def atomic_conditions(self) -> int:
        return sys.maxsize  # every condition is checked inside the one database transaction

    @property
    def writer_sessions_outlive_close(self) -> bool:
        return False  # an anonymous writer's rows are deleted when it closes (SqliteWriter.close)

    @property
    def unusable(self) -> KafkaError | None:
        return None  # a damaged database fails the calls that read the damage, not the store

    # -- connections and transactions ----------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        """This thread's connection in this process (reopened after a fork, never shared across one)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            try:
                db = sqlite3.connect(self._path, isolation_level=None, timeout=self._config.busy_timeout_ms / 1000)
                db.execute(f"PRAGMA busy_timeout = {self._config.busy_timeout_ms}")
                db.execute("PRAGMA journal_mode = WAL")
                db.execute(f"PRAGMA synchronous = {self._config.sqlite_synchronous.upper()}")
            except sqlite3.Error as exc:
                fail(ErrorCode._FS, f"cannot open store {self.url}: {exc}", fatal=True)
            local.db, local.pid = db, os.getpid()
        db_conn: sqlite3.Connection = local.db
        return db_conn

    @contextlib.contextmanager
    def _write(self, joined: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything inside commits together or not at all. ``joined``: a part of the
        transaction of a writer's group (begun here if it is not yet), undone alone if it fails, durable when the
        group commits (:meth:`SqliteWriter.grouped`)."""
        db = self._db()
        with self._translate_errors():
            if joined and not db.in_transaction:
                db.execute("BEGIN IMMEDIATE")
            db.execute("SAVEPOINT part" if joined else "BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("RELEASE part" if joined else "COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite rolled back itself on some errors (a full disk): keep their cause
                    db.execute("ROLLBACK TO part" if joined else "ROLLBACK")
                    if joined:
                        db.execute("RELEASE part")
                raise

    def _commit_group(self) -> None:
        """Commit a writer group's transaction (:meth:`SqliteWriter.grouped`); rolled back if that fails."""
        db = self._db()
        with self._translate_errors():
            if not db.in_transaction:
                fail(ErrorCode._FS, f"store {self.url}: SQLite rolled the group's appends back (a full disk?)",
                     retriable=True)
            try:
                failpoint("sqlite.append.before_commit")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        failpoint("sqlite.append.after_commit")

    @contextlib.contextmanager
    def _translate_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            fail(ErrorCode._FS, f"store {self.url}: {exc}", retriable=busy, fatal=not busy)
        except sqlite3.DatabaseError as exc:
            fail(ErrorCode._FS, f"store {self.url} is damaged: {exc}", fatal=True)

    def _read(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        with self._translate_errors():
            return self._db().execute(sql, args).fetchall()

    # -- streams ----------------------------------------------------------------------------------------

    def create_stream(self, name: str, partitions: int, settings: TopicSettings | None = None,
                      validate_only: bool = False) -> StreamDescription:
        if not isinstance(name, str) or not _TOPIC_NAME.match(name):
            fail(ErrorCode.TOPIC_EXCEPTION, f"invalid topic name {name!r}: 1-249 of [A-Za-z0-9._-]")
        check_partition_count(name, partitions)
        _check_settings(name, settings or TopicSettings())
        with self._write() as db:
            if db.execute("SELECT 1 FROM streams WHERE name = ?", (name,)).fetchone():
                fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            if validate_only:
                return first_epoch(name, partitions)
            stream_id = db.execute("INSERT INTO streams (name) VALUES (?)", (name,)).lastrowid
            _open_epoch(db, stream_id, 0, 0, partitions)
        return self.describe_stream(name)

    def delete_stream(self, name: str) -> None:
        with self._write() as db:
            stream_id = _stream_id(db, name)
            for table in ("batches", "partitions", "epochs", "producer_state", "streams"):
                db.execute(f"DELETE FROM {table} WHERE stream_id = ?", (stream_id,))
            for table in ("group_offsets", "group_owners"):
                db.execute(f"DELETE FROM {table} WHERE stream = ?", (name,))

    def list_streams(self) -> list[str]:
        return [str(row[0]) for row in self._read("SELECT name FROM streams ORDER BY name")]

    def describe_stream(self, name: str) -> StreamDescription:
        rows = self._read(
            "SELECT e.epoch, e.first_partition, e.partition_count, e.sealed FROM epochs e "
            "JOIN streams s USING (stream_id) WHERE s.name = ? ORDER BY e.epoch",
            (name,),
        )
        if not rows:
            fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"unknown topic {name!r}")
        epochs = tuple(
            EpochDescription(int(e), tuple(range(int(first), int(first) + int(count))), bool(sealed))  # type: ignore[call-overload]
            for e, first, count, sealed in rows
        )
        return StreamDescription(name, epochs)

    def scale_stream(self, name: str, partitions: int) -> StreamDescription:
        check_partition_count(name, partitions)
        with self._write() as db:
            stream_id = _stream_id(db, name)
            epoch, first, count = db.execute(
                "SELECT epoch, first_partition, partition_count FROM epochs WHERE stream_id = ? "
                "ORDER BY epoch DESC LIMIT 1",
                (stream_id,),
            ).fetchone()
            db.execute("UPDATE epochs SET sealed = 1 WHERE stream_id = ? AND epoch = ?", (stream_id, epoch))
            db.execute("UPDATE partitions SET sealed = 1 WHERE stream_id = ? AND epoch = ?", (stream_id, epoch))
            failpoint("sqlite.scale.after_seal")
            _open_epoch(db, stream_id, epoch + 1, first + count, partitions)
        return self.describe_stream(name)

    # -- reads --------------------------------------------------------------------------------------------

    def _lookup(self, stream: str, partition: int, columns: str) -> tuple[int, ...]:
        with self._translate_errors():
            return _partition_row(self._db(), stream, partition, columns)

    def partition_state(self, stream: str, partition: int) -> PartitionState:
        start, end, last_sequence, sealed = self._lookup(stream, partition,
                                                         "start_offset, end_offset, last_sequence, sealed")
        return PartitionState(start, end, bool(sealed), lambda: last_sequence)

    def stored_end(self, stream: str, partition: int) -> int:
        return self.partition_state(stream, partition).end_offset  # every stored record is readable at once

    def prefetch(self, positions: Mapping[PartitionKey, int]) -> None:
        """Nothing to start: a read is one query of the file."""

    def read(self, stream: str, partition: int, offset: int, max_records: int) -> list[Message]:
        stream_id, start, end = self._lookup(stream, partition, "stream_id, start_offset, end_offset")
        if not start <= offset <= end:
            fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{stream}[{partition}]: offset {offset} is outside "
                 f"[{start}, {end}]")
        if offset == end:
            return []
        out: list[Message] = []
        with self._translate_errors():
            cursor = self._db().execute(
                "SELECT base_offset, data FROM batches WHERE stream_id = ? AND partition = ? AND last_offset >= ? "
                "ORDER BY last_offset",
                (stream_id, partition, offset),
            )
            for base_offset, data in cursor:
                if not out and base_offset > offset:  # truncated between the two queries
                    fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{stream}[{partition}]: offset {offset} was truncated")
                out += batch_codec.decode(data, stream, partition, base_offset, offset)
                if len(out) >= max_records:
                    break
            cursor.close()
        return out

    def truncate_before(self, stream: str, partition: int, offset: int) -> int:
        with self._write() as db:
            stream_id, start, end = _partition_row(db, stream, partition, "stream_id, start_offset, end_offset")
            if offset > end:
                fail(ErrorCode.OFFSET_OUT_OF_RANGE, f"{stream}[{partition}]: cannot truncate before {offset}, "
                     f"past the end offset {end}")
            if offset <= start:
                return int(start)
            db.execute("DELETE FROM batches WHERE stream_id = ? AND partition = ? AND last_offset < ?",
                       (stream_id, partition, offset))
            db.execute("UPDATE partitions SET start_offset = ? WHERE stream_id = ? AND partition = ?",
                       (offset, stream_id, partition))
        return offset

    # -- writes ---------------------------------------------------------------------------------------------

    def open_writer(self, writer_id: str | None = None, delivery_timeout_ms: int | None = None) -> SqliteWriter:
        with self._write() as db:
            if writer_id is None:
                producer_id = db.execute("INSERT INTO producers (writer_id, epoch) VALUES (NULL, 0)").lastrowid
                epoch = 0
            else:
                row = db.execute("SELECT producer_id, epoch FROM producers WHERE writer_id = ?",
                                 (writer_id,)).fetchone()
                if row is None:
                    producer_id, epoch = db.execute(
                        "INSERT INTO producers (writer_id, epoch) VALUES (?, 0)", (writer_id,)).lastrowid, 0
                else:
                    producer_id, epoch = row[0], row[1] + 1
                    db.execute("UPDATE producers SET epoch = ? WHERE producer_id = ?", (epoch, producer_id))
                failpoint("sqlite.writer.after_epoch_bump")
        return SqliteWriter(self, writer_id, int(producer_id or 0), epoch, delivery_timeout_ms)

    def _append(self, writer: SqliteWriter, batches: Sequence[Batch], base_sequences: Sequence[int],
                conditions: Sequence[Condition], offsets: Sequence[OffsetCommit] = ()) -> list[AppendResult]:
        """Append batches (and commit offsets) in one database transaction: all land or none."""
        blobs = [batch_codec.stored_parts(b.records, self._config.message_max_bytes, f"{b.stream}[{b.partition}]")
                 for b in batches]
        joined = writer.in_group
        with self._noting_a_lost_group(writer, joined), self._write(joined) as db:
            if not batches and writer.writer_id is not None:  # (else each batch's look checks its fencing)
                self._check_not_fenced(db, writer, "offsets")
            results = [self._append_in(db, writer, *args) for args in zip(batches, blobs, base_sequences, conditions,
                                                                          strict=True)]
            if results and all(r.duplicate for r in results):
                return results  # a retry of an atomic append that landed: its offsets landed with it
            for commit in offsets:
                commit.check(committed_in(db, commit.group, commit.expected or {}))
                if commit.member_id is not None:
                    check_owner(db, commit.group, commit.member_id, commit.offsets)
                write_offsets(db, commit.group, commit.offsets)
            if not joined:  # else where the group commits
                failpoint("sqlite.append.before_commit")
        if not joined:
            failpoint("sqlite.append.after_commit")
        return results

    @contextlib.contextmanager
    def _noting_a_lost_group(self, writer: SqliteWriter, joined: bool) -> Iterator[None]:
        """A failed append of a writer's group after which no transaction is open: SQLite undid the group's whole
        transaction (a full disk), the appends before it too, so the group must not commit what follows as if
        they were in it (:meth:`SqliteWriter.grouped` appends them again, alone). A failure with none open before
        (the group's first BEGIN was busy) undid nothing of it."""
        open_before = joined and self._db().in_transaction
        try:
            yield
        except BaseException:
            if open_before and not self._db().in_transaction:
                writer.group_lost = True
            raise

    @staticmethod
    def _check_not_fenced(db: sqlite3.Connection, writer: SqliteWriter, where: str) -> None:
        """A look of its own at ``writer``'s fencing (an append's batches look at it with their partitions)."""
        row = db.execute("SELECT epoch FROM producers WHERE producer_id = ?", (writer.producer_id,)).fetchone()
        _check_epoch(where, writer, row[0] if row else None)

    @staticmethod
    def _append_in(db: sqlite3.Connection, writer: SqliteWriter, batch: Batch, parts: Sequence[tuple[bytes, int]],
                   base_sequence: int, condition: Condition) -> AppendResult:
        """One batch's checks and writes inside the caller's database transaction."""
        stream, partition, records, _ = batch
        where = f"{stream}[{partition}]"
        count = len(records)
        row = db.execute(_PARTITION_AND_STATE, (writer.producer_id, writer.producer_id, stream, partition)).fetchone()
        if writer.writer_id is not None:  # a fenced writer is told so first (an anonymous one's epoch never moves)
            if row is None:
                SqliteStore._check_not_fenced(db, writer, where)
            else:
                _check_epoch(where, writer, row[0])
        if row is None:
            _unknown_partition(stream, partition)
        stream_id, end, last_sequence, sealed = row[1:5]
        state = row[5:] if row[5] is not None else None
        if state is not None and state[0] == writer.epoch:
            if base_sequence == state[2]:
                return AppendResult(int(state[3]), count, duplicate=True)
            _check_next_sequence(where, writer, base_sequence, int(state[1]))
        else:
            _check_next_sequence(where, writer, base_sequence, -1)
        if sealed:
            fail(ErrorCode.PARTITION_SEALED, f"{where} is sealed: its epoch was scaled; append to the "
                 "stream's current epoch")
        condition.check(where, end, lambda: last_sequence)
        failpoint("sqlite.append.after_checks")
        base = end
        for blob, part_count in parts:  # one row per stored blob, at consecutive offsets
            db.execute("INSERT INTO batches (stream_id, partition, base_offset, last_offset, data) VALUES (?,?,?,?,?)",
                       (stream_id, partition, base, base + part_count - 1, blob))
            base += part_count
        failpoint("sqlite.append.after_batch_insert")
        sequence = condition.new_sequence
        db.execute("UPDATE partitions SET end_offset = ?, last_sequence = ? WHERE stream_id = ? AND partition = ?",
                   (end + count, last_sequence if sequence is None else sequence, stream_id, partition))
        db.execute(
            "INSERT OR REPLACE INTO producer_state (stream_id, partition, producer_id, epoch, last_sequence, "
            "last_base_sequence, last_base_offset) VALUES (?,?,?,?,?,?,?)",
            (stream_id, partition, writer.producer_id, writer.epoch, base_sequence + count - 1, base_sequence, end),
        )
        return AppendResult(int(end), count, end_after=end + count)

    def _forget_producer(self, producer_id: int, partitions: Iterable[PartitionKey]) -> None:
        """Delete an anonymous producer's state: its sequence numbers in ``partitions`` and its id."""
        with self._write() as db:
            for stream, partition in partitions:
                db.execute("DELETE FROM producer_state WHERE stream_id = (SELECT stream_id FROM streams WHERE name "
                           "= ?) AND partition = ? AND producer_id = ?", (stream, partition, producer_id))
            db.execute("DELETE FROM producers WHERE producer_id = ? AND writer_id IS NULL", (producer_id,))

    def _last_sequence(self, writer: SqliteWriter, stream: str, partition: int) -> int | None:
        """The last producer sequence number ``writer``'s epoch wrote to a partition, if any."""
        rows = self._read(
            "SELECT ps.last_sequence FROM producer_state ps JOIN streams s USING (stream_id) "
            "WHERE s.name = ? AND ps.partition = ? AND ps.producer_id = ? AND ps.epoch = ?",
            (stream, partition, writer.producer_id, writer.epoch))
        return int(rows[0][0]) if rows else None  # type: ignore[call-overload]

    # -- consumer groups --------------------------------------------------------------------------------------

    def join_group(self, group: str, settings: GroupSettings) -> SqliteGroupMember:
        return SqliteGroupMember(self, group, settings)

    def check_member(self, group: str, member_id: str, partitions: Iterable[PartitionKey]) -> None:
        with self._translate_errors():
            check_owner(self._db(), group, member_id, partitions)

    def commit_offsets(self, group: str, offsets: Mapping[PartitionKey, int]) -> None:
        with self._write() as db:
            for stream, partition in offsets:  # UNKNOWN_TOPIC_OR_PART for one that does not exist, as on Kafka
                _partition_row(db, stream, partition, "partition")
            write_offsets(db, group, offsets)

    def committed_offsets(self, group: str, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        with self._translate_errors():
            return committed_in(self._db(), group, partitions)

    def list_groups(self) -> list[str]:
        with self._translate_errors():
            return group_names(self._db())

    def describe_group(self, group: str) -> GroupDescription:
        with self._translate_errors():
            return describe_in(self._db(), group)

    def delete_group(self, group: str) -> None:
        with self._write() as db:
            delete_in(db, group)

    # -- reads by timestamp -------------------------------------------------------------------------------------

    def offset_for_time(self, stream: str, partition: int, timestamp: int) -> int | None:
        """A scan of the partition's batches in offset order, reading only their timestamp columns, that stops at
        the first batch holding a match: batches keep no timestamp index (Kafka's is sparse, per segment)."""
        for offset, times in self._timestamps(stream, partition):
            if max(times) >= timestamp:
                return offset + next(i for i, t in enumerate(times) if t >= timestamp)
        return None

    def max_timestamp(self, stream: str, partition: int) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for offset, times in self._timestamps(stream, partition):
            top = max(times)
            if best is None or top > best[1]:
                best = (offset + times.index(top), top)
        return best

    def brokers(self) -> dict[int, tuple[str, int]]:
        return {0: (self._path, 0)}

    def replicas(self, stream: str) -> dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]]:
        return {p: (0, (0,), (0,)) for p in self.describe_stream(stream).partitions}

    def _timestamps(self, stream: str, partition: int) -> Iterator[tuple[int, array[int]]]:
        """(first offset, timestamps from it) of each stored batch from the partition's start on, in offset order,
        one batch at a time: the timestamps are read straight from the stored blob (see batch_codec's layout), the
        keys and values never leave SQLite."""
        stream_id, start = self._lookup(stream, partition, "stream_id, start_offset")
        with self._translate_errors():
            cursor = self._db().execute(
                f"SELECT base_offset, substr(data, {_TIMESTAMPS_AT}, 8 * (last_offset - base_offset + 1)) "
                "FROM batches WHERE stream_id = ? AND partition = ? AND last_offset >= ? ORDER BY last_offset",
                (stream_id, partition, start))
            try:
                for base_offset, raw in cursor:
                    times = array("q")
                    times.frombytes(raw)
                    if sys.byteorder == "big":
                        times.byteswap()
                    skip = max(start - base_offset, 0)  # records below a truncation inside this batch
                    yield base_offset + skip, times[skip:]
            finally:
                cursor.close()

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None and self._local.pid == os.getpid():
            db.close()
        self._local = threading.local()


class SqliteWriter:
    """An appending session with its own producer id, epoch and per-partition sequence numbers."""

    def __init__(self, store: SqliteStore, writer_id: str | None, producer_id: int, epoch: int,
                 delivery_timeout_ms: int | None = None) -> None:
        self._store = store
        self._writer_id = writer_id
        self.producer_id = producer_id
        self._epoch = epoch
        self._next_sequence: dict[PartitionKey, int] = {}
        self._failed: Sequence[Batch] | None = None  # the batches of the last append, if it raised
        self._group: list[_Grouped] | None = None  # inside grouped(): its appends, durable when it commits
        self.group_lost = False  # SQLite undid the group's transaction part-way (see SqliteStore._append)
        self._retry_for_s = (delivery_timeout_ms or 120_000) / 1000  # a group's appends after its write failed
        self._closed = False

    @property
    def in_group(self) -> bool:
        """True inside :meth:`grouped`: appends join the group's transaction."""
        return self._group is not None

    @property
    def writer_id(self) -> str | None:
        return self._writer_id

    @property
    def epoch(self) -> int:
        return self._epoch

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
        condition = Condition(expected_offset, expected_sequence, sequence)
        return self._append([Batch(stream, partition, records)], [condition], ())[0]

    def append_async(self, stream: str, partition: int, records: Sequence[RecordFields],
                     callback: AppendCallback) -> None:
        batch = Batch(stream, partition, records)
        result = self._append([batch], [Condition()], ())[0]  # written here: its errors raise here
        if self._group is None:
            callback(result, None)
        else:  # durable when the group commits; the sequence numbers it took end where the next one's begin
            base_sequence = self._next_sequence[(stream, partition)] - len(records)
            self._group.append(_Grouped(batch, base_sequence, result, callback))

    @contextlib.contextmanager
    def grouped(self) -> Iterator[None]:
        """Appends made inside share one database transaction (one fsync); see the contract."""
        if self._group is not None:  # an outer group commits
            yield
            return
        self._group, self.group_lost = [], False
        try:
            yield
        except BaseException as exc:
            group, self._group = self._group, None
            if self._store._db().in_transaction:
                self._store._db().execute("ROLLBACK")
            self._fail_all(group, KafkaError(ErrorCode._FS, f"not written: the group's appends were undone ({exc})",
                                             retriable=True))
            raise
        group, self._group = self._group, None
        if self.group_lost:  # its appends before the failure were undone with it: each again, alone
            self.group_lost = False
            if self._store._db().in_transaction:  # (what came after the failure, in a transaction of its own)
                self._store._db().execute("ROLLBACK")
            self._append_alone(group)
            return
        if not group:  # every append in it failed, and was undone
            if self._store._db().in_transaction:
                self._store._db().execute("ROLLBACK")
            return
        try:
            self._store._commit_group()
        except KafkaException as exc:
            if not exc.error.retriable():
                self._fail_all(group, exc.error)
                return
            self._append_alone(group)
            return
        for grouped in group:
            grouped.callback(grouped.result, None)

    def _append_alone(self, group: Sequence[_Grouped]) -> None:
        """After a group's write failed: each of its appends again, alone, under the sequence numbers it had, so
        one that landed after all is found written (never written twice) and the others land now or fail alone."""
        deadline = time.monotonic() + self._retry_for_s
        failed = False
        for grouped in group:
            key = (grouped.batch.stream, grouped.batch.partition)
            while True:
                try:
                    result = self._store._append(self, [grouped.batch], [grouped.base_sequence], [Condition()])[0]
                except KafkaException as exc:
                    if exc.error.retriable() and time.monotonic() < deadline:
                        time.sleep(_RETRY_BACKOFF_S)
                        continue
                    failed = True
                    grouped.callback(None, exc.error)
                    break
                self._next_sequence[key] = max(self._next_sequence.get(key, 0), grouped.base_sequence +
                                               len(grouped.batch.records))
                grouped.callback(result, None)
                break
        if failed:
            self._forget_sequences(group)

    def _fail_all(self, group: Sequence[_Grouped], error: KafkaError) -> None:
        self._forget_sequences(group)
        for grouped in group:
            grouped.callback(None, error)

    def _forget_sequences(self, group: Sequence[_Grouped]) -> None:
        """The group's sequence numbers may not have been written: take them from the store again."""
        keys = list({(g.batch.stream, g.batch.partition) for g in group})
        for key in keys:
            self._next_sequence.pop(key, None)
        self._resync(keys)

    def poll(self, timeout: float = 0) -> None:
        """Nothing is ever in flight: appends complete before they return."""

    def flush(self, timeout: float) -> None:
        """Nothing is ever in flight: appends complete before they return."""

    def take_over(self, stream: str, partition: int) -> None:
        pass  # every append is one database transaction: none is left unfinished

    def check_not_fenced(self, since: float | None = None) -> None:
        if self._writer_id is not None:  # a look at the database, always fresh: ``since`` saves nothing
            with self._store._translate_errors():
                self._store._check_not_fenced(self._store._db(), self, f"writer.id {self._writer_id!r}")

    def append_atomic(self, batches: Sequence[Batch], offsets: Sequence[OffsetCommit] = ()) -> list[AppendResult]:
        return self._append(batches, [Condition(expected_offset=b.expected_offset) for b in batches], offsets)

    def _append(self, batches: Sequence[Batch], conditions: Sequence[Condition],
                offsets: Sequence[OffsetCommit]) -> list[AppendResult]:
        check_open(self._closed, self._store.url)
        check_atomic_batches(batches, offsets)
        keys = [(b.stream, b.partition) for b in batches]
        if self._failed is not None and not _same_batches(self._failed, batches):
            self._resync([(b.stream, b.partition) for b in self._failed])
        base_sequences = [self._next_sequence.get(key, 0) for key in keys]
        try:
            results = self._store._append(self, batches, base_sequences, conditions, offsets)
        except KafkaException:
            self._failed = batches
            raise
        self._failed = None
        # Only landed batches consume sequence numbers, so a retry of the same batches reuses them (and finds
        # them written if they landed after all).
        for key, base, batch in zip(keys, base_sequences, batches, strict=True):
            self._next_sequence[key] = base + len(batch.records)
        return results

    def _resync(self, keys: Sequence[PartitionKey]) -> None:
        """After a failed append, before different records: take the sequence numbers from what the store holds,
        so records that landed although the append reported an error are not mistaken for a retry of them."""
        for stream, partition in keys:
            last = self._store._last_sequence(self, stream, partition)
            if last is not None:
                self._next_sequence[(stream, partition)] = last + 1

    def close(self) -> None:
        """Forget this session's sequence numbers, and an anonymous session's producer state in the store: once
        it is closed nothing can retry its appends and its producer id is never given again, and a store that
        runs for months would otherwise keep a row for every session (each Producer, each Spark task) and
        partition it wrote. A failure to forget is logged: closing never fails for it."""
        self._closed = True
        written = {*self._next_sequence, *((b.stream, b.partition) for b in self._failed or ())}
        self._next_sequence.clear()
        if self._writer_id is None and self.producer_id and self._group is None:
            try:
                self._store._forget_producer(self.producer_id, written)
            except KafkaException as exc:
                log.warning("store %s: the producer state of closed writer %d stays behind: %s", self._store.url,
                            self.producer_id, exc)
            self.producer_id = 0  # closing again does nothing


class _Grouped(NamedTuple):
    """An append made in a writer's group: written, not yet durable."""

    batch: Batch
    base_sequence: int
    result: AppendResult
    callback: AppendCallback


def _same_batches(a: Sequence[Batch], b: Sequence[Batch]) -> bool:
    """The same append again (a retry): the same partitions with the very same record sequences."""
    return len(a) == len(b) and all(x.stream == y.stream and x.partition == y.partition and x.records is y.records
                                    for x, y in zip(a, b, strict=True))


def _check_next_sequence(where: str, writer: SqliteWriter, base_sequence: int, last_sequence: int) -> None:
    if base_sequence <= last_sequence:
        fail(ErrorCode.DUPLICATE_SEQUENCE_NUMBER, f"{where}: producer {writer.producer_id} sequence "
             f"{base_sequence} was already written (last {last_sequence})")
    if base_sequence != last_sequence + 1:
        fail(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, f"{where}: producer {writer.producer_id} sent sequence "
             f"{base_sequence}, expected {last_sequence + 1}")


def _check_epoch(where: str, writer: SqliteWriter, current_epoch: int | None) -> None:
    """PRODUCER_FENCED unless ``writer``'s epoch is still its producer's (a new instance of its writer.id bumps it)."""
    if current_epoch != writer.epoch:
        fail(ErrorCode.PRODUCER_FENCED, f"{where}: writer.id {writer.writer_id!r} epoch {writer.epoch} "
             f"was fenced by epoch {current_epoch}", fatal=True)


def _unknown_partition(stream: str, partition: int) -> None:
    fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"unknown topic or partition {stream}[{partition}]")



def _check_settings(name: str, settings: TopicSettings) -> None:
    """The embedded store keeps one copy of every record until truncate_before: other settings are refused."""
    if settings.replication_factor not in (-1, 1):
        fail(ErrorCode.INVALID_REPLICATION_FACTOR, f"topic {name!r}: replication factor "
             f"{settings.replication_factor}: the embedded store keeps one copy (-1 or 1)")
    if settings.config:
        fail(ErrorCode.INVALID_CONFIG, f"topic {name!r}: topic configs {sorted(settings.config)} apply on kafka:// "
             "only; the embedded store keeps every record until delete_records")

def _stream_id(db: sqlite3.Connection, name: str) -> int:
    row = db.execute("SELECT stream_id FROM streams WHERE name = ?", (name,)).fetchone()
    if row is None:
        fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"unknown topic {name!r}")
    return int(row[0])


def _partition_row(db: sqlite3.Connection, stream: str, partition: int, columns: str) -> tuple[int, ...]:
    row = db.execute(
        f"SELECT {', '.join('p.' + c.strip() for c in columns.split(','))} FROM partitions p "
        "JOIN streams s USING (stream_id) WHERE s.name = ? AND p.partition = ?",
        (stream, partition),
    ).fetchone()
    if row is None:
        _unknown_partition(stream, partition)
    return tuple(row)


def _open_epoch(db: sqlite3.Connection, stream_id: int | None, epoch: int, first: int, count: int) -> None:
    db.execute("INSERT INTO epochs (stream_id, epoch, first_partition, partition_count) VALUES (?,?,?,?)",
               (stream_id, epoch, first, count))
    db.executemany("INSERT INTO partitions (stream_id, partition, epoch) VALUES (?,?,?)",
                   [(stream_id, p, epoch) for p in range(first, first + count)])
