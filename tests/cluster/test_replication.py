"""The Kafka backend on a three-node Apache Kafka cluster: replicated topics that never expire, and a node
SIGKILLed mid-run that loses nothing acknowledged."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]  # not in __all__

from onceflow.connector import KafkaError, Message, Producer
from onceflow.connector.store import open_store, read_range
from onceflow.integration.brokers import Broker

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.cluster]


def topic_settings(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in entries.items()}


def replicas(bootstrap: str, topic: str) -> set[int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return {len(p.replicas) for p in metadata.topics[topic].partitions.values()}


def test_topics_take_the_clusters_replication_and_internal_ones_never_expire(kafka_cluster: Broker) -> None:
    namespace = f"r{uuid.uuid4().hex[:6]}"
    url = f"kafka://{kafka_cluster.bootstrap}/{namespace}"
    open_store(url).create_stream("orders", 2)
    producer = Producer({"store.url": url, "transactional.id": "t"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("orders", b"v", partition=0)
    producer.commit_transaction()
    names = set(AdminClient({"bootstrap.servers": kafka_cluster.bootstrap}).list_topics(timeout=30).topics)
    ours = {n for n in names if namespace in n}
    internal = {n for n in ours if "__onceflow" in n}
    assert internal and f"{namespace}.orders" in ours
    for topic in ours:
        assert replicas(kafka_cluster.bootstrap, topic) == {3}, topic  # the cluster's default.replication.factor
    for topic in internal:
        assert topic_settings(kafka_cluster.bootstrap, topic)["retention.ms"] == "-1", topic
    assert topic_settings(kafka_cluster.bootstrap, f"{namespace}.orders")["retention.ms"] != "-1"


def test_a_node_killed_mid_run_loses_no_acknowledged_record(kafka_cluster: Broker) -> None:
    url = f"kafka://{kafka_cluster.bootstrap}/k{uuid.uuid4().hex[:6]}"
    store = open_store(url)
    store.create_stream("events", 3)
    acknowledged: list[bytes] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acknowledged.append(msg.value() or b"")

    producer = Producer({"store.url": url})
    for i in range(3000):
        producer.produce("events", f"e{i}".encode(), key=f"k{i % 17}", on_delivery=delivered)
        if i == 1000:
            producer.flush()
            kafka_cluster.kill(node=0)  # a crash of one of the three nodes, leaders among them
        if i == 2000:
            kafka_cluster.start(node=0)
    assert producer.flush(60) == 0
    read = [r.value() or b"" for p in range(3) for r in read_range(store, "events", p)]
    assert sorted(read) == sorted(acknowledged) and len(acknowledged) == 3000
    store.close()
