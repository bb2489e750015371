"""The classic poll loop: subscribe, poll, skip end-of-partition events, commit each record, close.

Usage: python poll_loop_consumer.py SERVER TOPIC GROUP COUNT

A confluent-kafka program: only the import line and the server's config key differ (see README.md).
"""

import sys
import time

from onceflow.connector import Consumer, KafkaError, KafkaException


def main(server: str, topic: str, group: str, count: int) -> None:
    consumer = Consumer({
        "store.url": server,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    })
    consumer.subscribe([topic])
    received = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < count and time.monotonic() < deadline:
            msg = consumer.poll(timeout=1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue  # reached the end of a partition for now; more may come
                raise KafkaException(msg.error())
            received.append((msg.partition(), msg.offset(), msg.key().decode(), msg.value().decode()))
            consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()  # leaves the group, so its partitions move on at once
    for partition, offset, key, value in sorted(received):
        print(f"{partition} {offset} {key}={value}")
    print(f"received {len(received)} records")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
