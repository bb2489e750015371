"""``DirectorySource``: every file of a directory, once: JSON lines, CSV (with a header row) or Avro container files.

Keys: ``input.path`` (the directory), ``input.file.pattern`` (a regular expression the whole file name matches),
``format`` (json, csv, avro), ``topic``, ``file.minimum.age.ms`` (a file younger than this may still be written:
it waits), ``batch.size``. Files are read in name order; each record's source partition is its file's name and
its offset the number of records read from that file so far, so a task resumed after a crash goes on with the
record after the last committed one, and a file read to its end (``{"done": true}``) is never read again.
"""

from __future__ import annotations

import csv
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fastavro

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, Importance, Type, at_least, non_empty, one_of, regex
from onceflow.connect.connector import ExactlyOnceSupport, SameConfig, SourceConnector
from onceflow.connect.records import SourceRecord
from onceflow.connect.task import SourceTask
from onceflow.connector.errors import ErrorCode, fail

_IDLE_S = 0.1


def _definition() -> ConfigDef:
    return (ConfigDef()
            .define("input.path", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                    documentation="The directory whose files are read")
            .define("input.file.pattern", Type.STRING, ".*", regex, Importance.MEDIUM,
                    "A regular expression file names must match wholly")
            .define("format", Type.STRING, "json", one_of("json", "csv", "avro"), Importance.HIGH,
                    "json: one JSON document per line; csv: a header row, then rows; avro: an Avro container file")
            .define("topic", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                    documentation="The topic to write to")
            .define("file.minimum.age.ms", Type.LONG, "1000", at_least(0), Importance.LOW,
                    "A file modified more recently than this may still be written: it is read later")
            .define("batch.size", Type.INT, "1000", at_least(1), Importance.LOW, "Records per poll at most"))


def read_records(path: Path, kind: str) -> Iterator[Any]:
    """A file's records in order; INVALID_RECORD naming the file and line for one that is not ``kind``."""
    if kind == "avro":
        with open(path, "rb") as handle:
            try:
                yield from fastavro.reader(handle)
            except (ValueError, EOFError) as exc:
                fail(ErrorCode.INVALID_RECORD, f"{path}: not an Avro container file: {exc}")
        return
    with open(path, encoding="utf-8", newline="") as handle:
        if kind == "csv":
            yield from csv.DictReader(handle)
            return
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    fail(ErrorCode.INVALID_RECORD, f"{path}:{number}: not JSON: {exc}")


class DirectorySourceConnector(SameConfig, SourceConnector):
    """One task reading the directory's files."""

    one_task = True

    def config(self) -> ConfigDef:
        return _definition()

    def task_class(self) -> type[DirectorySourceTask]:
        return DirectorySourceTask

    def exactly_once_support(self, props: Mapping[str, str]) -> ExactlyOnceSupport:
        return ExactlyOnceSupport.SUPPORTED


class DirectorySourceTask(SourceTask):
    def __init__(self) -> None:
        self._idle = threading.Event()
        self._file: str | None = None
        self._values: Iterator[Any] = iter(())
        self._ahead: Any = _END  # the file's next record, read one ahead to know which is its last
        self._read = 0  # records of the file taken so far

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        self._settings = _definition().parse(props)
        self._directory = Path(self._settings["input.path"])
        self._pattern = re.compile(self._settings["input.file.pattern"])
        self._finished: set[str] = set()

    def poll(self) -> list[SourceRecord] | None:
        records: list[SourceRecord] = []
        while len(records) < self._settings["batch.size"] and (self._file is not None or self._next_file()):
            value, self._ahead = self._ahead, next(self._values, _END)
            if value is _END:  # an empty file
                self._close_file()
                continue
            self._read += 1
            last = self._ahead is _END
            records.append(SourceRecord(source_partition={"file": self._file},
                                        source_offset={"record": self._read, "done": last},
                                        topic=self._settings["topic"], value=value))
            if last:
                self._close_file()
        if not records:
            self._idle.wait(_IDLE_S)
        return records

    def _close_file(self) -> None:
        if self._file is not None:
            self._finished.add(self._file)
        self._file, self._values, self._ahead = None, iter(()), _END

    def _next_file(self) -> bool:
        """Open the first file not yet read to its end (after its committed records); False if there is none."""
        reader = self.context.offset_storage_reader()
        cutoff = time.time() - self._settings["file.minimum.age.ms"] / 1000
        for path in sorted(self._directory.iterdir()) if self._directory.is_dir() else []:
            name = path.name
            if name in self._finished or not self._pattern.fullmatch(name) or not path.is_file():
                continue
            committed = reader.offset({"file": name}) or {}
            if committed.get("done"):
                self._finished.add(name)
                continue
            if os.path.getmtime(path) > cutoff:
                continue
            self._values = read_records(path, self._settings["format"])
            self._read = int(committed.get("record", 0))
            for _ in range(self._read):
                next(self._values, None)
            self._file, self._ahead = name, next(self._values, _END)
            return True
        return False

    def stop(self) -> None:
        self._idle.set()


_END = object()
