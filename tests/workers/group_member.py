"""A consumer-group member: prints every record it processes and commits it before taking the next.

Usage: group_member.py STORE_URL TOPIC GROUP MAX_MESSAGES
Leaves the group (close) after MAX_MESSAGES records, or once the group has committed every record of the
topic, or after a minute without any record.
"""

from __future__ import annotations

import json
import sys
import time

from onceflow.connector import Consumer, TopicPartition
from onceflow.integration.brokers import FAST_GROUP_CONFIG

IDLE_LIMIT_S = 60


def group_done(consumer: Consumer, topic: str) -> bool:
    """True when the group's committed offsets reach the end of every partition."""
    partitions = [TopicPartition(topic, p) for p in consumer.list_topics(topic).topics[topic].partitions]
    committed = {tp.partition: tp.offset for tp in consumer.committed(partitions)}
    return all(committed[tp.partition] >= consumer.get_watermark_offsets(tp)[1] for tp in partitions)


def main(store_url: str, topic: str, group: str, max_messages: int) -> None:
    consumer = Consumer({
        "store.url": store_url, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, **FAST_GROUP_CONFIG, "heartbeat.interval.ms": 100,
    })
    consumer.subscribe([topic])
    processed, last = 0, time.monotonic()
    while processed < max_messages:
        message = consumer.poll(0.1)
        if message is None or message.error() is not None:
            idle = time.monotonic() - last
            if idle > IDLE_LIMIT_S or (idle > 1 and group_done(consumer, topic)):
                break
            continue
        print(json.dumps({"partition": message.partition(), "offset": message.offset()}), flush=True)
        consumer.commit(message=message, asynchronous=False)
        processed, last = processed + 1, time.monotonic()
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
