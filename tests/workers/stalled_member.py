"""A group member copying what it consumed in transactions, the last of which it commits as given (a failpoint
may stall it there).

Usage: stalled_member.py STORE_URL GROUP COUNT
Subscribes to "single" in GROUP (sessions and poll intervals of FAST_GROUP_CONFIG) and consumes COUNT records.
It copies the first to "copies" in a transaction with the offset after it (which also makes the topics and
registrations a commit needs), then the rest in another with the offsets after them: it polls once more, sends
them, prints {"committing": true}, and then {"committed": true} or {"error": CODE} for that one's commit.
"""

from __future__ import annotations

import json
import sys
import time

from onceflow.connector import Consumer, KafkaException, Message, Producer, TopicPartition
from onceflow.integration.brokers import FAST_GROUP_CONFIG


def stage(producer: Producer, messages: list[Message]) -> None:
    """Begin a transaction copying ``messages``, staged: committed through the commit log (a CLAIM, a COMMIT)."""
    producer.begin_transaction()
    for message in messages:
        producer.produce("copies", message.value(), key=message.key())
    producer.flush()


def send_offsets(producer: Producer, consumer: Consumer, messages: list[Message]) -> None:
    last = messages[-1]
    producer.send_offsets_to_transaction([TopicPartition("single", last.partition() or 0, (last.offset() or 0) + 1)],
                                         consumer.consumer_group_metadata())


def main(store_url: str, group: str, count: int) -> None:
    producer = Producer({"store.url": store_url, "transactional.id": f"{group}-member"})
    producer.init_transactions()
    consumer = Consumer({"store.url": store_url, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **FAST_GROUP_CONFIG})
    consumer.subscribe(["single"])
    consumed: list[Message] = []
    deadline = time.monotonic() + 60
    while len(consumed) < count and time.monotonic() < deadline:
        consumed += [m for m in consumer.consume(count, timeout=0.2) if m.error() is None]
    stage(producer, consumed[:1])
    send_offsets(producer, consumer, consumed[:1])
    producer.commit_transaction()
    stage(producer, consumed[1:])
    # Its poll interval starts again here, so that its member check comes well within it (the first commit may
    # have outlasted it: then it joins again, and is given the partition back).
    consumer.poll(0)
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.1)
    send_offsets(producer, consumer, consumed[1:])
    print(json.dumps({"committing": True}), flush=True)
    try:
        producer.commit_transaction()
        print(json.dumps({"committed": True}), flush=True)
    except KafkaException as exc:
        print(json.dumps({"error": exc.args[0].name()}), flush=True)
        producer.abort_transaction()
    producer.close()
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
