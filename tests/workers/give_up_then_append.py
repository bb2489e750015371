"""Appends batch "a" (its append may report an error although it landed), gives up on it, then appends a
different batch "b" with the same writer; prints what each append returned.

Usage: give_up_then_append.py STORE_URL TOPIC
"""

from __future__ import annotations

import json
import sys

from onceflow.connector import KafkaException
from onceflow.connector.store import Record, open_store


def main(store_url: str, topic: str) -> None:
    writer = open_store(store_url).open_writer()
    outcome: dict[str, object] = {}
    try:
        outcome["a"] = writer.append(topic, 0, [Record(None, b"a")]).base_offset
    except KafkaException as exc:
        outcome["a"] = exc.code.name
    outcome["b"] = writer.append(topic, 0, [Record(None, b"b")]).base_offset
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
