"""Stages one numbered batch of a sink in PARTS task transactions and commits it, as a Spark query would.

Usage: sink_batch.py STORE_URL SINK_ID BATCH_ID PARTS COUNT
Values are "b<batch>-p<part>-<i>" for the stream "out"; prints {"committed": bool}.
"""

from __future__ import annotations

import json
import sys

from onceflow import txn
from onceflow.connector.store import Record
from onceflow.txn.sink import ExactlyOnceSink, SinkTask


def main(store_url: str, sink_id: str, batch_id: int, parts: int, count: int) -> None:
    group = txn.open_group({"store.url": store_url, "transaction.group": f"spark-{sink_id}"})
    staged = []
    for part in range(parts):
        task = SinkTask(group, sink_id, batch_id, f"{sink_id}-b{batch_id}-p{part}", 60_000)
        for i in range(count):
            task.produce("out", Record(f"k{i}".encode(), f"b{batch_id}-p{part}-{i}".encode()))
        staged.append(task.finish())
    committed = ExactlyOnceSink(group, group.store, sink_id, "out").commit_batch(batch_id, staged, "query-1")
    print(json.dumps({"committed": committed}), flush=True)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
