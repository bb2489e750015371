"""A worker's config: Kafka Connect's worker keys where they apply, checked strictly.

``store.url`` takes the place of ``bootstrap.servers`` (which is refused, naming its replacement). Keys under
``key.converter.`` / ``value.converter.`` configure the worker's converters, keys under ``producer.`` /
``consumer.`` go to the clients of every task (on kafka:// they reach librdkafka); any other unknown key is
INVALID_CONFIG naming it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from onceflow.connect.config_def import NO_DEFAULT, ConfigDef, Importance, Type, at_least, non_empty, one_of
from onceflow.connect.plugins import prefixed
from onceflow.connector.config import DEFAULT_STORE_URL
from onceflow.connector.errors import ErrorCode, fail

DEFAULT_LISTENER = "http://127.0.0.1:8083"
DEFAULT_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
CLIENT_PREFIXES = ("producer.", "consumer.", "key.converter.", "value.converter.")


class Mode(enum.Enum):
    STANDALONE = "standalone"
    DISTRIBUTED = "distributed"


def _definition(mode: Mode) -> ConfigDef:
    distributed = mode is Mode.DISTRIBUTED
    d = ConfigDef()
    d.define("store.url", Type.STRING, DEFAULT_STORE_URL, non_empty, Importance.HIGH, "The store: sqlite://PATH or "
             "kafka://HOST:PORT[,...][/NAMESPACE] (in place of bootstrap.servers).")
    d.define("group.id", Type.STRING, NO_DEFAULT if distributed else None, non_empty, Importance.HIGH,
             "distributed: the cluster of workers this one joins.")
    for kind, partitions in (("config", 1), ("offset", 25), ("status", 5)):
        d.define(f"{kind}.storage.topic", Type.STRING, f"connect-{kind}s" if kind != "status" else "connect-status",
                 non_empty, Importance.HIGH, f"The stream that keeps connector {kind}s.")
        d.define(f"{kind}.storage.replication.factor", Type.SHORT, "-1", at_least(-1), Importance.LOW,
                 f"kafka://: copies of {kind}.storage.topic (-1: the cluster's default).")
        if kind != "config":
            d.define(f"{kind}.storage.partitions", Type.INT, str(partitions), at_least(1), Importance.LOW,
                     f"Partitions of {kind}.storage.topic when the worker creates it.")
    d.define("offset.storage.file.filename", Type.STRING, "", None, Importance.LOW, "standalone with "
             "exactly.once.source.support=disabled: keep source offsets in this file instead of the offsets stream.")
    d.define("key.converter", Type.CLASS, DEFAULT_CONVERTER, None, Importance.HIGH, "Converter of record keys.")
    d.define("value.converter", Type.CLASS, DEFAULT_CONVERTER, None, Importance.HIGH, "Converter of record values.")
    d.define("header.converter", Type.CLASS, "org.apache.kafka.connect.storage.SimpleHeaderConverter",
             one_of("org.apache.kafka.connect.storage.SimpleHeaderConverter",
                    "org.apache.kafka.connect.converters.ByteArrayConverter", case_sensitive=True),
             Importance.LOW, "Accepted for compatibility: header values stay the bytes a stream stores.")
    d.define("listeners", Type.LIST, DEFAULT_LISTENER, None, Importance.LOW, "The REST API's address "
             "(http://HOST:PORT; port 0 picks a free one). Another host than 127.0.0.1 is an explicit choice.")
    d.define("rest.advertised.host.name", Type.STRING, None, None, Importance.LOW, "The host other workers reach "
             "this one at (default: the listener's).")
    d.define("rest.advertised.port", Type.INT, None, None, Importance.LOW, "The port other workers reach this one "
             "at (default: the listener's).")
    d.define("rest.auth.token", Type.PASSWORD, "", None, Importance.MEDIUM, "If set, every REST request must carry "
             "'Authorization: Bearer <token>' (401 otherwise).")
    d.define("plugin.path", Type.LIST, "", None, Importance.LOW, "Directories with installed distributions whose "
             "onceflow.connect.plugins entry points count too (pip install --target DIR).")
    d.define("exactly.once.source.support", Type.STRING, "enabled", one_of("enabled", "preparing", "disabled"),
             Importance.HIGH, "enabled: a source task's records and offsets commit in one transaction; disabled "
             "(or preparing): records are written, offsets committed every offset.flush.interval.ms after them "
             "(at-least-once).")
    d.define("offset.flush.interval.ms", Type.LONG, "60000", at_least(1), Importance.LOW, "How often offsets are "
             "committed without exactly-once, and the default transaction.boundary.interval.ms.")
    d.define("task.shutdown.graceful.timeout.ms", Type.LONG, "5000", at_least(0), Importance.LOW, "How long the "
             "worker waits for its tasks to stop.")
    d.define("transaction.group", Type.STRING, "default", non_empty, Importance.LOW, "The onceflow transaction "
             "group the tasks' transactions are coordinated in.")
    d.define("session.timeout.ms", Type.INT, "10000", at_least(1), Importance.HIGH, "distributed: a worker "
             "silent this long leaves the group; its connectors and tasks move to the others.")
    d.define("heartbeat.interval.ms", Type.INT, "3000", at_least(1), Importance.HIGH, "distributed: how often a "
             "worker renews its membership.")
    d.define("scheduled.rebalance.max.delay.ms", Type.INT, "300000", at_least(0), Importance.LOW, "distributed: "
             "how long the work of a departed worker waits for it to come back before it moves (KIP-415).")
    return d


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """A checked worker config: the parsed values and the raw properties they came from."""

    mode: Mode
    values: Mapping[str, Any]
    props: Mapping[str, str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def store_url(self) -> str:
        return str(self.values["store.url"])

    @property
    def exactly_once(self) -> bool:
        return bool(self.values["exactly.once.source.support"] == "enabled")

    @property
    def listener(self) -> tuple[str, int]:
        """(host, port) of the REST API."""
        url = urlsplit(self.values["listeners"][0])
        if url.scheme != "http" or url.port is None:
            fail(ErrorCode.INVALID_CONFIG, f"listeners: expected http://HOST:PORT, got {self.values['listeners'][0]!r}"
                 " (https is not served; put a TLS proxy in front)")
        return url.hostname or "127.0.0.1", url.port

    def client_props(self, client: str) -> dict[str, str]:
        """Keys under ``producer.`` or ``consumer.``, without the prefix, for the tasks' clients."""
        return prefixed(self.props, f"{client}.")

    def converter_props(self, which: str) -> dict[str, str]:
        return prefixed(self.props, f"{which}.converter.")


def worker_config(props: Mapping[str, str], mode: Mode) -> WorkerConfig:
    """Check ``props``; INVALID_CONFIG naming the first bad key."""
    if "bootstrap.servers" in props:
        fail(ErrorCode.INVALID_CONFIG, "bootstrap.servers: onceflow's worker takes store.url instead, e.g. "
             f"store.url=kafka://{props['bootstrap.servers'].split(',')[0]}")
    definition = _definition(mode)
    known = definition.config_keys()
    for key in props:
        if key not in known and not key.startswith(CLIENT_PREFIXES):
            fail(ErrorCode.INVALID_CONFIG, f"unknown worker config key {key!r}; known keys: {sorted(known)} and "
                 f"keys under {list(CLIENT_PREFIXES)}")
    if mode is Mode.STANDALONE and "group.id" in props:
        fail(ErrorCode.INVALID_CONFIG, "group.id: a standalone worker joins no group (run `onceflow connect "
             "distributed` for that)")
    config = WorkerConfig(mode, definition.parse(props), dict(props))
    config.listener  # noqa: B018 - checked now, not when the server starts
    return config
