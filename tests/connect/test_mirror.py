"""The mirror connectors against the real Apache Kafka broker: a Kafka topic copied into streams and streams copied
into a Kafka topic, every record once, in order per partition, with keys and headers, across restarts, offset
resets and a SIGKILLed worker (checked with the history checker)."""

from __future__ import annotations

import signal
import sys
import time
import uuid
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.connect.app import ConnectWorker
from onceflow.connect.mirror import MirrorSourceConnector
from onceflow.connector.producer import Producer
from onceflow.connector.store import open_store, read_stream
from onceflow.integration import checker, history
from onceflow.integration.brokers import Broker
from tests.conftest import announcement
from tests.connect.conftest import client, wait_until
from tests.connect.test_crash import FAST_SESSIONS, check_stream, count, start, wait_for

pytestmark = pytest.mark.kafka

BYTES = "org.apache.kafka.connect.converters.ByteArrayConverter"
SOURCE, SINK = "onceflow.connect.mirror.MirrorSourceConnector", "onceflow.connect.mirror.MirrorSinkConnector"
PartitionRecords = dict[int, list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce_to_kafka(bootstrap: str, topic: str, partitions: int, per_partition: int, first: int = 0) -> None:
    """``per_partition`` records into each partition, value ``<topic>-<partition>-<i>``, with a key and a header, in
    that order: idempotent, since a plain producer's retried batch can land after a later one (most likely why a CI
    run's target had a partition's last record first: the mirror copies the source as it is)."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(first, first + per_partition):
        for partition in range(partitions):
            producer.produce(topic, f"{topic}-{partition}-{i:05d}".encode(), f"k{i}".encode(), partition=partition,
                             headers=[("n", str(i).encode())])
    assert producer.flush(30) == 0


def consume_all(bootstrap: str, topic: str) -> list[ck.Message]:
    """Everything committed in ``topic`` (read_committed), in order per partition."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                            "enable.auto.commit": False, "isolation.level": "read_committed",
                            "enable.partition.eof": True})
    try:
        metadata = consumer.list_topics(timeout=30).topics.get(topic)  # all topics: naming one may create it
        if metadata is None or metadata.error is not None:
            return []
        consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in metadata.partitions])
        out: list[ck.Message] = []
        ended: set[int] = set()
        deadline = time.monotonic() + 30
        while len(ended) < len(metadata.partitions) and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                error = message.error()
                if error is not None:
                    assert error.code() == ck.KafkaError._PARTITION_EOF, error
                    ended.add(message.partition())
                else:
                    out.append(message)
        return out
    finally:
        consumer.close()


def read_kafka(bootstrap: str, topic: str) -> PartitionRecords:
    out: PartitionRecords = {}
    for m in consume_all(bootstrap, topic):
        out.setdefault(m.partition(), []).append((m.key(), m.value(), list(m.headers() or [])))
    return out


def read_onceflow(store_url: str, stream: str) -> PartitionRecords:
    store = open_store(store_url)
    try:
        out: PartitionRecords = {}
        if stream in store.list_streams():
            for m in read_stream(store, stream):
                out.setdefault(m.partition() or 0, []).append((m.key(), m.value(), list(m.headers() or [])))
        return out
    finally:
        store.close()


class KafkaProbe:
    """Cheap looks at a topic while a worker writes it: one consumer for all looks, watermarks only, so the test acts
    within ~0.1 s of the first record (reading the topic through takes a second, time enough to finish the work)."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("probe")})

    def anything_in(self, topic: str) -> bool:
        """Whether ``topic`` exists and holds a record, committed or not."""
        metadata = self._consumer.list_topics(timeout=10).topics.get(topic)  # all topics: naming one may create it
        if metadata is None or metadata.error is not None:
            return False
        return any(self._consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)[1] > 0
                   for p in metadata.partitions)

    def __enter__(self) -> KafkaProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()


def total(records: PartitionRecords) -> int:
    return sum(len(r) for r in records.values())


def expected(topic: str, partitions: int, per_partition: int) -> PartitionRecords:
    return {p: [(f"k{i}".encode(), f"{topic}-{p}-{i:05d}".encode(), [("n", str(i).encode())])
                for i in range(per_partition)] for p in range(partitions)}


@pytest.fixture
def bootstrap(kafka_broker: Broker) -> str:
    if kafka_broker.kind != "apache-kafka":
        pytest.skip("the mirror's exactly-once needs Kafka's transactions as Apache Kafka keeps them")
    return kafka_broker.bootstrap


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.slow)])
def any_store(request: pytest.FixtureRequest, worker_props: dict[str, str], bootstrap: str) -> dict[str, str]:
    """The worker's props on the embedded store, or on a kafka:// store of the same broker (a namespace of its
    own); sink batches of 50 records."""
    url = worker_props["store.url"] if request.param == "sqlite" else f"kafka://{bootstrap}/{unique('m')}"
    return {**worker_props, "store.url": url, "consumer.max.poll.records": "50"}


def test_a_kafka_topic_is_mirrored_into_streams_once_across_restarts(any_store: dict[str, str],
                                                                     bootstrap: str) -> None:
    worker_props = any_store
    topic = unique("orders")
    create_topic(bootstrap, topic, 3)
    produce_to_kafka(bootstrap, topic, 3, 200)
    stream = f"east.{topic}"
    config = {"connector.class": "MirrorSource", "source.cluster.bootstrap.servers": bootstrap, "topics": topic,
              "source.cluster.alias": "east", "target.cluster.store.url": worker_props["store.url"],
              "tasks.max": "2", "source.consumer.max.poll.records": "50",
              "key.converter": BYTES, "value.converter": BYTES}
    with ConnectWorker(worker_props) as worker:
        assert client(worker).request("PUT", "/connectors/mirror/config", config)[0] == 201
        wait_until(lambda: total(read_onceflow(worker_props["store.url"], stream)) >= 600, "the topic mirrored")
    produce_to_kafka(bootstrap, topic, 3, 100, first=200)
    with ConnectWorker(worker_props) as worker:
        assert client(worker).request("PUT", "/connectors/mirror/config", config)[0] in (200, 201)
        wait_until(lambda: total(read_onceflow(worker_props["store.url"], stream)) >= 900, "the new records")
        time.sleep(1)  # a repeat would show up by now
    assert read_onceflow(worker_props["store.url"], stream) == read_kafka(bootstrap, topic) == expected(topic, 3, 300)


def test_the_source_mirrors_the_topics_its_patterns_match_and_new_ones_it_finds(worker_props: dict[str, str],
                                                                              bootstrap: str) -> None:
    """``topics`` as regular expressions minus ``topics.exclude``, IdentityReplicationPolicy keeping the names, and
    a topic created later picked up within ``refresh.topics.interval.seconds``."""
    run = unique("r")
    names = {"first": f"{run}-a", "second": f"{run}-b", "internal": f"{run}-c.internal", "later": f"{run}-d"}
    for name in ("first", "second", "internal"):
        create_topic(bootstrap, names[name], 1)
        produce_to_kafka(bootstrap, names[name], 1, 20)
    config = {"connector.class": SOURCE, "source.cluster.bootstrap.servers": bootstrap, "topics": f"{run}-.*",
              "replication.policy.class": "IdentityReplicationPolicy", "refresh.topics.interval.seconds": "1",
              "target.cluster.store.url": worker_props["store.url"], "key.converter": BYTES, "value.converter": BYTES}
    store_url = worker_props["store.url"]
    with ConnectWorker(worker_props) as worker:
        assert client(worker).request("PUT", "/connectors/mirror/config", config)[0] == 201
        wait_until(lambda: all(total(read_onceflow(store_url, names[n])) == 20 for n in ("first", "second")),
                   "the matching topics mirrored under their names")
        create_topic(bootstrap, names["later"], 1)
        produce_to_kafka(bootstrap, names["later"], 1, 20)
        wait_until(lambda: total(read_onceflow(store_url, names["later"])) == 20, "the new topic mirrored")
    for name in ("first", "second", "later"):
        assert read_onceflow(store_url, names[name]) == expected(names[name], 1, 20)
    store = open_store(store_url)
    try:
        assert names["internal"] not in store.list_streams()
    finally:
        store.close()


def write_stream(store_url: str, stream: str, partitions: int, per_partition: int, first: int = 0) -> None:
    store = open_store(store_url)
    try:
        if stream not in store.list_streams():
            store.create_stream(stream, partitions)
    finally:
        store.close()
    producer = Producer({"store.url": store_url})
    try:
        for i in range(first, first + per_partition):
            for partition in range(partitions):
                producer.produce(stream, f"{stream}-{partition}-{i:05d}".encode(), f"k{i}".encode(),
                                 partition=partition, headers=[("n", str(i).encode())])
        producer.flush()
    finally:
        producer.close()


def test_streams_are_mirrored_to_kafka_once_and_resume_from_the_offsets_kept_there(
        any_store: dict[str, str], bootstrap: str) -> None:
    stream_worker = any_store
    stream = unique("clicks")
    store_url = stream_worker["store.url"]
    write_stream(store_url, stream, 2, 150)
    target = f"here.{stream}"
    config = {"connector.class": "MirrorSink", "target.cluster.bootstrap.servers": bootstrap, "topics": stream,
              "source.cluster.alias": "here", "offset.storage.topic": unique("mirror-offsets"), "tasks.max": "2",
              "key.converter": BYTES, "value.converter": BYTES}
    with ConnectWorker(stream_worker) as worker:
        rest = client(worker)
        assert rest.request("PUT", "/connectors/out/config", config)[0] == 201
        wait_until(lambda: total(read_kafka(bootstrap, target)) >= 300, "the stream mirrored")
        # The worker's own offsets go back to the start: the task resumes from the target cluster's
        assert rest.request("PUT", "/connectors/out/stop")[0] in (202, 204)
        wait_until(lambda: rest.request("DELETE", "/connectors/out/offsets")[0] == 200, "the group offsets reset")
        assert rest.request("PUT", "/connectors/out/resume")[0] in (202, 204)
        write_stream(store_url, stream, 2, 50, first=150)
        wait_until(lambda: total(read_kafka(bootstrap, target)) >= 400, "the new records mirrored")
        # ... and when they are ahead of the target cluster's, it goes back to those
        assert rest.request("PUT", "/connectors/out/stop")[0] in (202, 204)
        write_stream(store_url, stream, 2, 50, first=200)
        ahead = {"offsets": [{"partition": {"kafka_topic": stream, "kafka_partition": p},
                              "offset": {"kafka_offset": 220}} for p in range(2)]}
        wait_until(lambda: rest.request("PATCH", "/connectors/out/offsets", ahead)[0] == 200, "offsets moved ahead")
        assert rest.request("PUT", "/connectors/out/resume")[0] in (202, 204)
        wait_until(lambda: total(read_kafka(bootstrap, target)) >= 500, "the records from the kept offsets on")
    write_stream(store_url, stream, 2, 50, first=250)
    with ConnectWorker(stream_worker) as worker:
        assert client(worker).request("PUT", "/connectors/out/config", config)[0] == 201
        wait_until(lambda: total(read_kafka(bootstrap, target)) >= 600, "the records written while it was down")
        time.sleep(1)  # a repeat would show up by now
    assert read_kafka(bootstrap, target) == expected(stream, 2, 300)


def check_kafka(bootstrap: str, topic: str, directory: Path, values: list[str]) -> checker.Report:
    """Each input value as a committed write to ``topic``; one reader of the whole topic (read_committed)."""
    directory.mkdir()
    recorder = history.Recorder(directory, "pipeline")
    for value in values:
        recorder.ok(recorder.invoke("txn", txn=value, writes=[[topic, value]]), outcome="committed")
    seen = [[topic, m.partition(), m.offset(), (m.value() or b"").decode()] for m in consume_all(bootstrap, topic)]
    recorder.read("reader", seen, complete=[topic])
    recorder.close()
    return checker.check(history.load(directory))


def mirror_command(directory: Path, store_url: str, bootstrap: str, topic: str) -> list[str]:
    """A standalone worker mirroring ``topic`` into ``east.<topic>`` and that stream back into
    ``back.east.<topic>``, ten records a transaction each way."""
    files = {
        "worker.properties": {"store.url": store_url, "listeners": "http://127.0.0.1:0", "key.converter": BYTES,
                              "value.converter": BYTES, "consumer.max.poll.records": "10", **FAST_SESSIONS},
        "in.properties": {"name": "in", "connector.class": SOURCE, "source.cluster.bootstrap.servers": bootstrap,
                          "topics": topic, "source.cluster.alias": "east", "target.cluster.store.url": store_url,
                          "source.consumer.max.poll.records": "10"},
        "out.properties": {"name": "out", "connector.class": SINK, "target.cluster.bootstrap.servers": bootstrap,
                           "topics": f"east.{topic}", "source.cluster.alias": "back",
                           "offset.storage.topic": f"offsets-{topic}"},
    }
    for name, props in files.items():
        (directory / name).write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return [sys.executable, "-m", "onceflow.connector.cli", "connect", "standalone",
            *(str(directory / name) for name in files)]


@pytest.mark.crash
@pytest.mark.parametrize("failpoint", [
    "txn.commit.after_one_step=crash@9",  # a onceflow transaction of either direction committed, not reported
    "",  # killed by the test once records flow
])
def test_a_worker_killed_while_mirroring_both_ways_loses_and_repeats_nothing(tmp_path: Path, bootstrap: str,
                                                                            failpoint: str) -> None:
    topic = unique("in")
    create_topic(bootstrap, topic, 2)
    produce_to_kafka(bootstrap, topic, 2, 200)
    values = [f"{topic}-{p}-{i:05d}" for p in range(2) for i in range(250)]
    stream, back = f"east.{topic}", f"back.east.{topic}"
    store_url = f"sqlite://{tmp_path / 'store.db'}"
    command = mirror_command(tmp_path, store_url, bootstrap, topic)
    doomed = start(command, failpoint)
    if failpoint:
        assert doomed.wait(timeout=120) == -signal.SIGKILL, doomed.stderr.read()  # type: ignore[union-attr]
    else:
        with KafkaProbe(bootstrap) as probe:
            wait_for(lambda: probe.anything_in(back), "records flowing both ways", doomed)
        doomed.kill()
        doomed.wait()
    doomed.stderr.close()  # type: ignore[union-attr]
    # The input's tail comes after the kill, so the next worker has work left whenever the kill came: a worker that
    # finished the first 400 records before the test's kill (as one did in CI) leaves nothing to check otherwise.
    produce_to_kafka(bootstrap, topic, 2, 50, first=200)
    survivor = start(command)
    announcement(survivor.stderr, b" serving ")
    try:
        wait_for(lambda: count(store_url, stream) >= len(values) and total(read_kafka(bootstrap, back)) >= len(values),
                 "every record in the stream and back in Kafka", survivor, timeout_s=120)
    finally:
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=60) == 0, survivor.stderr.read()  # type: ignore[union-attr]
        survivor.stderr.close()  # type: ignore[union-attr]
    report = check_stream(store_url, stream, tmp_path / "stream", values)
    assert report.valid, f"{stream}: {report.summary()}"
    assert report.operations == {"txn ok": len(values), "read ok": 1}
    report = check_kafka(bootstrap, back, tmp_path / "back", values)
    assert report.valid, f"{back}: {report.summary()}"
    assert report.operations == {"txn ok": len(values), "read ok": 1}


def test_task_configs_share_the_partitions_as_read_once_while_the_refresh_replaces_them() -> None:
    """The refresh thread replaces the connector's partition list while the herder asks for task configs: they are
    made from one reading of it. Here the replacement is forced between two reads; before, a list replaced from
    empty to two partitions divided by zero (the connector was reported FAILED)."""
    connector = MirrorSourceConnector()

    class Replaced(list[tuple[str, int]]):
        def __len__(self) -> int:  # the refresh thread comes in between
            connector._partitions = [("t", 0), ("t", 1)]
            return super().__len__()

    connector._partitions = Replaced()
    assert connector.task_configs(4) == []
    assert len(connector.task_configs(4)) == 2  # the next request sees the new partitions
