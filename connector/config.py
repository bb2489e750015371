"""Typed, frozen configuration objects built from the dotted dicts users pass (librdkafka's keys).

Every key a component accepts is a field here with its default and meaning; an unknown key or a value of the
wrong type raises INVALID_CONFIG naming the key, before anything is opened or written.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from onceflow.connector.errors import ErrorCode, KafkaError, fail

DEFAULT_STORE_URL = "sqlite://onceflow.db"
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")

T = TypeVar("T")


def key(name: str, doc: str) -> dict[str, str]:
    """Field metadata: the dotted config key and what it means."""
    return {"key": name, "doc": doc}


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """Which store backs a client and how it is opened."""

    url: str = dataclasses.field(
        default=DEFAULT_STORE_URL,
        metadata=key("store.url", "sqlite://PATH (embedded, the default) picks the backend"),
    )
    sqlite_synchronous: str = dataclasses.field(
        default="full",
        metadata=key(
            "store.sqlite.synchronous",
            "full: an acknowledged append survives power loss; normal: survives process crashes only",
        ),
    )
    busy_timeout_ms: int = dataclasses.field(
        default=30_000, metadata=key("store.busy.timeout.ms", "how long a write waits for a store lock")
    )
    connect_timeout_ms: int = dataclasses.field(
        default=10_000,
        metadata=key("store.connect.timeout.ms", "kafka://: how long the broker may take to answer before _TRANSPORT"),
    )
    message_max_bytes: int = dataclasses.field(
        default=1_000_000, metadata=key("message.max.bytes", "largest record (key+value+headers) accepted")
    )
    allow_visible_aborts: bool = dataclasses.field(
        default=False,
        metadata=key("store.kafka.allow.visible.aborts", "kafka://: allow CAS and transactions on a broker that shows "
                     "aborted records to read_committed readers (their guarantees do not hold there)"),
    )
    kafka_settings: tuple[tuple[str, Any], ...] = ()
    """kafka:// only: every other key of the client's config, passed to librdkafka as it is."""

    def __post_init__(self) -> None:
        if self.sqlite_synchronous not in ("full", "normal"):
            fail(ErrorCode.INVALID_CONFIG, f"store.sqlite.synchronous must be full or normal, "
                 f"got {self.sqlite_synchronous!r}")
        positive(self, "busy_timeout_ms", "connect_timeout_ms", "message_max_bytes")


@dataclasses.dataclass(frozen=True)
class TransactionConfig:
    """How a process reaches its transaction group: the group's commit log, its batching, staging and metrics."""

    group: str = dataclasses.field(
        default="default",
        metadata=key("transaction.group", "the transaction group (one commit log) transactions are coordinated in"),
    )
    log_batching: bool = dataclasses.field(
        default=True,
        metadata=key("transaction.log.batching", "write the commit log through the batched writer (PIP-160)"),
    )
    log_batch_max_records: int = dataclasses.field(
        default=512, metadata=key("transaction.log.batch.max.records", "flush a batched entry at this many records")
    )
    log_batch_max_bytes: int = dataclasses.field(
        default=4 * 1024 * 1024,
        metadata=key("transaction.log.batch.max.bytes", "flush a batched entry at this many bytes"),
    )
    log_batch_max_delay_ms: float = dataclasses.field(
        default=0.0,
        metadata=key("transaction.log.batch.max.delay.ms", "flush a batched entry when its oldest record is this old; "
                     "0: at once, and records that come while an entry is being written share the next one"),
    )
    log_truncate_every_entries: int = dataclasses.field(
        default=1024,
        metadata=key("transaction.log.truncate.every.entries", "each time the merge moves this many commit-log "
                     "entries on, a process truncates the log and staging up to what every transaction may still need"),
    )
    log_truncate_delay_ms: int = dataclasses.field(
        default=60_000,
        metadata=key("transaction.log.truncate.delay.ms", "commit-log entries are cut only this long after a "
                     "truncation found them finished, so a process that wrote one has read it back by then"),
    )
    staging_partitions: int = dataclasses.field(
        default=4,
        metadata=key("transaction.staging.partitions", "partitions of the group's staging stream (made once)"),
    )
    metrics_port: int = dataclasses.field(
        default=0,
        metadata=key("metrics.port", "serve Prometheus metrics on metrics.host:PORT; 0 turns the endpoint off; a port "
                     "in use is INVALID_CONFIG at init_transactions()"),
    )
    metrics_host: str = dataclasses.field(
        default="127.0.0.1",
        metadata=key("metrics.host", "the address the metrics endpoint binds (0.0.0.0: every interface)"),
    )

    def __post_init__(self) -> None:
        if not _GROUP_NAME.match(self.group):
            fail(ErrorCode.INVALID_CONFIG, f"transaction.group must be 1-100 of [A-Za-z0-9_-], got {self.group!r}")
        positive(self, "log_batch_max_records", "log_batch_max_bytes", "staging_partitions",
                 "log_truncate_every_entries")
        non_negative(self, "metrics_port", "log_truncate_delay_ms", "log_batch_max_delay_ms")
        if not self.metrics_host:
            fail(ErrorCode.INVALID_CONFIG, "metrics.host must be a host name or address, got ''")


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """What a client reports outside its calls, as librdkafka's callbacks: errors, statistics and log lines.

    Served from the client's own calls (``poll``, ``flush``, ``consume``), never from another thread, as
    confluent-kafka serves them."""

    error_cb: Callable[..., Any] | None = dataclasses.field(
        default=None,
        metadata=key("error_cb", "error_cb(KafkaError): errors the client meets outside a call's own result: one "
                     "it retries and recovers from, a fatal one (the producer was fenced), an auto-commit the "
                     "group refused; without it they are logged"),
    )
    stats_cb: Callable[..., Any] | None = dataclasses.field(
        default=None,
        metadata=key("stats_cb", "stats_cb(json_str) every statistics.interval.ms, from poll(): librdkafka's "
                     "statistics JSON for the figures onceflow has (name, client_id, type, ts, time, age, msg_cnt, "
                     "txmsgs, rxmsgs, topics with per-partition figures)"),
    )
    statistics_interval_ms: int = dataclasses.field(
        default=0, metadata=key("statistics.interval.ms", "how often stats_cb is called; 0 (default): never")
    )
    logger: logging.Logger | None = dataclasses.field(
        default=None,
        metadata=key("logger", "a logging.Logger (or LoggerAdapter) for the client's log lines; default: the "
                     "client module's logger"),
    )
    debug: str = dataclasses.field(
        default="",
        metadata=key("debug", "librdkafka's debug contexts (e.g. all, msg, consumer): any makes the client log "
                     "its debug lines (each batch appended, each fetch, each assignment) to logger"),
    )

    def __post_init__(self) -> None:
        non_negative(self, "statistics_interval_ms")


_client_numbers = itertools.count(1)


class ClientEvents:
    """A client's outlet for what :class:`ClientConfig` configures: error_cb, stats_cb (timed), log lines."""

    def __init__(self, config: ClientConfig, client_id: str, kind: str, default_log: logging.Logger) -> None:
        self._config = config
        self.name = f"{client_id}#{kind}-{next(_client_numbers)}"
        self._client_id = client_id
        self._kind = kind
        self.log: logging.Logger | logging.LoggerAdapter[logging.Logger] = config.logger or default_log
        self._started = time.monotonic()
        interval = config.statistics_interval_ms / 1000
        self._interval = interval if config.stats_cb is not None and interval > 0 else None
        self._next_stats = self._started + interval
        self.collecting = self._interval is not None
        """True when stats_cb is on: clients count what they return only then."""

    def error(self, error: KafkaError, logged: bool = False) -> None:
        """Hand ``error`` to error_cb; without one, log it (as librdkafka does) unless the caller ``logged`` it."""
        if self._config.error_cb is not None:
            self._config.error_cb(error)
        elif not logged:
            self.log.error("%s: %s", self.name, error)

    def debug(self, line: str, *args: object) -> None:
        """A debug line, logged only when ``debug`` names any context, as librdkafka's."""
        if self._config.debug:
            self.log.debug("%s: " + line, self.name, *args)

    def stats_due(self) -> bool:
        """True when stats_cb should be called now (cheap: one clock read, or none without stats_cb)."""
        return self._interval is not None and time.monotonic() >= self._next_stats

    def emit_stats(self, figures: Mapping[str, Any]) -> None:
        """Call stats_cb with librdkafka's statistics JSON: its header fields, then ``figures``."""
        if self._interval is None or self._config.stats_cb is None:
            return
        now = time.monotonic()
        self._next_stats = now + self._interval
        document = {"name": self.name, "client_id": self._client_id, "type": self._kind,
                    "ts": int(now * 1_000_000), "time": int(time.time()), "age": int((now - self._started) * 1e6),
                    **figures}
        self._config.stats_cb(json.dumps(document))


@dataclasses.dataclass(frozen=True)
class TransactionGroupConfig:
    """What ``onceflow.txn.open_group`` needs: the store and the group's settings."""

    store: StoreConfig
    transactions: TransactionConfig = dataclasses.field(default_factory=TransactionConfig)


@dataclasses.dataclass(frozen=True)
class ProducerConfig:
    """Producer settings (librdkafka names) plus onceflow's ``writer.id``."""

    store: StoreConfig
    client_id: str = dataclasses.field(default="onceflow", metadata=key("client.id", "name in logs"))
    writer_id: str | None = dataclasses.field(
        default=None,
        metadata=key("writer.id", "makes this a fenced epoch writer: a newer producer with the same id fences it"),
    )
    enable_idempotence: bool = dataclasses.field(
        default=True, metadata=key("enable.idempotence", "retries never duplicate: always so, whatever it says "
                                   "(false only allows duplicates, and onceflow writes none)")
    )
    linger_ms: int = dataclasses.field(
        default=5, metadata=key("linger.ms", "how long a record may wait to fill a batch")
    )
    batch_num_messages: int = dataclasses.field(
        default=10_000, metadata=key("batch.num.messages", "records per stored batch at most")
    )
    batch_size: int = dataclasses.field(
        default=1_000_000, metadata=key("batch.size", "bytes per stored batch at most")
    )
    queue_buffering_max_messages: int = dataclasses.field(
        default=100_000,
        metadata=key("queue.buffering.max.messages", "records awaiting a delivery report before BufferError"),
    )
    delivery_timeout_ms: int = dataclasses.field(
        default=120_000, metadata=key("delivery.timeout.ms", "how long a retriable append is retried")
    )
    on_delivery: Callable[..., Any] | None = dataclasses.field(
        default=None, metadata=key("on_delivery", "default delivery report callback(err, msg)")
    )
    transactional_id: str | None = dataclasses.field(
        default=None,
        metadata=key("transactional.id", "makes this a transactional producer; init_transactions fences older ones"),
    )
    transaction_timeout_ms: int = dataclasses.field(
        default=60_000,
        metadata=key("transaction.timeout.ms", "a transaction not committed this long after it began is aborted "
                     "(no upper limit)"),
    )
    transactions: TransactionConfig = dataclasses.field(default_factory=TransactionConfig)
    client: ClientConfig = dataclasses.field(default_factory=ClientConfig)

    def __post_init__(self) -> None:
        if self.writer_id is not None and self.transactional_id is not None:
            fail(ErrorCode.INVALID_CONFIG, "set writer.id or transactional.id, not both: a transactional producer is "
                 "already fenced by its transactional.id")
        if self.transaction_timeout_ms <= 0:
            fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT, f"transaction.timeout.ms must be > 0, got "
                 f"{self.transaction_timeout_ms}")
        positive(self, "batch_num_messages", "batch_size", "queue_buffering_max_messages", "delivery_timeout_ms")
        non_negative(self, "linger_ms")


OFFSET_RESET_ALIASES = {
    "earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
    "latest": "latest", "largest": "latest", "end": "latest",
    "error": "error",
}


@dataclasses.dataclass(frozen=True)
class ConsumerConfig:
    """Consumer settings, librdkafka names and defaults."""

    store: StoreConfig
    client_id: str = dataclasses.field(default="onceflow", metadata=key("client.id", "name in logs"))
    group_id: str | None = dataclasses.field(
        default=None, metadata=key("group.id", "consumer group; required for subscribe() and commit()")
    )
    auto_offset_reset: str = dataclasses.field(
        default="latest",
        metadata=key("auto.offset.reset", "where to start without a committed offset: earliest|latest|error"),
    )
    enable_auto_commit: bool = dataclasses.field(
        default=True, metadata=key("enable.auto.commit", "commit positions periodically and on revoke/close")
    )
    auto_commit_interval_ms: int = dataclasses.field(
        default=5_000, metadata=key("auto.commit.interval.ms", "period of automatic commits")
    )
    enable_auto_offset_store: bool = dataclasses.field(
        default=True, metadata=key("enable.auto.offset.store", "store each record's offset as it is returned "
                                   "(what commits without offsets commit); false: the application stores them "
                                   "with store_offsets()")
    )
    session_timeout_ms: int = dataclasses.field(
        default=45_000, metadata=key("session.timeout.ms", "a member silent this long is removed from its group")
    )
    heartbeat_interval_ms: int = dataclasses.field(
        default=3_000, metadata=key("heartbeat.interval.ms", "how often membership is renewed and rebalances seen")
    )
    max_poll_interval_ms: int = dataclasses.field(
        default=300_000,
        metadata=key("max.poll.interval.ms", "a member that does not poll this long leaves its group"),
    )
    isolation_level: str = dataclasses.field(
        default="read_committed",
        metadata=key("isolation.level", "read_committed|read_uncommitted"),
    )
    enable_partition_eof: bool = dataclasses.field(
        default=False, metadata=key("enable.partition.eof", "emit a _PARTITION_EOF event at each partition's end")
    )
    client: ClientConfig = dataclasses.field(default_factory=ClientConfig)

    def __post_init__(self) -> None:
        reset = OFFSET_RESET_ALIASES.get(self.auto_offset_reset)
        if reset is None:
            fail(ErrorCode.INVALID_CONFIG, f"auto.offset.reset must be one of {sorted(OFFSET_RESET_ALIASES)}, "
                 f"got {self.auto_offset_reset!r}")
        object.__setattr__(self, "auto_offset_reset", reset)
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            fail(ErrorCode.INVALID_CONFIG, f"isolation.level must be read_committed or read_uncommitted, "
                 f"got {self.isolation_level!r}")
        positive(self, "auto_commit_interval_ms", "session_timeout_ms", "heartbeat_interval_ms",
                 "max_poll_interval_ms")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            fail(ErrorCode.INVALID_CONFIG, f"heartbeat.interval.ms ({self.heartbeat_interval_ms}) must be lower "
                 f"than session.timeout.ms ({self.session_timeout_ms})")


@dataclasses.dataclass(frozen=True)
class AdminConfig:
    """AdminClient settings."""

    store: StoreConfig
    client_id: str = dataclasses.field(default="onceflow", metadata=key("client.id", "name in logs"))
    client: ClientConfig = dataclasses.field(default_factory=ClientConfig)


def positive(obj: object, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            fail(ErrorCode.INVALID_CONFIG, f"{config_key(type(obj), name)} must be > 0, got {getattr(obj, name)}")


def non_negative(obj: object, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < 0:
            fail(ErrorCode.INVALID_CONFIG, f"{config_key(type(obj), name)} must be >= 0, got {getattr(obj, name)}")


def config_key(cls: type, field_name: str) -> str:
    for f in dataclasses.fields(cls):
        if f.name == field_name:
            return str(f.metadata["key"])
    return field_name


def _coerce(key_name: str, value: Any, annotation: str) -> Any:
    """Convert a user value to the field's type, as librdkafka accepts strings for numbers and booleans."""
    if annotation == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif annotation in ("int", "float"):
        if annotation == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value) if annotation == "int" else float(value)
            except ValueError:
                pass
    elif annotation in ("str", "str | None"):
        if isinstance(value, str):
            return value
    elif annotation == "logging.Logger | None":
        if isinstance(value, logging.Logger | logging.LoggerAdapter):
            return value
    elif callable(value):  # the only other field type is a callback
        return value
    fail(ErrorCode.INVALID_CONFIG, f"config key {key_name!r} expects {annotation}, got {type(value).__name__} "
         f"{value!r}")


def _fields_by_key(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.metadata["key"]: f for f in dataclasses.fields(cls) if "key" in f.metadata}


_SECTIONS: dict[str, type] = {"store": StoreConfig, "transactions": TransactionConfig, "client": ClientConfig}
"""Config objects nested in a component's config, by field name; their keys are accepted at the top level."""

ALIASES = {"queue.buffering.max.ms": "linger.ms", "message.timeout.ms": "delivery.timeout.ms"}
"""librdkafka's other names for a key, read as that key (as librdkafka does)."""

EMBEDDED_NO_EFFECT: dict[str, str] = {
    "acks": "an acknowledged append is durable as store.sqlite.synchronous says; there are no replicas to wait for",
    "request.required.acks": "an alias of acks",
    "compression.type": "the embedded store keeps its record batches as they are; there is no network to save",
    "compression.codec": "an alias of compression.type",
    "partition.assignment.strategy": "the embedded store's groups always assign incrementally, round-robin",
    "retries": "retriable appends are retried until delivery.timeout.ms, as librdkafka's default",
    "message.send.max.retries": "an alias of retries",
    "retry.backoff.ms": "the embedded store has no broker to back off from",
    "request.timeout.ms": "the embedded store has no requests: it is a database file",
    "fetch.min.bytes": "the consumer reads the database file directly",
    "fetch.wait.max.ms": "the consumer reads the database file directly",
    "fetch.max.bytes": "the consumer reads the database file directly",
    "max.partition.fetch.bytes": "the consumer reads the database file directly",
    "throttle_cb": "the embedded store has no broker quotas: nothing is ever throttled, so it is never called",
}
"""librdkafka settings a confluent-kafka program commonly sets that have nothing to set on the embedded store:
accepted there and without effect (each with why); on kafka:// they pass through to librdkafka."""

MANAGED_KAFKA_KEYS = frozenset({"bootstrap.servers", "group.id", "transactional.id", "enable.idempotence",
                                "isolation.level", "enable.auto.commit", "auto.offset.reset"})
"""librdkafka settings onceflow sets itself on its Kafka clients; a user may not pass them through."""


def _pass_through(unknown: dict[str, Any], url: str | None, component: str,
                  known: list[str]) -> tuple[tuple[str, Any], ...]:
    """Keys onceflow does not know go to librdkafka on a kafka:// store (which checks them); elsewhere they are
    INVALID_CONFIG."""
    if "bootstrap.servers" in unknown:
        fail(ErrorCode.INVALID_CONFIG, f"{component} config key 'bootstrap.servers' is set by onceflow from "
             "store.url: name the cluster as store.url=kafka://HOST:PORT[,HOST:PORT...]")
    if not (url or DEFAULT_STORE_URL).startswith("kafka://"):
        for name, value in unknown.items():
            if name not in EMBEDDED_NO_EFFECT:
                fail(ErrorCode.INVALID_CONFIG, f"unknown {component} config key {name!r}; known keys: {known} "
                     "(other keys pass through to librdkafka only on a kafka:// store)")
            expects_callable = name.endswith("_cb")
            if not (callable(value) if expects_callable else isinstance(value, str | int | float)):
                fail(ErrorCode.INVALID_CONFIG, f"config key {name!r} expects "
                     f"{'a callable' if expects_callable else 'a string or number'}, got {type(value).__name__} "
                     f"{value!r}")
        return ()
    managed = sorted(MANAGED_KAFKA_KEYS & set(unknown))
    if managed:
        fail(ErrorCode.INVALID_CONFIG, f"{component} config key {managed[0]!r} is set by onceflow on its Kafka "
             "clients and cannot be passed through")
    return tuple(unknown.items())


def build(cls: type[T], conf: Mapping[str, Any], component: str) -> T:
    """Build ``cls`` from a dotted config dict; keys of a nested section (``store.*``, ``message.max.bytes``,
    ``transaction.*``) go to that section's object."""
    if not isinstance(conf, Mapping):
        fail(ErrorCode.INVALID_CONFIG, f"{component} config must be a dict, got {type(conf).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    sections = {name: section for name, section in _SECTIONS.items() if name in names}
    where: dict[str, tuple[str | None, dataclasses.Field[Any]]] = {k: (None, f) for k, f in _fields_by_key(cls).items()}
    for name, section in sections.items():
        where.update({key_name: (name, f) for key_name, f in _fields_by_key(section).items()})
    values: dict[str | None, dict[str, Any]] = {None: {}, **{name: {} for name in sections}}
    unknown: dict[str, Any] = {}
    for name, value in conf.items():
        if not isinstance(name, str):
            fail(ErrorCode.INVALID_CONFIG, f"{component} config keys must be strings, got {name!r}")
        name = ALIASES.get(name, name) if ALIASES.get(name) in where else name
        if name not in where:
            unknown[name] = value
            continue
        section_name, f = where[name]
        values[section_name][f.name] = _coerce(name, value, str(f.type))
    url = values.get("store", {}).get("url")
    if values.get("client", {}).get("debug") and (url or DEFAULT_STORE_URL).startswith("kafka://"):
        unknown["debug"] = values["client"]["debug"]  # librdkafka's own debug lines too, as its clients print them
    if unknown:
        values["store"]["kafka_settings"] = _pass_through(unknown, url, component, sorted(where))
    factory: Callable[..., T] = cls
    nested = {name: section(**values[name]) for name, section in sections.items()}
    return factory(**nested, **values[None])
