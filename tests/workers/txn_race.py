"""One side of a commit racing a timeout: ``commit`` commits TXN_ID at AT (a wall-clock time, seconds), and
``expire`` aborts expired transactions of the group in a loop from AT - 0.05 s for 0.2 s.

Usage: txn_race.py STORE_URL GROUP commit|expire TXN_ID AT PARTICIPANT_JSON
Prints {"committed": true} or {"error": NAME} (commit), or {"expired": [ids]} (expire).
"""

from __future__ import annotations

import json
import sys
import time

from onceflow import txn
from onceflow.connector import KafkaException


def main(store_url: str, group_name: str, side: str, txn_id: str, at: float, participant_json: str) -> None:
    group = txn.open_group({"store.url": store_url, "transaction.group": group_name})
    if side == "commit":
        time.sleep(max(0.0, at - time.time()))
        try:
            group.commit(txn_id, [txn.Participant(**json.loads(participant_json))])
            print(json.dumps({"committed": True}), flush=True)
        except KafkaException as exc:
            print(json.dumps({"error": exc.code.name}), flush=True)
    else:
        time.sleep(max(0.0, at - 0.05 - time.time()))
        expired: list[str] = []
        until = time.time() + 0.2
        while time.time() < until:
            expired += group.expire()
        print(json.dumps({"expired": expired}), flush=True)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6])
