"""Runs one store operation, for crash tests that kill a process inside it.

Usage: store_op.py STORE_URL scale TOPIC PARTITIONS | open_writer WRITER_ID | commit GROUP TOPIC PARTITION OFFSET
"""

from __future__ import annotations

import sys

from onceflow.connector.store import open_store


def main(store_url: str, op: str, *args: str) -> None:
    store = open_store(store_url)
    if op == "scale":
        store.scale_stream(args[0], int(args[1]))
    elif op == "open_writer":
        store.open_writer(args[0])
    elif op == "commit":
        store.commit_offsets(args[0], {(args[1], int(args[2])): int(args[3])})
    else:
        raise SystemExit(f"unknown op {op}")
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *sys.argv[3:])
