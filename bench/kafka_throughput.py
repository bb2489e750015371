"""The Kafka backend against raw confluent-kafka, on the same broker in the same run.

Plain produce and consume throughput (records/s, 100-byte values), and CAS appends (one record each,
conditioned on the end offset) against plain one-record produce+flush. The same Producer and Consumer on the
embedded store (a SQLite file, ``synchronous=FULL``) are measured against the same raw confluent-kafka figures:
what a user gains or loses by running on one machine instead of a local broker. The broker is the one the
integration harness gives (``KAFKA_BOOTSTRAP``, else Apache Kafka's own broker, else testcontainers, else a local
Tansu). On Apache Kafka, Kafka's own ``kafka-producer-perf-test`` is a second anchor for raw produce.

Produce and consume run ``--rounds`` times, raw, onceflow on Kafka and onceflow on a fresh embedded store in turn
with fresh clients each round, so all see the same load (the machine may be shared): the table shows each side's
best round, and the per-round ratio's min/median/max is printed under it. A second raw anchor produces with a
delivery callback per record: onceflow's Kafka producer asks librdkafka for one on every record (where each
landed: the seal check and the offsets of delivery reports), so that anchor is the floor of what a Python client
reporting deliveries can reach. Each round also prints how long each consume waited for its first records after
``assign`` (part of its time).

    python bench/kafka_throughput.py [--records 200000] [--cas 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable

import confluent_kafka as ck
from _report import best_of_rounds, best_round, print_medians, report, row, timed
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from onceflow.connector import Consumer, Producer, TopicPartition
from onceflow.connector.config import StoreConfig
from onceflow.connector.store import Record, open_store
from onceflow.connector.store.kafka.reader import FETCH_QUEUE_BACKOFF_MS
from onceflow.integration import apache_kafka
from onceflow.integration.brokers import kafka_broker

VALUE = 100
PARTITIONS = 4


def raw_produce(producer: ck.Producer, topic: str, values: list[bytes], keys: list[bytes],
                reporting: bool = False) -> int:
    """confluent-kafka's produce + flush; ``reporting``: with a delivery callback per record noting its offset."""
    landed: list[int | None] = []

    def report(err: ck.KafkaError | None, msg: ck.Message) -> None:
        landed.append(msg.offset())

    callback = report if reporting else None
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=callback)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return len(values)


def timed_reads(take: Callable[[int], int], expected: int) -> tuple[tuple[int, float], float]:
    """(records, seconds) of reading ``expected`` records by calls of ``take`` (one consume of at most the records
    given: the records it returned), and the seconds until the first came: a reader's start (the first fetch of
    partitions it never read) counts in its throughput.

    Each call asks for no more than the records still to come: confluent-kafka's ``consume`` waits its whole
    timeout for a batch it cannot fill, so a last call asking for 10,000 of the 3,000 left took a second, and
    the raw anchor swung between 180k and 1.2M records/s with how the fetches happened to split."""
    count, first = 0, 0.0
    started = time.perf_counter()
    while count < expected:
        count += take(min(10_000, expected - count))
        if count and not first:
            first = time.perf_counter()
    return (count, time.perf_counter() - started), first - started


def clients(url: str, values: list[bytes], keys: list[bytes]) -> tuple[tuple[int, float], tuple[int, float], float]:
    """Producer.produce + flush into the stream "bench", then Consumer.consume of it from its start (clients made
    off the clock), and the seconds the consume waited for its first records."""
    producer = Producer({"store.url": url, "batch.num.messages": 10_000, "linger.ms": 100})
    producer.list_topics("bench", timeout=30)  # off the clock, as for confluent-kafka's producer
    write = timed(lambda: onceflow_produce(producer, values, keys))
    producer.close()
    consumer = Consumer({"store.url": url, "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("bench", p, 0) for p in range(PARTITIONS)])
    read, first = timed_reads(lambda limit: len(consumer.consume(limit, timeout=1)), len(values))
    consumer.close()
    return write, read, first


def raw_clients(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes]) -> dict[str, tuple[int, float]]:
    """confluent-kafka's produce + flush (without and with a delivery callback per record), then its consume of
    ``topic`` from its start (read_committed, as onceflow reads), clients made off the clock."""
    results = {}
    for name, reporting in (("raw produce", False), ("raw produce, reported", True)):
        producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        producer.list_topics(topic, timeout=30)
        results[name] = timed(lambda: raw_produce(producer, topic, values, keys, reporting))  # noqa: B023
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                            "enable.auto.commit": False, "isolation.level": "read_committed",
                            # onceflow's reader's: with librdkafka's default (1 s), a fetch that found the local
                            # queue full waited a second, and raw rounds took 0.16 s or 1.1 s for the same records.
                            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS})
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    results["raw consume"], waited = timed_reads(
        lambda limit: sum(1 for m in consumer.consume(limit, timeout=1) if m.error() is None), len(values))
    results["raw first records"] = (1, waited)
    consumer.close()
    return results


def one_round(bootstrap: str, url: str, raw_topic: str, values: list[bytes],
              keys: list[bytes]) -> dict[str, tuple[int, float]]:
    """Raw confluent-kafka, then onceflow's clients on Kafka and on a fresh embedded store: (records, seconds) of
    each measure."""
    results = raw_clients(bootstrap, raw_topic, values, keys)
    results["produce"], results["consume"], waited = clients(url, values, keys)
    results["first records"] = (1, waited)
    results["embedded produce"], results["embedded consume"], _ = embedded_clients(values, keys)
    return results


ROUNDS = [  # (label, measure, baseline label, baseline measure)
    ("Producer.produce + flush", "produce", "confluent-kafka produce", "raw produce"),
    ("Producer.produce + flush", "produce", "confluent-kafka produce, a delivery callback per record",
     "raw produce, reported"),
    ("Consumer.consume", "consume", "confluent-kafka consume", "raw consume"),
    ("embedded store: Producer.produce + flush", "embedded produce", "confluent-kafka produce", "raw produce"),
    ("embedded store: Consumer.consume", "embedded consume", "confluent-kafka consume", "raw consume"),
]


def embedded_clients(values: list[bytes], keys: list[bytes]) -> tuple[tuple[int, float], tuple[int, float], float]:
    """:func:`clients` on a fresh embedded store."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite://{tmp}/bench.db"
        open_store(url).create_stream("bench", PARTITIONS)
        return clients(url, values, keys)


def onceflow_produce(producer: Producer, values: list[bytes], keys: list[bytes]) -> int:
    for key, value in zip(keys, values, strict=True):
        while True:  # the same loop as the raw producer's: poll when the queue is full
            try:
                producer.produce("bench", value, key)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush()
    return len(values)


def raw_single_appends(bootstrap: str, topic: str, count: int) -> int:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for _ in range(count):
        producer.produce(topic, b"x" * VALUE, partition=0)
        producer.flush(30)
    return count


def cas_appends(store_config: StoreConfig, count: int) -> int:
    store = open_store(store_config)
    writer = store.open_writer()
    end = store.partition_state("cas", 0).end_offset
    for _ in range(count):  # the next expectation as a CAS writer takes it: the end its append left, if known
        result = writer.append("cas", 0, [Record(None, b"x" * VALUE)], expected_offset=end)
        end = result.end_after if result.end_after is not None else store.partition_state("cas", 0).end_offset
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--cas", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="alternating raw/onceflow produce+consume rounds")
    args = parser.parse_args()
    values = [os.urandom(VALUE) for _ in range(args.records)]
    keys = [b"key-%d" % (i % 1000) for i in range(args.records)]
    with kafka_broker() as broker:
        bootstrap, namespace = broker.bootstrap, f"bench{uuid.uuid4().hex[:6]}"
        url = f"kafka://{bootstrap}/{namespace}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for name, partitions in (("raw", PARTITIONS), ("raw-single", 1), ("perf-test", PARTITIONS)):
            admin.create_topics([NewTopic(f"{namespace}-{name}", partitions, 1)])[f"{namespace}-{name}"].result()
        store = open_store(url)
        store.create_stream("bench", PARTITIONS)
        store.create_stream("cas", 1)
        rounds = [one_round(bootstrap, url, f"{namespace}-raw", values, keys) for _ in range(args.rounds)]
        raw_single = timed(lambda: raw_single_appends(bootstrap, f"{namespace}-raw-single", args.cas))
        measured = best_of_rounds(rounds, ROUNDS)
        rows = [
            *measured,
            *([row("Producer.produce + flush", *best_round(rounds, "produce"), "kafka-producer-perf-test",
                   apache_kafka.producer_perf_test(bootstrap, f"{namespace}-perf-test", args.records, VALUE))]
              if broker.kind == "apache-kafka" else []),
            # On Tansu CAS is refused unless allowed (aborted writes show there): measured for speed only.
            row("CAS append, 1 record each", *timed(lambda: cas_appends(
                StoreConfig(url=url, allow_visible_aborts=not broker.aborts_hidden), args.cas)),
                "produce+flush, 1 record each", raw_single),
        ]
        report("kafka_throughput", rows, {"records": args.records, "value_bytes": VALUE, "partitions": PARTITIONS,
                                          "cas_appends": args.cas, "rounds": args.rounds,
                                          "broker": broker.describe()})
        print_medians(measured, args.rounds)
        print("Consumer.consume: first records after assign, ms per round: onceflow " + ", ".join(
            f"{r['first records'][1] * 1000:.0f}" for r in rounds) + "; confluent-kafka " + ", ".join(
            f"{r['raw first records'][1] * 1000:.0f}" for r in rounds))


if __name__ == "__main__":
    main()
