"""Exactly-once copy: consume from one topic, produce a transformed copy to another, and commit the consumed
offsets in the same transaction (``send_offsets_to_transaction``), so the copy and the consumer's progress
land together or not at all.

Usage: python transactional_copy.py SERVER SOURCE TARGET GROUP COUNT

A confluent-kafka program: only the import line and the server's config key differ (see README.md).
"""

import sys
import time

from onceflow.connector import Consumer, KafkaException, Producer, TopicPartition


def main(server: str, source: str, target: str, group: str, count: int) -> None:
    consumer = Consumer({
        "store.url": server,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    })
    producer = Producer({"store.url": server, "transactional.id": f"copy-{group}"})
    producer.init_transactions()
    consumer.subscribe([source])
    copied = 0
    deadline = time.monotonic() + 60
    while copied < count and time.monotonic() < deadline:
        records = [m for m in consumer.consume(num_messages=100, timeout=1.0) if m.error() is None]
        if not records:
            continue
        producer.begin_transaction()
        try:
            for msg in records:
                producer.produce(target, msg.value().upper(), key=msg.key(), partition=msg.partition())
            next_offsets = {(m.topic(), m.partition()): m.offset() + 1 for m in records}
            producer.send_offsets_to_transaction([TopicPartition(t, p, o) for (t, p), o in next_offsets.items()],
                                                 consumer.consumer_group_metadata())
            producer.commit_transaction()
        except KafkaException as exc:
            if exc.args[0].txn_requires_abort():
                producer.abort_transaction()  # nothing of it is visible; a restart copies these records again
            raise
        copied += len(records)
    print(f"copied {copied} records")
    for tp in sorted(consumer.committed([TopicPartition(source, p) for p in range(3)])):
        print(f"group {group} committed {tp.topic}[{tp.partition}] up to offset {tp.offset}")
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
