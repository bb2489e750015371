"""Connect worker throughput: file source -> stream -> file sink, exactly-once against at-least-once, same run.

A standalone worker (in this process, on a fresh embedded store) runs a FileStreamSource (``batch.size`` lines per
poll) and a FileStreamSink; the time is from creating the connectors until the sink's file holds every line.
Baseline: ``exactly.once.source.support=disabled`` (records written as they come, offsets every
``offset.flush.interval.ms``); candidate: the default, each poll's records and its source offset in one
transaction. The sink commits each batch's offsets in a transaction in both (it has no other mode).

    python bench/connect_throughput.py [--records 200000] [--batch 2000]
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from pathlib import Path

from _report import report, row, timed

from onceflow.connect.app import ConnectWorker

VALUE = 100
_POLL_S = 0.02


def pipeline(directory: Path, records: int, batch: int, exactly_once: bool) -> int:
    """Run file -> stream -> file once; returns the records moved."""
    source, sink = directory / "in.txt", directory / "out.txt"
    line = "x" * (VALUE - 1)
    source.write_text("".join(f"{i:09d}{line[9:]}\n" for i in range(records)))
    expected = source.stat().st_size
    props = {"store.url": f"sqlite://{directory / 'store.db'}", "listeners": "http://127.0.0.1:0",
             "exactly.once.source.support": "enabled" if exactly_once else "disabled"}
    with ConnectWorker(props) as worker:
        worker.add_connector({"name": "src", "connector.class": "FileStreamSource", "file": str(source),
                              "topic": "lines", "batch.size": str(batch)})
        worker.add_connector({"name": "snk", "connector.class": "FileStreamSink", "file": str(sink),
                              "topics": "lines"})
        while not sink.exists() or os.path.getsize(sink) < expected:
            time.sleep(_POLL_S)
    if sink.read_bytes() != source.read_bytes():
        raise SystemExit(f"the sink's file differs from the source's ({'exactly' if exactly_once else 'at least'} "
                         "once)")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2000, help="the source's batch.size (lines per poll)")
    args = parser.parse_args()
    results = {}
    for exactly_once in (False, True):
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-connect-") as scratch:
            run = functools.partial(pipeline, Path(scratch), args.records, args.batch, exactly_once)
            results[exactly_once] = timed(run)
    baseline = "at-least-once"
    rows = [row(baseline, *results[False]), row("exactly-once", *results[True], baseline, results[False])]
    report("connect_throughput", rows, {"records": args.records, "batch": args.batch, "value_bytes": VALUE})


if __name__ == "__main__":
    main()
