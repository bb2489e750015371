"""A consumer-group member: prints every record it processes and commits it before taking the next.

Usage: group_member.py STORE_URL TOPIC GROUP MAX_MESSAGES IDLE_SECONDS
Leaves the group (close) after MAX_MESSAGES records, or after IDLE_SECONDS without one.
"""

from __future__ import annotations

import json
import sys
import time

from connector import Consumer


def main(store_url: str, topic: str, group: str, max_messages: int, idle: float) -> None:
    consumer = Consumer({
        "store.url": store_url, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "heartbeat.interval.ms": 100, "session.timeout.ms": 3000,
    })
    consumer.subscribe([topic])
    processed, last = 0, time.monotonic()
    while processed < max_messages and time.monotonic() - last < idle:
        message = consumer.poll(0.1)
        if message is None or message.error() is not None:
            continue
        print(json.dumps({"partition": message.partition(), "offset": message.offset()}), flush=True)
        consumer.commit(message=message, asynchronous=False)
        processed, last = processed + 1, time.monotonic()
    consumer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
