"""Writes records into an open transaction of a group, flushing every FLUSH_EVERY records, then prints its
participant as JSON.

Usage: txn_writer.py STORE_URL GROUP TXN_ID WRITER_ID STREAM COUNT
Values are "<writer_id>:<i>". Prints {"staged": n} after each flush, so a test can kill it part-way.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from onceflow import txn
from onceflow.connector.store import Record

FLUSH_EVERY = 10


def main(store_url: str, group_name: str, txn_id: str, writer_id: str, stream: str, count: int) -> None:
    group = txn.open_group({"store.url": store_url, "transaction.group": group_name})
    writer = group.writer(txn_id, writer_id)
    for i in range(count):
        writer.produce(stream, Record(f"{writer_id}-{i}".encode(), f"{writer_id}:{i}".encode()))
        if (i + 1) % FLUSH_EVERY == 0:
            writer.flush()
            print(json.dumps({"staged": i + 1}), flush=True)
    participant = writer.participant()
    print(json.dumps({"participant": dataclasses.asdict(participant) if participant else None}), flush=True)
    group.close()


if __name__ == "__main__":
    main(*sys.argv[1:6], int(sys.argv[6]))
