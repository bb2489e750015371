"""A transactional producer committing numbered transactions; prints {"committed": n} as each commit returns.

Usage: txn_producer.py STORE_URL FIRST COUNT [leave-open|-] [TRANSACTIONAL_ID] [staged|-] [GROUP]
Transaction n writes RECORDS records "<n>:<i>" keyed "<n>-<i>" to "out", one record "<n>" to "audit", and
commits offset n + 1 of ("src", 0) for GROUP (default "copier"). With leave-open, one more transaction is begun and
staged, and the process exits without committing it. With staged, records are staged before each commit (else
the embedded store commits these small transactions in one step).
"""

from __future__ import annotations

import json
import os
import sys

from onceflow.connector import ConsumerGroupMetadata, Producer, TopicPartition

RECORDS = 20


def main(store_url: str, first: int, count: int, leave_open: bool, transactional_id: str, staged: bool,
         group: str) -> None:
    producer = Producer({"store.url": store_url, "transactional.id": transactional_id})
    producer.init_transactions()
    for n in range(first, first + count + (1 if leave_open else 0)):
        producer.begin_transaction()
        for i in range(RECORDS):
            producer.produce("out", f"{n}:{i}", key=f"{n}-{i}")
        producer.produce("audit", str(n), partition=0)
        producer.send_offsets_to_transaction([TopicPartition("src", 0, n + 1)], ConsumerGroupMetadata(group))
        if n == first + count:  # the one left open
            producer.flush()
            os._exit(0)
        if staged:
            producer.flush()
        producer.commit_transaction()
        print(json.dumps({"committed": n}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), len(sys.argv) > 4 and sys.argv[4] == "leave-open",
         sys.argv[5] if len(sys.argv) > 5 else "crash-app", len(sys.argv) > 6 and sys.argv[6] == "staged",
         sys.argv[7] if len(sys.argv) > 7 else "copier")
