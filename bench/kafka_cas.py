"""One CAS writer on the Kafka backend against raw confluent-kafka, on the same broker in the same run.

A single writer appending one record at a time, each conditioned on what it wrote last: by expected sequence
(``expected_sequence=i - 1, sequence=i``: no read between appends), and by expected end offset (as
docs/kafka-backend.md says, taken from ``partition_state`` before each append, never computed).
Baselines: raw idempotent produce + flush of one record, and a raw transactional producer committing one record
per transaction (what a fenced owner's append costs at least). The broker is the one the integration harness
gives (``KAFKA_BOOTSTRAP``, else Apache Kafka's own broker, ...).

    python bench/kafka_cas.py [--appends 300]
"""

from __future__ import annotations

import argparse
import contextlib
import uuid

import confluent_kafka as ck
from _report import report, row, timed
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from onceflow.connector.store import Record, open_store
from onceflow.integration.brokers import kafka_broker

VALUE = b"x" * 100


def raw_produce_flush(bootstrap: str, topic: str, count: int) -> int:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    producer.produce(topic, VALUE, partition=0)  # connected and with a producer id before the clock matters
    producer.flush(30)
    for _ in range(count):
        producer.produce(topic, VALUE, partition=0)
        producer.flush(30)
    return count


def raw_transactions(bootstrap: str, topic: str, count: int) -> int:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex}",
                            "linger.ms": 0})
    producer.init_transactions(30)
    for _ in range(count):
        producer.begin_transaction()
        producer.produce(topic, VALUE, partition=0)
        producer.commit_transaction(30)
    return count


def cas_by_sequence(url: str, count: int) -> int:
    with contextlib.closing(open_store(url)) as store:
        writer = store.open_writer()
        writer.append("by-sequence", 0, [Record(None, VALUE)], expected_sequence=-1, sequence=0)  # takes ownership
        for i in range(1, count + 1):
            writer.append("by-sequence", 0, [Record(None, VALUE)], expected_sequence=i - 1, sequence=i)
    return count


def cas_by_offset(url: str, count: int) -> int:
    with contextlib.closing(open_store(url)) as store:
        writer = store.open_writer()
        writer.append("by-offset", 0, [Record(None, VALUE)], expected_offset=0)  # takes ownership
        for _ in range(count):
            end = store.partition_state("by-offset", 0).end_offset
            writer.append("by-offset", 0, [Record(None, VALUE)], expected_offset=end)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--appends", type=int, default=300)
    args = parser.parse_args()
    with kafka_broker() as broker:
        bootstrap, namespace = broker.bootstrap, f"bench{uuid.uuid4().hex[:6]}"
        url = f"kafka://{bootstrap}/{namespace}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for name in ("raw-single", "raw-txn"):
            admin.create_topics([NewTopic(f"{namespace}-{name}", 1, 1)])[f"{namespace}-{name}"].result()
        with contextlib.closing(open_store(url)) as store:
            store.create_stream("by-sequence", 1)
            store.create_stream("by-offset", 1)
        raw_single = timed(lambda: raw_produce_flush(bootstrap, f"{namespace}-raw-single", args.appends))
        raw_txn = timed(lambda: raw_transactions(bootstrap, f"{namespace}-raw-txn", args.appends))
        by_sequence = timed(lambda: cas_by_sequence(url, args.appends))
        by_offset = timed(lambda: cas_by_offset(url, args.appends))
        rows = [
            row("CAS append by sequence, 1 record", *by_sequence, "produce+flush, 1 record", raw_single),
            row("CAS append by offset, 1 record", *by_offset, "produce+flush, 1 record", raw_single),
            row("CAS append by sequence, 1 record", *by_sequence, "transaction of 1 record", raw_txn),
            row("transaction of 1 record (raw)", *raw_txn, "produce+flush, 1 record", raw_single),
        ]
        report("kafka_cas", rows, {"appends": args.appends, "value_bytes": len(VALUE), "broker": broker.describe()})


if __name__ == "__main__":
    main()
