"""``DatagenSource``: generated orders, seeded (the same seed gives the same records) and rate-limited.

Keys: ``topic``, ``iterations`` (records per task; -1: forever), ``seed``, ``max.records.per.second`` (per task;
0: as fast as it goes), ``batch.size``. Record *i* of a task is a function of (seed, task, i) alone and its
source offset is ``{"iteration": i + 1}``, so a task resumed after a crash goes on with exactly the records that
follow the last committed one: with the worker's transactions, each generated record lands once.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping

from onceflow import __version__
from onceflow.connect.config_def import ConfigDef, Importance, Type, at_least, non_empty
from onceflow.connect.connector import ExactlyOnceSupport, SameConfig, SourceConnector
from onceflow.connect.records import Field, Schema, SourceRecord
from onceflow.connect.task import SourceTask

ORDER = Schema("struct", name="Order", fields=(
    Field("order_id", Schema("int64")), Field("customer", Schema("string")), Field("item", Schema("string")),
    Field("quantity", Schema("int32")), Field("price", Schema("float64"))))
ITEMS = ("apple", "bread", "cheese", "dates", "eggs", "figs", "grapes", "honey")
_IDLE_S = 0.05


def _definition() -> ConfigDef:
    return (ConfigDef()
            .define("topic", Type.STRING, validator=non_empty, importance=Importance.HIGH,
                    documentation="The topic to write to")
            .define("iterations", Type.LONG, "-1", at_least(-1), Importance.MEDIUM,
                    "Records each task generates (-1: no end)")
            .define("seed", Type.LONG, "0", None, Importance.MEDIUM, "The same seed gives the same records")
            .define("max.records.per.second", Type.DOUBLE, "0", at_least(0), Importance.MEDIUM,
                    "Per task; 0: no limit")
            .define("batch.size", Type.INT, "500", at_least(1), Importance.LOW, "Records per poll at most"))


def order(seed: int, task: int, i: int) -> dict[str, object]:
    """Record ``i`` of ``task`` under ``seed``: always the same."""
    rng = random.Random(f"{seed}/{task}/{i}")
    return {"order_id": task * 10**12 + i, "customer": f"customer-{rng.randrange(1000):03d}",
            "item": rng.choice(ITEMS), "quantity": rng.randint(1, 9), "price": round(rng.uniform(0.5, 50), 2)}


class DatagenConnector(SameConfig, SourceConnector):
    """``tasks.max`` tasks, each generating its own orders."""

    def config(self) -> ConfigDef:
        return _definition()

    def task_configs(self, max_tasks: int) -> list[dict[str, str]]:
        return [{**c, "task.index": str(i)} for i, c in enumerate(super().task_configs(max_tasks))]

    def task_class(self) -> type[DatagenTask]:
        return DatagenTask

    def exactly_once_support(self, props: Mapping[str, str]) -> ExactlyOnceSupport:
        return ExactlyOnceSupport.SUPPORTED


class DatagenTask(SourceTask):
    def __init__(self) -> None:
        self._idle = threading.Event()

    def version(self) -> str:
        return __version__

    def start(self, props: Mapping[str, str]) -> None:
        values = _definition().parse(props)
        self._topic, self._seed, self._batch = values["topic"], values["seed"], values["batch.size"]
        self._end, self._rate = values["iterations"], values["max.records.per.second"]
        self._task = int(props.get("task.index", "0"))
        self._partition = {"datagen": self._task}
        committed = self.context.offset_storage_reader().offset(self._partition)
        self._next = int(committed["iteration"]) if committed else 0
        self._started, self._first = time.monotonic(), self._next

    def poll(self) -> list[SourceRecord] | None:
        count = self._batch if self._end < 0 else min(self._batch, self._end - self._next)
        if self._rate > 0:
            allowed = int((time.monotonic() - self._started) * self._rate) - (self._next - self._first)
            count = min(count, allowed)
        if count <= 0:
            self._idle.wait(_IDLE_S)
            return None
        orders = [order(self._seed, self._task, i) for i in range(self._next, self._next + count)]
        records = [SourceRecord(source_partition=self._partition, source_offset={"iteration": self._next + n + 1},
                                topic=self._topic, key=value["customer"], value_schema=ORDER, value=value)
                   for n, value in enumerate(orders)]
        self._next += count
        return records

    def stop(self) -> None:
        self._idle.set()
