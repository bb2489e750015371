"""A CAS racer: reads the partition's end, appends with expected_offset=end, prints each outcome as JSON."""

from __future__ import annotations

import json
import sys

from onceflow.connector import Consumer, KafkaError, Message, Producer, TopicPartition


def main(store_url: str, topic: str, name: str, attempts: int) -> None:
    producer = Producer({"store.url": store_url, "linger.ms": 0})
    watcher = Consumer({"store.url": store_url, "group.id": f"cas-racer-{name}", "enable.auto.commit": False})
    outcome: list[tuple[KafkaError | None, Message]] = []
    for attempt in range(attempts):
        _, end = watcher.get_watermark_offsets(TopicPartition(topic, 0))
        value = f"{name}:{attempt}"
        producer.produce(topic, value, partition=0, expected_offset=end,
                         on_delivery=lambda err, msg: outcome.append((err, msg)))
        producer.flush()
        err, msg = outcome.pop()
        print(json.dumps({"value": value, "expected": end, "error": err.name() if err else None,
                          "reason": str(err) if err else None, "offset": msg.offset()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
