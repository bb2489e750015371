"""Stages three records that need two staged batches, retrying the flush after a store failure, then commits.

Usage: txn_stage_retry.py STORE_URL GROUP
Values are "<i>:" padded to 4000 bytes; ``message.max.bytes`` is 10000, so the records need two staged batches,
which a flush stages in one append: arm a store failpoint to fail it. Prints {"failed_flushes": n, "committed":
txn_id}.
"""

from __future__ import annotations

import json
import sys

from onceflow import txn
from onceflow.connector import KafkaException
from onceflow.connector.store import Record

RECORDS = 3


def main(store_url: str, group_name: str) -> None:
    group = txn.open_group({"store.url": store_url, "transaction.group": group_name, "message.max.bytes": 10_000})
    txn_id = group.begin(60_000)
    writer = group.writer(txn_id, "retrying", known_open=True)
    for i in range(RECORDS):
        writer.produce("out", Record(None, f"{i}:".encode().ljust(4000, b".")), 0)
    failed = 0
    while True:
        try:
            writer.flush()
            break
        except KafkaException as exc:
            if not exc.error.retriable() or failed == 3:
                raise
            failed += 1
    participant = writer.participant()
    group.commit(txn_id, [participant] if participant else [])
    print(json.dumps({"failed_flushes": failed, "committed": txn_id}), flush=True)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
