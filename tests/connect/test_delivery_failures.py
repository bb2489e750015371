"""Connect's own writes learn of a record the store refused (a deleted stream): the producer reports such a failure
only through the delivery callback, so a write without one would lose it silently. Source offsets raise naming
the connector, an at-least-once source task fails before storing offsets past lost records (or, under
errors.tolerance=all, logs and skips them), a status that cannot be written is logged."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.connect.app import ConnectWorker
from onceflow.connect.offsets import StreamOffsets, canonical
from onceflow.connect.status import State, Status, StatusBoard, TaskId
from onceflow.connect.status_log import StatusLog
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Store, TopicSettings, open_store
from tests.connect.conftest import client, wait_until

PARTITION = canonical({"filename": "in.txt"})


@pytest.fixture
def offsets(store: Store, store_url: str) -> Iterator[StreamOffsets]:
    kept = StreamOffsets(store, "offsets", 1, TopicSettings(), {"store.url": store_url})
    yield kept
    kept.close()


def test_source_offsets_to_a_deleted_offsets_stream_raise_naming_the_connector(store: Store,
                                                                               offsets: StreamOffsets) -> None:
    offsets.write("src", {PARTITION: {"position": 6}})
    assert offsets.offsets("src") == {PARTITION: {"position": 6}}
    store.delete_stream("offsets")
    with pytest.raises(KafkaException) as refused:
        offsets.write("src", {PARTITION: {"position": 12}})
    assert refused.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PART
    assert "connector src: source offsets: 1 record(s) to offsets failed delivery" in str(refused.value)


def test_a_status_that_cannot_be_written_is_logged_with_its_key(store: Store, store_url: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    statuses = StatusLog(store, "statuses", 1, TopicSettings(), StatusBoard(), {"store.url": store_url})
    try:
        statuses.put_task(TaskId("src", 0), Status(State.RUNNING, "w1", "1.0"))
        store.delete_stream("statuses")
        with caplog.at_level(logging.ERROR, logger="onceflow.connect.status_log"):
            statuses.put_task(TaskId("src", 0), Status(State.FAILED, "w1", "1.0", "boom"))
    finally:
        statuses.close()
    assert "Failed to write status update" in caplog.text
    assert "status status-task-src-0: 1 record(s) to statuses failed delivery: " in caplog.text
    assert statuses.board.task(TaskId("src", 0)) == Status(State.FAILED, "w1", "1.0", "boom")  # this worker knows


def file_source(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"name": "src", "connector.class": "FileStreamSource", "file": str(tmp_path / "in.txt"), "topic": "lines",
            **extra}


def at_least_once(worker_props: dict[str, str]) -> dict[str, str]:
    return {**worker_props, "exactly.once.source.support": "disabled"}


def stored_position(worker: ConnectWorker) -> object:
    offsets = client(worker).request("GET", "/connectors/src/offsets")[1]["offsets"]
    return offsets[0]["offset"]["position"] if offsets else None


def delete_topic(store_url: str, topic: str) -> None:
    store = open_store(store_url)
    try:
        store.delete_stream(topic)
    finally:
        store.close()


def test_an_at_least_once_source_task_whose_records_are_refused_fails_and_keeps_its_offsets(
        worker_props: dict[str, str], tmp_path: Path) -> None:
    """Before, the task went on RUNNING and stored the offsets of records it had lost: a restart skipped them."""
    source = tmp_path / "in.txt"
    source.write_text("one\ntwo\n")
    with ConnectWorker(at_least_once(worker_props)) as worker:
        worker.add_connector(file_source(tmp_path))
        wait_until(lambda: stored_position(worker) == 8, "the first lines' offsets")
        delete_topic(worker_props["store.url"], "lines")
        with open(source, "a") as more:
            more.write("three\n")
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/src/tasks/0/status")[1]["state"] == "FAILED",
                   "the task failing")
        trace = rest.request("GET", "/connectors/src/tasks/0/status")[1]["trace"]
        assert "UNKNOWN_TOPIC_OR_PART" in trace
        assert "source task src-0 (the source offsets since its last commit are not stored): 1 record(s) to lines " \
               "failed delivery" in trace
        assert stored_position(worker) == 8


def test_under_errors_tolerance_all_refused_records_are_logged_and_skipped(
        worker_props: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "in.txt"
    source.write_text("one\ntwo\n")
    with ConnectWorker(at_least_once(worker_props)) as worker, \
            caplog.at_level(logging.ERROR, logger="onceflow.connect.error_handling"):
        worker.add_connector(file_source(tmp_path, **{"errors.tolerance": "all", "errors.log.enable": "true"}))
        wait_until(lambda: stored_position(worker) == 8, "the first lines' offsets")
        delete_topic(worker_props["store.url"], "lines")
        with open(source, "a") as more:
            more.write("three\n")
        wait_until(lambda: stored_position(worker) == 14, "the offsets past the skipped line")
        assert client(worker).request("GET", "/connectors/src/tasks/0/status")[1]["state"] == "RUNNING"
    assert "error at stage KAFKA_PRODUCE (Producer), record skipped (errors.tolerance=all): " \
           "UNKNOWN_TOPIC_OR_PART" in caplog.text
