"""``DatabaseSink``: writes records into tables of an SQLite or PostgreSQL database, exactly once.

Keys follow Confluent's JDBC sink where they apply: ``connection.url`` (``sqlite:///path.db``,
``postgresql://user:password@host:port/database``), ``insert.mode`` (insert or upsert), ``pk.mode`` (none,
kafka, record_key, record_value), ``pk.fields``, ``table.name.format`` (``${topic}``), ``auto.create`` and
``auto.evolve`` (add the columns a record brings).

Exactly-once without two-phase commit: each ``put`` is one database transaction that writes the rows *and* the
next offset of every partition they came from, into ``__onceflow_connect_offsets`` of the same database; a record
below its partition's stored offset was written already and is skipped. So a batch delivered again after a
crash (between the database's commit and the consumer group's) is written once. Values must be structs (dicts);
anything else goes to the connector's error handling (``errors.tolerance``, the dead letter queue).
"""

from __future__ import annotations

import abc
import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, Importance, Type, non_empty, one_of
from onceflow.connect.connector import SameConfig, SinkConnector
from onceflow.connect.records import Schema, SinkRecord
from onceflow.connect.task import SinkTask
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException, fail
from onceflow.connector.topic import TopicPartition

OFFSETS_TABLE = "__onceflow_connect_offsets"
KAFKA_PK = ("__connect_topic", "__connect_partition", "__connect_offset")


def _definition() -> ConfigDef:
    return (ConfigDef()
            .define("connection.url", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                    documentation="sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
            .define("insert.mode", Type.STRING, "insert", one_of("insert", "upsert"), Importance.HIGH,
                    "insert: INSERT each record; upsert: insert or update by the primary key")
            .define("pk.mode", Type.STRING, "none", one_of("none", "kafka", "record_key", "record_value"),
                    Importance.HIGH, "Where the primary key comes from: nothing, the record's topic/partition/offset, "
                    "its key, or fields of its value")
            .define("pk.fields", Type.LIST, "", None, Importance.MEDIUM, "The key's or value's primary key fields "
                    "(record_key with a primitive key: the column's name)")
            .define("table.name.format", Type.STRING, "${topic}", non_empty, Importance.MEDIUM,
                    "The table of each record; ${topic} is its topic")
            .define("auto.create", Type.BOOLEAN, "true", None, Importance.MEDIUM, "Create a missing table from the "
                    "first record's fields")
            .define("auto.evolve", Type.BOOLEAN, "true", None, Importance.MEDIUM, "Add a column for a field the "
                    "table does not have"))


class Dialect(abc.ABC):
    """What differs between databases: connecting, placeholders, column types, listing a table's columns."""

    placeholder = "?"

    @abc.abstractmethod
    def connect(self) -> Any: ...

    @abc.abstractmethod
    def begin(self, db: Any) -> None: ...

    def commit(self, db: Any) -> None:
        db.commit()

    def rollback(self, db: Any) -> None:
        db.rollback()

    @abc.abstractmethod
    def columns(self, db: Any, table: str) -> list[str] | None:
        """The table's columns, or None if there is no such table."""

    @abc.abstractmethod
    def column_type(self, schema: Schema | None, value: Any) -> str: ...

    errors: tuple[type[Exception], ...] = ()
    """The driver's errors, which :meth:`translate` turns into KafkaException."""

    def translate(self, exc: Exception) -> KafkaException:
        """A database error as onceflow's: a refused row is INVALID_RECORD; an unreachable or busy database is
        retriable (``errors.retry.timeout`` applies); anything else fails the task."""
        name = type(exc).__name__
        if "Integrity" in name or "Violation" in name:
            return KafkaException(KafkaError(ErrorCode.INVALID_RECORD, f"the database refused a row: {exc}"))
        if "Operational" in name:
            return KafkaException(KafkaError(ErrorCode._TRANSPORT, f"the database failed: {exc}", retriable=True))
        return KafkaException(KafkaError(ErrorCode._FAIL, f"the database failed: {name}: {exc}"))


class SqliteDialect(Dialect):
    errors = (sqlite3.Error,)

    def __init__(self, path: str) -> None:
        self._path = path

    def connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode = WAL")
        return db

    def begin(self, db: Any) -> None:
        db.execute("BEGIN IMMEDIATE")

    def commit(self, db: Any) -> None:
        db.execute("COMMIT")

    def rollback(self, db: Any) -> None:
        db.execute("ROLLBACK")

    def columns(self, db: Any, table: str) -> list[str] | None:
        rows = db.execute(f"PRAGMA table_info({quote(table)})").fetchall()
        return [r[1] for r in rows] or None

    def column_type(self, schema: Schema | None, value: Any) -> str:
        kind = schema.type if schema is not None else _kind_of(value)
        return {"boolean": "INTEGER", "float32": "REAL", "float64": "REAL", "bytes": "BLOB", "string": "TEXT",
                "json": "TEXT"}.get(kind, "INTEGER")


class PostgresDialect(Dialect):
    placeholder = "%s"

    def __init__(self, url: str) -> None:
        self._url = url

    def connect(self) -> Any:
        try:
            import psycopg
        except ImportError:
            fail(ErrorCode.INVALID_CONFIG, "connection.url postgresql://: install psycopg (pip install "
                 "'onceflow[postgres]')")
        self.errors = (psycopg.Error,)
        return psycopg.connect(self._url, autocommit=False)

    def begin(self, db: Any) -> None:
        """psycopg opens a transaction with the first statement."""

    def columns(self, db: Any, table: str) -> list[str] | None:
        rows = db.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                          "ORDER BY ordinal_position", (table,)).fetchall()
        return [r[0] for r in rows] or None

    def column_type(self, schema: Schema | None, value: Any) -> str:
        kind = schema.type if schema is not None else _kind_of(value)
        return {"boolean": "BOOLEAN", "float32": "REAL", "float64": "DOUBLE PRECISION", "bytes": "BYTEA",
                "string": "TEXT", "json": "TEXT", "int8": "SMALLINT", "int16": "SMALLINT",
                "int32": "INTEGER"}.get(kind, "BIGINT")


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, bytes):
        return "bytes"
    return "json" if isinstance(value, dict | list) else "string"


def dialect_for(url: str) -> Dialect:
    scheme, sep, rest = url.partition("://")
    if sep and scheme == "sqlite" and rest:
        return SqliteDialect(rest)
    if sep and scheme in ("postgresql", "postgres"):
        return PostgresDialect(url)
    fail(ErrorCode.INVALID_CONFIG, f"connection.url {url!r}: expected sqlite:///PATH or postgresql://...")


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


class DatabaseSinkConnector(SameConfig, SinkConnector):
    """Up to ``tasks.max`` tasks writing ``topics`` into tables; see the module docstring."""

    def config(self) -> ConfigDef:
        return _definition()

    def start(self, props: Mapping[str, str]) -> None:
        super().start(props)
        values = _definition().parse(props)
        dialect_for(values["connection.url"])
        if values["insert.mode"] == "upsert" and values["pk.mode"] == "none":
            fail(ErrorCode.INVALID_CONFIG, "insert.mode=upsert needs a primary key: set pk.mode")

    def task_class(self) -> type[DatabaseSinkTask]:
        return DatabaseSinkTask


class DatabaseSinkTask(SinkTask):
    """Writes each batch and its offsets in one database transaction."""

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        self._settings = _definition().parse(props)
        self._connector = props["name"]
        self._dialect = dialect_for(self._settings["connection.url"])
        self._db = self._dialect.connect()
        self._columns: dict[str, list[str]] = {}
        with self._transaction() as db:
            db.execute(f"CREATE TABLE IF NOT EXISTS {quote(OFFSETS_TABLE)} (connector TEXT NOT NULL, topic TEXT NOT "
                       "NULL, kafka_partition INTEGER NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (connector, "
                       "topic, kafka_partition))")

    def put(self, records: Sequence[SinkRecord]) -> None:
        if not records:
            return
        with self._transaction() as db:
            stored = self._stored_offsets(db, {(r.topic, r.kafka_partition or 0) for r in records})
            reached: dict[tuple[str, int], int] = {}
            for record in records:
                where = (record.topic, record.kafka_partition or 0)
                if record.kafka_offset < stored.get(where, 0):
                    continue  # written by an earlier transaction: delivered again after a crash
                reached[where] = record.kafka_offset + 1
                self._write(db, record)
            self._store_offsets(db, reached)

    def pre_commit(self, current_offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The database holds the offsets; the group's copy (committed next) only shows progress."""
        return dict(current_offsets)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """A database transaction: committed when the block ends, rolled back if it raises (then the column cache
        is dropped: the transaction's DDL was undone too)."""
        try:
            self._dialect.begin(self._db)
            try:
                yield self._db
            except BaseException:
                self._columns.clear()
                self._dialect.rollback(self._db)
                raise
            self._dialect.commit(self._db)
        except self._dialect.errors as exc:
            raise self._dialect.translate(exc) from exc

    def _stored_offsets(self, db: Any, partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        p = self._dialect.placeholder
        rows = db.execute(f"SELECT topic, kafka_partition, next_offset FROM {quote(OFFSETS_TABLE)} WHERE connector = "
                          f"{p}", (self._connector,)).fetchall()
        return {(t, int(k)): int(o) for t, k, o in rows if (t, int(k)) in partitions}

    def _store_offsets(self, db: Any, reached: Mapping[tuple[str, int], int]) -> None:
        p = self._dialect.placeholder
        for (topic, partition), offset in reached.items():
            db.execute(f"INSERT INTO {quote(OFFSETS_TABLE)} (connector, topic, kafka_partition, next_offset) VALUES "
                       f"({p}, {p}, {p}, {p}) ON CONFLICT (connector, topic, kafka_partition) DO UPDATE SET "
                       "next_offset = excluded.next_offset", (self._connector, topic, partition, offset))

    def _write(self, db: Any, record: SinkRecord) -> None:
        row, keys = self._row(record)
        table = self._settings["table.name.format"].replace("${topic}", record.topic)
        self._ensure_table(db, table, row, keys, record.value_schema)
        names = ", ".join(quote(c) for c in row)
        marks = ", ".join(self._dialect.placeholder for _ in row)
        sql = f"INSERT INTO {quote(table)} ({names}) VALUES ({marks})"
        if self._settings["insert.mode"] == "upsert":
            updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in row if c not in keys)
            sql += f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO " + (
                f"UPDATE SET {updates}" if updates else "NOTHING")
        db.execute(sql, [_column_value(v) for v in row.values()])

    def _row(self, record: SinkRecord) -> tuple[dict[str, Any], list[str]]:
        """The record's columns and which of them are the primary key."""
        if not isinstance(record.value, dict):
            fail(ErrorCode.INVALID_RECORD, f"DatabaseSink: the value of {record.topic}[{record.kafka_partition}]@"
                 f"{record.kafka_offset} is a {type(record.value).__name__}, not a struct")
        row, mode, fields = dict(record.value), self._settings["pk.mode"], self._settings["pk.fields"]
        if mode == "kafka":
            row.update(zip(KAFKA_PK, (record.topic, record.kafka_partition, record.kafka_offset), strict=True))
            return row, list(KAFKA_PK)
        if mode == "record_key":
            key = record.key if isinstance(record.key, dict) else {(fields or ["id"])[0]: record.key}
            chosen = fields or list(key)
            row.update({k: key.get(k) for k in chosen})
            return row, chosen
        if mode == "record_value":
            missing = [f for f in fields if f not in row]
            if not fields or missing:
                fail(ErrorCode.INVALID_RECORD, f"DatabaseSink: pk.mode=record_value needs pk.fields present in the "
                     f"value (missing {missing or 'pk.fields'})")
            return row, list(fields)
        return row, []

    def _ensure_table(self, db: Any, table: str, row: Mapping[str, Any], keys: list[str],
                      schema: Schema | None) -> None:
        columns = self._columns.get(table) or self._dialect.columns(db, table)
        types = {f.name: f.schema for f in schema.fields} if schema is not None else {}
        if columns is None:
            if not self._settings["auto.create"]:
                fail(ErrorCode.UNKNOWN_TOPIC_OR_PART, f"DatabaseSink: table {table!r} does not exist (auto.create "
                     "is false)")
            defs = [f"{quote(c)} {self._dialect.column_type(types.get(c), v)}" for c, v in row.items()]
            primary = f", PRIMARY KEY ({', '.join(quote(k) for k in keys)})" if keys else ""
            db.execute(f"CREATE TABLE {quote(table)} ({', '.join(defs)}{primary})")
            columns = list(row)
        for column in [c for c in row if c not in columns]:
            if not self._settings["auto.evolve"]:
                fail(ErrorCode.INVALID_RECORD, f"DatabaseSink: table {table!r} has no column {column!r} (auto.evolve "
                     "is false)")
            db.execute(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(column)} "
                       f"{self._dialect.column_type(types.get(column), row[column])}")
            columns.append(column)
        self._columns[table] = columns

    def stop(self) -> None:
        self._db.close()


def _column_value(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict | list) else value
