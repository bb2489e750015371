"""A standalone worker on the embedded store: file lines reach a stream and a file exactly once across restarts,
a source task's records and offsets commit in one transaction, a zombie task cannot commit, and failed records
go to the dead letter queue with Kafka Connect's context headers."""

from __future__ import annotations

import json
from pathlib import Path

from onceflow import txn
from onceflow.connect.app import ConnectWorker
from onceflow.connector import Producer
from onceflow.connector.store import open_store, read_stream
from tests.connect import sample_plugins
from tests.connect.conftest import client, lines_of, wait_until
from tests.connect.sample_plugins import COLLECTED, COLLECTING, COUNTING, PLUGINS, SPLIT


def values(store_url: str, topic: str) -> list[str]:
    store = open_store(store_url)
    try:
        if topic not in store.list_streams():
            return []
        return [(m.value() or b"").decode() for m in read_stream(store, topic)]
    finally:
        store.close()


def file_connectors(tmp_path: Path) -> list[dict[str, str]]:
    return [{"name": "src", "connector.class": "FileStreamSource", "file": str(tmp_path / "in.txt"),
             "topic": "lines"},
            {"name": "snk", "connector.class": "FileStreamSink", "file": str(tmp_path / "out.txt"), "topics": "lines"}]


def test_file_lines_reach_a_stream_and_a_file_once_across_a_restart(worker_props: dict[str, str],
                                                                      tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    first = [f"line {i}" for i in range(300)]
    source.write_text("".join(f"{line}\n" for line in first) + "half a li")  # the last line is still being written
    with ConnectWorker(worker_props) as worker:
        for props in file_connectors(tmp_path):
            worker.add_connector(props)
        wait_until(lambda: len(lines_of(tmp_path / "out.txt")) == 300, "the first lines in the sink's file")
        assert client(worker).request("GET", "/connectors/src/offsets") == (200, {"offsets": [
            {"partition": {"filename": str(source)}, "offset": {"position": len("".join(f"{x}\n" for x in first))}}]})
    with open(source, "a") as more:
        more.write("ne\n" + "".join(f"more {i}\n" for i in range(200)))
    expected = [*first, "half a line", *(f"more {i}" for i in range(200))]
    with ConnectWorker(worker_props) as worker:
        for props in file_connectors(tmp_path):
            worker.add_connector(props)
        wait_until(lambda: len(lines_of(tmp_path / "out.txt")) >= len(expected), "every line in the sink's file")
    assert lines_of(tmp_path / "out.txt") == expected
    assert values(worker_props["store.url"], "lines") == expected


def test_aborted_source_transactions_leave_neither_records_nor_offsets(worker_props: dict[str, str]) -> None:
    """transaction.boundary=connector: every third batch of ten is aborted by the task."""
    with ConnectWorker(worker_props, PLUGINS) as worker:
        worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "100",
                              "batch": "10", "abort.every": "3", "transaction.boundary": "connector"})
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/count/offsets")[1]["offsets"] == [
            {"partition": {"source": "counter"}, "offset": {"next": 100}}], "the last batch's offset")
    aborted = {str(n) for batch in (2, 5, 8) for n in range(batch * 10, batch * 10 + 10)}
    assert values(worker_props["store.url"], "numbers") == [str(n) for n in range(100) if str(n) not in aborted]


def test_a_graceful_stop_aborts_the_transaction_the_connector_left_open(worker_props: dict[str, str]) -> None:
    """transaction.boundary=connector: the task ends two batches' transactions, then leaves the third open (its
    producer stages batches of 5 records, so the transaction is in the log, not only in memory)."""
    with ConnectWorker({**worker_props, "producer.batch.num.messages": "5"}, PLUGINS) as worker:
        worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "30",
                              "batch": "10", "boundaries": "2", "transaction.boundary": "connector"})
        wait_until(lambda: len(values(worker_props["store.url"], "numbers")) == 20, "the first two batches")
        group = txn.open_group({"store.url": worker_props["store.url"],
                                "transaction.group": worker.config["transaction.group"]})
        wait_until(lambda: len(group.open_transactions()) == 1, "the third batch in its transaction")
    assert group.open_transactions() == []  # not left to its timeout, holding the log's truncation back
    group.close()
    assert values(worker_props["store.url"], "numbers") == [str(n) for n in range(20)]


def test_without_exactly_once_offsets_follow_the_records_into_the_offsets_file(worker_props: dict[str, str],
                                                                               tmp_path: Path) -> None:
    props = {**worker_props, "exactly.once.source.support": "disabled",
             "offset.storage.file.filename": str(tmp_path / "offsets.json")}
    with ConnectWorker(props, PLUGINS) as worker:
        worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "50"})
        wait_until(lambda: "50" in (tmp_path / "offsets.json").read_text() if (tmp_path / "offsets.json").exists()
                   else False, "the offsets file")
    assert json.loads((tmp_path / "offsets.json").read_text()) == {"count": {'{"source":"counter"}': {"next": 50}}}
    assert values(worker_props["store.url"], "numbers") == [str(n) for n in range(50)]


def test_a_zombie_source_task_is_fenced_and_nothing_is_lost_or_duplicated(worker_props: dict[str, str]) -> None:
    """Two workers run the same connector: the second one's task fences the first, whose commits then fail."""
    connector = {"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "1000000", "batch": "1"}
    zombie = ConnectWorker(worker_props, PLUGINS)
    try:
        zombie.add_connector(connector)
        wait_until(lambda: len(values(worker_props["store.url"], "numbers")) > 20, "the first worker's records")
        with ConnectWorker(worker_props, PLUGINS) as successor:
            successor.add_connector(connector)
            status = client(zombie)
            wait_until(lambda: status.request("GET", "/connectors/count/tasks/0/status")[1]["state"] == "FAILED",
                       "the zombie task failing")
            trace = status.request("GET", "/connectors/count/tasks/0/status")[1]["trace"]
            assert "PRODUCER_FENCED" in trace
            seen = len(values(worker_props["store.url"], "numbers"))
            wait_until(lambda: len(values(worker_props["store.url"], "numbers")) > seen + 20, "the successor going on")
    finally:
        zombie.close()
    numbers = values(worker_props["store.url"], "numbers")
    assert numbers == [str(n) for n in range(len(numbers))]


def test_failed_records_reach_the_dead_letter_queue_with_context_headers(worker_props: dict[str, str]) -> None:
    with ConnectWorker(worker_props, PLUGINS) as worker:
        worker.store.create_stream("in", 1)
        producer = Producer({"store.url": worker_props["store.url"]})
        for value in (b'{"n": 1}', b"not json", b'{"n": 3}'):
            producer.produce("in", value)
        producer.close()
        worker.add_connector({"name": "dlq-sink", "connector.class": COLLECTING, "topics": "in",
                              "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                              "value.converter.schemas.enable": "false", "errors.tolerance": "all",
                              "errors.deadletterqueue.topic.name": "dead",
                              "errors.deadletterqueue.context.headers.enable": "true"})
        wait_until(lambda: len(COLLECTED.get("dlq-sink", [])) == 2, "the good records handed to the sink")
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/dlq-sink/offsets")[1]["offsets"] != [], "a commit")
        assert [r.value for r in COLLECTED["dlq-sink"]] == [{"n": 1}, {"n": 3}]
        dead = list(read_stream(worker.store, "dead"))
    assert [m.value() for m in dead] == [b"not json"]
    headers = {name: value.decode() for name, value in dead[0].headers() or [] if value is not None}
    assert {k: headers[k] for k in ("__connect.errors.topic", "__connect.errors.partition", "__connect.errors.offset",
                                    "__connect.errors.connector.name", "__connect.errors.task.id",
                                    "__connect.errors.stage")} == {
        "__connect.errors.topic": "in", "__connect.errors.partition": "0", "__connect.errors.offset": "1",
        "__connect.errors.connector.name": "dlq-sink", "__connect.errors.task.id": "0",
        "__connect.errors.stage": "VALUE_CONVERTER"}
    assert "JsonConverter" in headers["__connect.errors.class.name"]
    assert "Converting byte[] to Kafka Connect data failed" in headers["__connect.errors.exception.message"]


def test_without_exactly_once_records_do_not_wait_for_the_offset_flush(worker_props: dict[str, str]) -> None:
    props = {**worker_props, "exactly.once.source.support": "disabled", "offset.flush.interval.ms": "600000"}
    with ConnectWorker(props, PLUGINS) as worker:
        worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "15",
                              "batch": "15"})
        wait_until(lambda: len(values(worker_props["store.url"], "numbers")) == 15, "the records", timeout_s=20)
        assert client(worker).request("GET", "/connectors/count/offsets") == (200, {"offsets": []})


def test_retriable_failures_are_retried_within_errors_retry_timeout(worker_props: dict[str, str]) -> None:
    connector = {"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "20", "fail.polls": "2"}
    with ConnectWorker(worker_props, PLUGINS) as worker:
        worker.add_connector({**connector, "errors.retry.timeout": "30000", "errors.retry.delay.max.ms": "100"})
        wait_until(lambda: len(values(worker_props["store.url"], "numbers")) == 20, "the records after two failures")
        worker.add_connector({**connector, "name": "impatient", "topic": "other"})  # errors.retry.timeout=0
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/impatient/tasks/0/status")[1]["state"] == "FAILED",
                   "the task without retries failing")
        assert "the counter is unreachable" in rest.request("GET", "/connectors/impatient/tasks/0/status")[1]["trace"]
        assert rest.request("GET", "/connectors/count/tasks/0/status")[1]["state"] == "RUNNING"


def ten_records_in(worker: ConnectWorker) -> None:
    """Records "0".."9" in a new one-partition stream "in"."""
    worker.store.create_stream("in", 1)
    producer = Producer({"store.url": worker.config.store_url})
    for n in range(10):
        producer.produce("in", f"{n}".encode())
    producer.close()


def test_a_rewind_a_sink_task_asks_for_in_open_applies_before_any_record(worker_props: dict[str, str]) -> None:
    """A sink keeping its offsets outside the store (a database) tells the worker where to resume in open():
    the records from there come again although nothing new arrives."""
    with ConnectWorker(worker_props, PLUGINS) as worker:
        ten_records_in(worker)
        sink = {"name": "resuming", "connector.class": COLLECTING, "topics": "in",
                "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
        worker.add_connector(sink)
        wait_until(lambda: len(COLLECTED.get("resuming", [])) == 10, "every record once")
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/resuming/offsets")[1]["offsets"] != [], "a commit")
        COLLECTED["resuming"] = []
        assert rest.request("PUT", "/connectors/resuming/config", {**sink, "rewind.to": "6"})[0] == 200
        wait_until(lambda: len(COLLECTED["resuming"]) == 4, "the records from offset 6 again")
        assert [(r.kafka_offset, r.value) for r in COLLECTED["resuming"]] == [(6, "6"), (7, "7"), (8, "8"), (9, "9")]


def test_a_sink_batch_retried_after_a_retriable_failure_sends_its_records_once(worker_props: dict[str, str]) -> None:
    """A put() that sent records and then failed retriably is retried with the same batch: the first attempt's
    sends stayed in the batch's transaction and were committed next to the retry's, every record twice."""
    with ConnectWorker(worker_props, PLUGINS) as worker:
        ten_records_in(worker)
        worker.add_connector({"name": "forwarding", "connector.class": COLLECTING, "topics": "in", "send.to": "out",
                              "fail.puts": "1", "errors.retry.timeout": "30000", "errors.retry.delay.max.ms": "100",
                              "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                              "value.converter": "org.apache.kafka.connect.storage.StringConverter"})
        wait_until(lambda: len(values(worker_props["store.url"], "out")) >= 10, "the batch sent after its retry")
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/forwarding/offsets")[1]["offsets"] != [], "a commit")
        assert values(worker_props["store.url"], "out") == [f"{n}" for n in range(10)]


def test_a_task_that_outlives_its_reconfiguration_is_fenced_and_publishes_nothing_twice(
        worker_props: dict[str, str]) -> None:
    """tasks.max 2 -> 1: the task that had source partition "b" did not stop within the graceful timeout, and
    the new task 0 resumed "b" from its committed offset. The old task, left running, then committed its poll of
    "b" too: those records twice."""
    sample_plugins.HELD.clear(), sample_plugins.RELEASE_HELD.clear(), sample_plugins.HELD_ENDED.clear()
    connector = {"connector.class": SPLIT, "tasks.max": "2", "count": "10", "hold": "true",
                 "value.converter": "org.apache.kafka.connect.storage.StringConverter"}
    with ConnectWorker({**worker_props, "task.shutdown.graceful.timeout.ms": "100"}, PLUGINS) as worker:
        rest = client(worker)
        try:
            assert rest.request("POST", "/connectors", {"name": "split", "config": connector})[0] == 201
            assert sample_plugins.HELD.wait(60), "task 1 never reached its held poll"
            assert rest.request("PUT", "/connectors/split/config", {**connector, "tasks.max": "1"})[0] == 200
            wait_until(lambda: len(values(worker_props["store.url"], "split")) >= 20, "task 0 copying a and b")
        finally:
            sample_plugins.RELEASE_HELD.set()
        assert sample_plugins.HELD_ENDED.wait(60), "the old task 1 never ended"
    assert sorted(values(worker_props["store.url"], "split")) == sorted(f"{p}{n}" for p in "ab" for n in range(10))
