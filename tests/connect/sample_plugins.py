"""Plugins the tests register in code (``ConnectWorker(..., extra_plugins=...)``), as an application would."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from onceflow.connect.config_def import ConfigDef, Importance, Type
from onceflow.connect.connector import ExactlyOnceSupport, SinkConnector, SourceConnector
from onceflow.connect.records import SinkRecord, SourceRecord, replaced
from onceflow.connect.task import SinkTask, SourceTask
from onceflow.connector import TopicPartition
from onceflow.connector.errors import ErrorCode, fail

COUNTING = "tests.CountingSource"
COLLECTING = "tests.CollectingSink"
SPLIT = "tests.SplitSource"
COLLECTED: dict[str, list[SinkRecord]] = {}  # records each CollectingSink connector was handed, by its name


def _counting_def() -> ConfigDef:
    return (ConfigDef()
            .define("topic", Type.STRING, importance=Importance.HIGH)
            .define("count", Type.INT, "100")
            .define("batch", Type.INT, "10")
            .define("abort.every", Type.INT, "0", documentation="abort every N-th batch (connector boundaries)")
            .define("boundaries", Type.INT, "-1", documentation="end the transaction of this many batches only "
                    "(connector boundaries; -1: all)")
            .define("struct", Type.BOOLEAN, "false", documentation='values {"n": n, "note": "x"} instead of "n"')
            .define("skip.every", Type.INT, "0", documentation="a header 'skip' on every N-th record")
            .define("fail.polls", Type.INT, "0", documentation="the first N polls fail retriably"))


class _ExactlyOnceSource(SourceConnector):
    """A source connector keeping its props for its tasks, which support exactly-once."""

    def __init__(self) -> None:
        self._props: dict[str, str] = {}

    def version(self) -> str:
        return "1.0"

    def start(self, props: Mapping[str, str]) -> None:
        self._props = dict(props)

    def stop(self) -> None: ...

    def exactly_once_support(self, props: Mapping[str, str]) -> ExactlyOnceSupport:
        return ExactlyOnceSupport.SUPPORTED


class CountingSource(_ExactlyOnceSource):
    """Records ``n`` for n = 0..count-1, in batches; its offset is the next n."""

    def config(self) -> ConfigDef:
        return _counting_def()

    def task_class(self) -> type[CountingTask]:
        return CountingTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [dict(self._props)]

    def can_define_transaction_boundaries(self, props: Mapping[str, str]) -> bool:
        return True


class CountingTask(SourceTask):
    def __init__(self) -> None:
        self._idle = threading.Event()
        self.batches = 0

    def version(self) -> str:
        return "1.0"

    def start(self, props: Mapping[str, str]) -> None:
        values = _counting_def().parse(props)
        self._topic, self._count, self._batch = values["topic"], values["count"], values["batch"]
        self._abort_every, self._struct = values["abort.every"], values["struct"]
        self._boundaries = values["boundaries"]
        self._skip_every, self._failures = values["skip.every"], values["fail.polls"]
        committed = self.context.offset_storage_reader().offset({"source": "counter"})
        self._next = int(committed["next"]) if committed else 0

    def poll(self) -> list[SourceRecord] | None:
        if self._failures > 0:
            self._failures -= 1
            fail(ErrorCode._TRANSPORT, "the counter is unreachable for a moment", retriable=True)
        if self._next >= self._count:
            self._idle.wait(0.02)
            return None
        end = min(self._count, self._next + self._batch)
        records = [SourceRecord(source_partition={"source": "counter"}, source_offset={"next": n + 1},
                                topic=self._topic, value={"n": n, "note": "x"} if self._struct else str(n),
                                headers=(("skip", b"1"),) if self._skip_every and n % self._skip_every == 0 else ())
                   for n in range(self._next, end)]
        self._next = end
        self.batches += 1
        transactions = self.context.transaction_context()
        if transactions is not None and (self._boundaries < 0 or self.batches <= self._boundaries):
            if self._abort_every and self.batches % self._abort_every == 0:
                transactions.abort_transaction()
            else:
                transactions.commit_transaction(records[-1])
        return records

    def stop(self) -> None:
        self._idle.set()


class CollectingSink(SinkConnector):
    """Keeps what it is handed in :data:`COLLECTED`; flush fails while ``fail.flush`` is true."""

    def __init__(self) -> None:
        self._props: dict[str, str] = {}

    def version(self) -> str:
        return "1.0"

    def config(self) -> ConfigDef:
        return ConfigDef()

    def start(self, props: Mapping[str, str]) -> None:
        self._props = dict(props)

    def task_class(self) -> type[CollectingTask]:
        return CollectingTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [dict(self._props)]

    def stop(self) -> None: ...


class CollectingTask(SinkTask):
    def version(self) -> str:
        return "1.0"

    def start(self, props: Mapping[str, str]) -> None:
        self._name = props["name"]
        self._rewind_to = props.get("rewind.to")  # an offset to start every partition it is given at
        self._send_to = props.get("send.to")  # a stream each record is sent on to
        self._failures = int(props.get("fail.puts", "0"))  # the first N puts fail retriably, after their sends
        COLLECTED.setdefault(self._name, [])

    def open(self, partitions: Sequence[TopicPartition]) -> None:
        if self._rewind_to is not None:  # as a sink keeping its offsets outside Kafka does
            self.context.offset({TopicPartition(tp.topic, tp.partition): int(self._rewind_to) for tp in partitions})

    def put(self, records: Sequence[SinkRecord]) -> None:
        COLLECTED[self._name].extend(records)
        if self._send_to is not None:  # each record on to a stream, in the batch's transaction
            for record in records:
                self.context.send(replaced(record, topic=self._send_to, kafka_partition=None))
        if self._failures:  # after its sends, as a sink whose second write timed out does
            self._failures -= 1
            fail(ErrorCode._TIMED_OUT, "the target did not answer", retriable=True)

    def stop(self) -> None: ...


class SplitSource(_ExactlyOnceSource):
    """Two source partitions, "a" and "b", shared among up to two tasks; each task writes ``count`` records of each
    of its partitions, one a poll. With ``hold``, the task that has "b" alone holds its third poll until
    :data:`RELEASE_HELD` is set (:data:`HELD` says it waits): a task that a reconfiguration stopped, still running."""

    def config(self) -> ConfigDef:
        return ConfigDef()

    def task_class(self) -> type[SplitTask]:
        return SplitTask

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        tasks = min(max_tasks, 2)
        return [{**self._props, "parts": ",".join(p for i, p in enumerate("ab") if i % tasks == t)}
                for t in range(tasks)]


HELD, RELEASE_HELD, HELD_ENDED = threading.Event(), threading.Event(), threading.Event()


class SplitTask(SourceTask):
    def version(self) -> str:
        return "1.0"

    def start(self, props: Mapping[str, str]) -> None:
        self._parts, self._count, self._polls = props["parts"].split(","), int(props.get("count", "10")), 0
        self._hold = self._parts == ["b"] and props.get("hold") == "true"
        reader = self.context.offset_storage_reader()
        self._next = {p: int((reader.offset({"part": p}) or {"next": 0})["next"]) for p in self._parts}

    def poll(self) -> list[SourceRecord] | None:
        self._polls += 1
        if self._hold and self._polls == 3:
            HELD.set()
            RELEASE_HELD.wait(60)
        records = [SourceRecord(source_partition={"part": p}, source_offset={"next": n + 1}, topic="split",
                                value=f"{p}{n}") for p, n in self._next.items() if n < self._count]
        for record in records:
            self._next[record.source_partition["part"]] += 1
        if not records:
            time.sleep(0.02)
        return records or None

    def stop(self) -> None:
        if self._hold:
            HELD_ENDED.set()


PLUGINS = [(COUNTING, CountingSource), (COLLECTING, CollectingSink), (SPLIT, SplitSource)]
