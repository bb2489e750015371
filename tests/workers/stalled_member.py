"""A group member copying what it consumed in a transaction, which it commits as given (a failpoint may stall it).

Usage: stalled_member.py STORE_URL GROUP COUNT
First a transaction copying a record "warm-up" (its offsets sent without a member: nothing to check), which makes
what a commit needs (topics, the group's registration). Then it subscribes to "single" in GROUP (sessions and poll
intervals of FAST_GROUP_CONFIG), consumes COUNT records and copies them to "copies" in a staged transaction; it
polls once more, sends the offsets after them with its group metadata, prints {"committing": true}, and then
{"committed": true} or {"error": CODE, "reason": MESSAGE} for that transaction's commit.
"""

from __future__ import annotations

import json
import sys
import time

from onceflow.connector import Consumer, ConsumerGroupMetadata, KafkaException, Message, Producer, TopicPartition
from onceflow.integration.brokers import FAST_GROUP_CONFIG


def main(store_url: str, group: str, count: int) -> None:
    producer = Producer({"store.url": store_url, "transactional.id": f"{group}-member"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("copies", b"warm-up")
    producer.flush()
    producer.send_offsets_to_transaction([TopicPartition("single", 0, 0)], ConsumerGroupMetadata(group))
    producer.commit_transaction()
    consumer = Consumer({"store.url": store_url, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **FAST_GROUP_CONFIG})
    consumer.subscribe(["single"])
    consumed: list[Message] = []
    deadline = time.monotonic() + 60
    while len(consumed) < count and time.monotonic() < deadline:
        consumed += [m for m in consumer.consume(count, timeout=0.2) if m.error() is None]
    producer.begin_transaction()
    for message in consumed:
        producer.produce("copies", message.value(), key=message.key())
    producer.flush()  # staged: committed through the commit log (its CLAIM, then its COMMIT)
    consumer.poll(0)  # its poll interval starts again here: its member check comes well within it
    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata())
    print(json.dumps({"committing": True}), flush=True)
    try:
        producer.commit_transaction()
        print(json.dumps({"committed": True}), flush=True)
    except KafkaException as exc:
        print(json.dumps({"error": exc.args[0].name(), "reason": exc.args[0].str()}), flush=True)
        producer.abort_transaction()
    producer.close()
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
