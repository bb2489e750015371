"""The datagen and directory sources: what they write is fixed by their input (a seed; the files), and a worker
restarted in the middle writes nothing twice and misses nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import fastavro

from onceflow.connect.app import ConnectWorker
from onceflow.connect.datagen import order
from onceflow.connector.store import open_store, read_stream
from tests.connect.conftest import client, wait_until


def stored(store_url: str, topic: str) -> list[dict[str, object]]:
    store = open_store(store_url)
    try:
        if topic not in store.list_streams():
            return []
        return [json.loads(m.value() or b"") for m in read_stream(store, topic)]
    finally:
        store.close()


JSON_VALUES = {"value.converter": "org.apache.kafka.connect.json.JsonConverter",
               "value.converter.schemas.enable": "false"}


def test_datagen_writes_its_seeded_orders_once_across_a_restart(worker_props: dict[str, str]) -> None:
    props = {**worker_props, **JSON_VALUES}
    connector = {"name": "gen", "connector.class": "Datagen", "topic": "orders", "seed": "42", "iterations": "3000",
                 "batch.size": "100", "tasks.max": "2"}
    with ConnectWorker(props) as worker:
        worker.add_connector(connector)
        wait_until(lambda: len(stored(props["store.url"], "orders")) >= 500, "some orders")
    with ConnectWorker(props) as worker:
        worker.add_connector(connector)
        wait_until(lambda: len(stored(props["store.url"], "orders")) == 6000, "every order of both tasks")
    got = stored(props["store.url"], "orders")
    assert sorted(got, key=lambda o: int(str(o["order_id"]))) == [order(42, task, i) for task in range(2)
                                                                   for i in range(3000)]


def write_files(directory: Path) -> None:
    (directory / "a.json").write_text("".join(json.dumps({"file": "a", "n": n}) + "\n" for n in range(300)))
    (directory / "b.csv").write_text("file,n\n" + "".join(f"b,{n}\n" for n in range(300)))
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "file", "type": "string"}, {"name": "n", "type": "long"}]})
    with open(directory / "c.avro", "wb") as out:
        fastavro.writer(out, schema, [{"file": "c", "n": n} for n in range(300)])
    (directory / "ignored.txt").write_text("not matched\n")
    old = time.time() - 60
    for path in directory.iterdir():
        os.utime(path, (old, old))


def test_a_directorys_files_are_each_read_once_across_a_restart(worker_props: dict[str, str],
                                                                tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_files(inbox)
    props = {**worker_props, **JSON_VALUES}
    connectors = [{"name": f"dir-{kind}", "connector.class": "DirectorySource", "input.path": str(inbox),
                   "input.file.pattern": rf".*\.{kind}", "format": kind, "topic": "rows", "batch.size": "50"}
                  for kind in ("json", "csv", "avro")]
    with ConnectWorker(props) as worker:
        for connector in connectors:
            worker.add_connector(connector)
        wait_until(lambda: len(stored(props["store.url"], "rows")) >= 300, "some rows")
    (inbox / "d.json").write_text(json.dumps({"file": "d", "n": 0}) + "\n")
    os.utime(inbox / "d.json", (time.time() - 60, time.time() - 60))
    with ConnectWorker(props) as worker:
        for connector in connectors:
            worker.add_connector(connector)
        rest = client(worker)

        def files_done() -> set[str]:
            return {o["partition"]["file"] for c in connectors
                    for o in rest.request("GET", f"/connectors/{c['name']}/offsets")[1]["offsets"]
                    if o["offset"]["done"]}
        # Records and offsets commit together: once every file's offset says done, every record is in.
        wait_until(lambda: files_done() == {"a.json", "b.csv", "c.avro", "d.json"}, "every file read")
    rows = stored(props["store.url"], "rows")
    assert sorted((r["file"], int(str(r["n"]))) for r in rows) == sorted(
        [(f, n) for f in "abc" for n in range(300)] + [("d", 0)])
