"""``StreamSink``: copies consumed records into another stream of the worker's store, exactly once.

Each consumed record is written to ``topic.format`` (``${topic}`` is the record's topic) through
:meth:`SinkTaskContext.send`, so the copies and the consumed offsets commit in one transaction: a crash or a
restart never copies a record twice or skips one. Keys, values and headers keep their bytes with the
``ByteArrayConverter`` (any converter pair that round-trips works).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, Importance, Type, non_empty
from onceflow.connect.connector import SameConfig, SinkConnector
from onceflow.connect.records import SinkRecord, replaced
from onceflow.connect.task import SinkTask


def _definition() -> ConfigDef:
    return ConfigDef().define("topic.format", Type.STRING, "${topic}-copy", non_empty, Importance.HIGH,
                              "The stream each record is copied to; ${topic} is the stream it was read from")


class StreamSinkConnector(SameConfig, SinkConnector):
    """Up to ``tasks.max`` tasks copying ``topics`` (or ``topics.regex``) into ``topic.format``."""

    def config(self) -> ConfigDef:
        return _definition()

    def task_class(self) -> type[StreamSinkTask]:
        return StreamSinkTask


class StreamSinkTask(SinkTask):
    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        self._format = _definition().parse(props)["topic.format"]

    def put(self, records: Sequence[SinkRecord]) -> None:
        for record in records:
            self.context.send(replaced(record, topic=self._format.replace("${topic}", record.topic),
                                       kafka_partition=None))

    def stop(self) -> None: ...
