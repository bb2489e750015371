"""Commits transactions of one record each into stream "out" of a group whose commit log and staging are
truncated often, and reports each commit's outcome as a JSON line.

Usage: txn_committer.py STORE_URL GROUP NAME COUNT TRUNCATE_EVERY TRUNCATE_DELAY_MS
Values are "<name>:<i>". Prints {"committed": i} or {"error": CODE, "outcome_unknown": bool, "reason": str,
"txn": id} per transaction, then {"done": true}. Arm ``txn.commit.after_merge=sleep:MS`` to stall it between a
commit's merge and its truncation.
"""

from __future__ import annotations

import json
import sys

from onceflow import txn
from onceflow.connector import KafkaException
from onceflow.connector.store import Record


def open_truncating_group(store_url: str, group_name: str, every: int, delay_ms: int) -> txn.TransactionGroup:
    return txn.open_group({"store.url": store_url, "transaction.group": group_name,
                           "transaction.log.truncate.every.entries": every,
                           "transaction.log.truncate.delay.ms": delay_ms})


def main(store_url: str, group_name: str, name: str, count: int, every: int, delay_ms: int) -> None:
    group = open_truncating_group(store_url, group_name, every, delay_ms)
    for i in range(count):
        txn_id = group.begin(60_000)
        try:
            writer = group.writer(txn_id, f"{name}-{i}", known_open=True)
            writer.produce("out", Record(f"{name}-{i}".encode(), f"{name}:{i}".encode()))
            participant = writer.participant()
            group.commit(txn_id, [participant] if participant else [])
            print(json.dumps({"committed": i}), flush=True)
        except KafkaException as exc:
            print(json.dumps({"error": exc.code.name, "outcome_unknown": exc.error.outcome_unknown(),
                              "reason": str(exc), "txn": txn_id}), flush=True)
    print(json.dumps({"done": True}), flush=True)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
