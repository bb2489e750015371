"""Appends numbered batches to partition 0 and prints an ACK line once each batch is acknowledged.

Usage: appender.py STORE_URL TOPIC FIRST_BATCH BATCHES BATCH_SIZE [WRITER_ID]
A record's value is "<batch>:<index>". Stops at the first failed batch and prints its error.
"""

from __future__ import annotations

import json
import sys

from onceflow.connector import KafkaError, Message, Producer


def main(store_url: str, topic: str, first: int, batches: int, size: int, writer_id: str | None) -> None:
    conf: dict[str, object] = {"store.url": store_url, "linger.ms": 60_000, "batch.num.messages": size}
    if writer_id:
        conf["writer.id"] = writer_id
    producer = Producer(conf)
    print(json.dumps({"ready": True}), flush=True)
    for batch in range(first, first + batches):
        reports: list[tuple[KafkaError | None, Message]] = []

        def report(err: KafkaError | None, msg: Message, reports: list[tuple[KafkaError | None, Message]] = reports
                   ) -> None:
            reports.append((err, msg))

        for i in range(size):
            producer.produce(topic, f"{batch}:{i}", partition=0, on_delivery=report)
        producer.flush()
        errors = {e.name() for e, _ in reports if e is not None}
        if errors:
            print(json.dumps({"batch": batch, "error": sorted(errors)}), flush=True)
            return
        print(json.dumps({"batch": batch, "base_offset": reports[0][1].offset()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
         sys.argv[6] if len(sys.argv) > 6 else None)
