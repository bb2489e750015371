"""The database sink writes records into SQLite and PostgreSQL tables exactly once: rows and the offsets they
reach commit in one database transaction, so a batch delivered again (after a crash between the database's commit
and the consumer group's) writes nothing twice; upserts by primary key; a worker restart repeats no row."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from onceflow.connect.app import ConnectWorker
from onceflow.connect.database import OFFSETS_TABLE, DatabaseSinkTask
from onceflow.connect.records import SinkRecord
from onceflow.connector import ErrorCode, KafkaException, Producer
from tests.connect import postgres
from tests.connect.conftest import client, wait_until


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    try:
        with postgres.postgres_server() as url:
            yield url
    except RuntimeError as exc:
        pytest.skip(f"no PostgreSQL server could be started: {exc}")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[[str], list[tuple[Any, ...]]]]:
    """(connection.url, a query function) of a fresh database on each kind."""
    if request.param == "sqlite":
        path = tmp_path / "target.db"

        def sqlite_query(sql: str) -> list[tuple[Any, ...]]:
            with sqlite3.connect(path) as db:
                try:
                    return [tuple(r) for r in db.execute(sql).fetchall()]
                except sqlite3.OperationalError as exc:  # no such table (yet): no rows
                    if "no such table" not in str(exc):
                        raise
                    return []
        return f"sqlite://{path}", sqlite_query
    import psycopg

    server = request.getfixturevalue("postgres_url")
    name = f"t{abs(hash(request.node.name)) % 10**8}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    url = server.rsplit("/", 1)[0] + f"/{name}"

    def postgres_query(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(url) as db:
            try:
                return [tuple(r) for r in db.execute(sql).fetchall()]
            except psycopg.errors.UndefinedTable:  # no such table (yet): no rows
                return []
    return url, postgres_query


def records(topic: str, start: int, end: int) -> list[SinkRecord]:
    return [SinkRecord(topic=topic, kafka_partition=0, kafka_offset=n, value={"id": n % 5, "n": n, "tag": f"t{n}"})
            for n in range(start, end)]


class _Context:
    """What a task needs of its context here: its config."""

    def configs(self) -> dict[str, str]:
        return {}


def task(url: str, **props: str) -> DatabaseSinkTask:
    sink = DatabaseSinkTask()
    sink.initialize(_Context())  # type: ignore[arg-type]
    sink.start({"name": "db", "connection.url": url, **props})
    return sink


def test_a_batch_delivered_again_is_written_once(database: tuple[str, Callable[[str], list[tuple[Any, ...]]]]) -> None:
    url, query = database
    sink = task(url)
    sink.put(records("orders", 0, 10))
    sink.stop()
    again = task(url)  # a new task after a crash: the group's offsets lag behind the database's
    again.put(records("orders", 5, 15))
    again.stop()
    assert sorted(r[0] for r in query('SELECT n FROM "orders"')) == list(range(15))
    assert query(f'SELECT connector, topic, kafka_partition, next_offset FROM "{OFFSETS_TABLE}"') == [
        ("db", "orders", 0, 15)]


def test_upsert_by_value_fields_keeps_the_last_row_per_key(
        database: tuple[str, Callable[[str], list[tuple[Any, ...]]]]) -> None:
    url, query = database
    sink = task(url, **{"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id",
                        "table.name.format": "latest_${topic}"})
    sink.put(records("orders", 0, 12))
    sink.put([SinkRecord(topic="orders", kafka_partition=0, kafka_offset=12, value={"id": 1, "n": 12, "tag": "t12",
                                                                                    "extra": True})])
    sink.stop()
    rows = sorted(query('SELECT id, n, tag FROM "latest_orders"'))
    assert rows == [(0, 10, "t10"), (1, 12, "t12"), (2, 7, "t7"), (3, 8, "t8"), (4, 9, "t9")]
    assert len(query('SELECT extra FROM "latest_orders"')) == 5  # the column a later record brought


def test_a_failed_batch_writes_neither_rows_nor_offsets(
        database: tuple[str, Callable[[str], list[tuple[Any, ...]]]]) -> None:
    url, query = database
    sink = task(url, **{"pk.mode": "record_value", "pk.fields": "id"})
    sink.put(records("orders", 0, 3))
    with pytest.raises(KafkaException) as refused:
        sink.put(records("orders", 3, 6))  # id 0..2 again: the primary key refuses the batch
    assert refused.value.code == ErrorCode.INVALID_RECORD
    sink.stop()
    assert sorted(r[0] for r in query('SELECT n FROM "orders"')) == [0, 1, 2]
    assert query(f'SELECT next_offset FROM "{OFFSETS_TABLE}"') == [(3,)]


def test_a_connector_copies_a_stream_into_a_table_across_a_restart(
        worker_props: dict[str, str], database: tuple[str, Callable[[str], list[tuple[Any, ...]]]]) -> None:
    url, query = database
    config = {"connector.class": "DatabaseSink", "topics": "events", "connection.url": url,
              "value.converter": "org.apache.kafka.connect.json.JsonConverter",
              "value.converter.schemas.enable": "false"}

    def produce(start: int, end: int) -> None:
        producer = Producer({"store.url": worker_props["store.url"]})
        for n in range(start, end):
            producer.produce("events", json.dumps({"n": n, "name": f"e{n}"}).encode())
        producer.close()

    with ConnectWorker(worker_props) as worker:
        worker.store.create_stream("events", 1)
        produce(0, 50)
        assert client(worker).request("PUT", "/connectors/db/config", config)[0] == 201
        wait_until(lambda: len(query('SELECT n FROM "events"')) == 50, "the first rows")
    produce(50, 80)
    with ConnectWorker(worker_props) as worker:
        client(worker).request("PUT", "/connectors/db/config", config)
        wait_until(lambda: len(query('SELECT n FROM "events"')) >= 80, "every row")
    assert sorted(r[0] for r in query('SELECT n FROM "events"')) == list(range(80))
