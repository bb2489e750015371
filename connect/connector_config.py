"""The keys every connector config has (Kafka Connect's ``ConnectorConfig``, ``SourceConnectorConfig``,
``SinkConnectorConfig``), and validation of a whole config as ``PUT /connector-plugins/{p}/config/validate``
reports it: the common keys, each transform's and predicate's keys, then the connector's own, every error found.

As in Kafka Connect, a connector config may carry keys nobody declares (a connector may read keys it does not
declare); the keys declared here and by the plugins are checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from onceflow.connect.config_def import (
    ConfigDef,
    ConfigValue,
    Importance,
    Type,
    Width,
    at_least,
    non_empty,
    one_of,
    regex,
)
from onceflow.connect.connector import Connector, ExactlyOnceSupport, SourceConnector
from onceflow.connect.plugins import Plugins, prefixed
from onceflow.connector.errors import ErrorCode, KafkaException, fail

DEFAULT_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
COMMON, TRANSFORMS, PREDICATES, ERRORS = "Common", "Transforms", "Predicates", "Error Handling"
TOPIC_CREATION, EXACTLY_ONCE, OFFSETS_TOPIC = "Topic Creation", "Exactly Once Support", "offsets.topic"
_VALIDATE_HINT = ("You can also find the above list of errors at the endpoint "
                  "`/connector-plugins/{connectorType}/config/validate`")


def _common(plugins: Plugins) -> ConfigDef:
    converters = lambda: plugins.names("converter")  # noqa: E731 - a recommender, called at validation
    d = ConfigDef()
    d.define("name", Type.STRING, validator=non_empty, importance=Importance.HIGH,
             documentation="Globally unique name to use for this connector.", group=COMMON, order_in_group=1,
             width=Width.MEDIUM, display_name="Connector name")
    d.define("connector.class", Type.STRING, importance=Importance.HIGH, group=COMMON, order_in_group=2,
             documentation="Name or alias of the class for this connector: an installed plugin of the entry-point "
                           "group onceflow.connect.plugins (e.g. FileStreamSource).",
             width=Width.LONG, display_name="Connector class")
    d.define("connector.plugin.version", Type.STRING, None, None, Importance.MEDIUM, "Version of the connector "
             "(only the installed one can run).", group=COMMON, order_in_group=3, width=Width.MEDIUM,
             display_name="Connector version")
    d.define("tasks.max", Type.INT, "1", at_least(1), Importance.HIGH,
             "Maximum number of tasks to use for this connector.", group=COMMON, order_in_group=4,
             width=Width.SHORT, display_name="Tasks max")
    d.define("key.converter", Type.CLASS, None, None, Importance.LOW, "Converter of record keys (default: the "
             "worker's key.converter).", group=COMMON, order_in_group=6, width=Width.SHORT,
             display_name="Key converter class", recommender=converters)
    d.define("value.converter", Type.CLASS, None, None, Importance.LOW, "Converter of record values (default: the "
             "worker's value.converter).", group=COMMON, order_in_group=8, width=Width.SHORT,
             display_name="Value converter class", recommender=converters)
    d.define("transforms", Type.LIST, "", None, Importance.LOW, "Aliases for the transformations to be applied "
             "to records.", group=TRANSFORMS, order_in_group=12, width=Width.LONG, display_name="Transforms")
    d.define("predicates", Type.LIST, "", None, Importance.LOW, "Aliases for the predicates used by "
             "transformations.", group=PREDICATES, order_in_group=13, width=Width.LONG, display_name="Predicates")
    d.define("config.action.reload", Type.STRING, "restart", one_of("none", "restart"), Importance.LOW,
             "Accepted for compatibility: onceflow has no external config providers.", group=COMMON,
             order_in_group=14, width=Width.MEDIUM, display_name="Reload Action")
    d.define("errors.retry.timeout", Type.LONG, "0", at_least(-1), Importance.MEDIUM, "How long (ms) a failed "
             "operation is retried; 0: never, -1: forever.", group=ERRORS, order_in_group=1, width=Width.MEDIUM,
             display_name="Retry Timeout for Errors")
    d.define("errors.retry.delay.max.ms", Type.LONG, "60000", at_least(1), Importance.MEDIUM, "Longest pause "
             "between retries.", group=ERRORS, order_in_group=2, width=Width.MEDIUM,
             display_name="Maximum Delay Between Retries for Errors")
    d.define("errors.tolerance", Type.STRING, "none", one_of("none", "all"), Importance.MEDIUM, "none: a failed "
             "record fails the task; all: it is skipped (and sent to the dead letter queue of a sink, if set).",
             group=ERRORS, order_in_group=3, width=Width.SHORT, display_name="Error Tolerance")
    d.define("errors.log.enable", Type.BOOLEAN, "false", None, Importance.MEDIUM, "Log each tolerated error.",
             group=ERRORS, order_in_group=4, width=Width.SHORT, display_name="Log Errors")
    d.define("errors.log.include.messages", Type.BOOLEAN, "false", None, Importance.MEDIUM, "Include the "
             "record's position (sink) or data (source) in such logs.", group=ERRORS, order_in_group=5,
             width=Width.SHORT, display_name="Log Error Details")
    return d


def _source() -> ConfigDef:
    d = ConfigDef()
    d.define("topic.creation.groups", Type.LIST, "", None, Importance.LOW, "Accepted for compatibility: streams "
             "are created with the worker's defaults.", group=TOPIC_CREATION, order_in_group=1, width=Width.LONG,
             display_name="Topic Creation Groups")
    d.define("exactly.once.support", Type.STRING, "requested", one_of("requested", "required"), Importance.MEDIUM,
             "required: refuse the connector unless it declares exactly-once support for this config and the "
             "worker has it enabled.", group=EXACTLY_ONCE, order_in_group=2, width=Width.SHORT,
             display_name="Exactly once support")
    d.define("transaction.boundary", Type.STRING, "poll", one_of("poll", "interval", "connector"),
             Importance.MEDIUM, "poll: a transaction per batch a task returns; interval: one per "
             "transaction.boundary.interval.ms; connector: the task commits through its TransactionContext.",
             group=EXACTLY_ONCE, order_in_group=3, width=Width.SHORT, display_name="Transaction Boundary")
    d.define("transaction.boundary.interval.ms", Type.LONG, None, at_least(0), Importance.LOW, "The interval "
             "of transaction.boundary=interval (default: the worker's offset.flush.interval.ms).",
             group=EXACTLY_ONCE, order_in_group=4, width=Width.SHORT, display_name="Transaction boundary interval")
    d.define("offsets.storage.topic", Type.STRING, None, None, Importance.LOW, "A stream of its own for this "
             "connector's source offsets (default: the worker's offset.storage.topic).", group=OFFSETS_TOPIC,
             order_in_group=1, width=Width.LONG, display_name="Offsets topic")
    return d


def _sink() -> ConfigDef:
    d = ConfigDef()
    d.define("topics", Type.LIST, "", None, Importance.HIGH, "Streams to consume.", group=COMMON,
             order_in_group=4, width=Width.LONG, display_name="Topics")
    d.define("topics.regex", Type.STRING, "", regex, Importance.HIGH, "A regular expression: consume every "
             "stream whose name matches.", group=COMMON, order_in_group=4, width=Width.LONG,
             display_name="Topics regex")
    d.define("errors.deadletterqueue.topic.name", Type.STRING, "", None, Importance.MEDIUM, "A stream that gets "
             "the records that failed (with errors.tolerance=all).", group=ERRORS, order_in_group=6,
             width=Width.MEDIUM, display_name="Dead Letter Queue Topic Name")
    d.define("errors.deadletterqueue.topic.replication.factor", Type.SHORT, "3", None, Importance.MEDIUM,
             "Copies of the dead letter stream on kafka:// (capped at the cluster's size).", group=ERRORS,
             order_in_group=7, width=Width.MEDIUM, display_name="Dead Letter Queue Topic Replication Factor")
    d.define("errors.deadletterqueue.context.headers.enable", Type.BOOLEAN, "false", None, Importance.MEDIUM,
             "Add __connect.errors.* headers saying where and why the record failed.", group=ERRORS,
             order_in_group=8, width=Width.MEDIUM, display_name="Enable Error Context Headers")
    return d


def definition(plugins: Plugins, connector: type[Connector]) -> ConfigDef:
    """Every key a connector of this class takes: the common ones, then the source or sink ones."""
    return _common(plugins).merged(_source() if issubclass(connector, SourceConnector) else _sink())


def _plugin_keys(plugins: Plugins, props: Mapping[str, str], kind: str) -> tuple[ConfigDef, dict[str, str]]:
    """Keys of each listed transform (``kind`` "transforms") or predicate: ``<kind>.<alias>.type`` and the
    plugin's own keys, prefixed; and which plugin each alias is (alias -> class name)."""
    d, found = ConfigDef(), {}
    aliases = [a.strip() for a in props.get(kind, "").split(",") if a.strip()]
    plugin_kind = "transformation" if kind == "transforms" else "predicate"
    for alias in aliases:
        prefix, group = f"{kind}.{alias}.", f"{kind.title()}: {alias}"
        recommended = lambda k=plugin_kind: plugins.names(k)  # noqa: E731
        d.define(prefix + "type", Type.CLASS, importance=Importance.HIGH, group=group, order_in_group=0,
                 documentation=f"Class for the '{alias}' {plugin_kind}.", width=Width.LONG,
                 display_name=f"{plugin_kind.title()} type for {alias}", recommender=recommended)
        if kind == "transforms":
            d.define(prefix + "predicate", Type.STRING, "", None, Importance.MEDIUM, "The alias of a predicate "
                     "that selects the records this transform applies to.", group=group, order_in_group=1)
            d.define(prefix + "negate", Type.BOOLEAN, "false", None, Importance.MEDIUM, "Apply the transform to "
                     "the records the predicate does not match.", group=group, order_in_group=2)
        desc = plugins.find(props.get(prefix + "type", ""))
        if desc is not None and desc.kind == plugin_kind:
            found[alias] = desc.class_name
            for key in desc.cls().config().config_keys().values():
                d.define(prefix + key.name, key.type, key.default, key.validator, key.importance,
                         key.documentation, group=group, order_in_group=key.order_in_group, width=key.width,
                         display_name=key.display_name)
    return d, found


@dataclasses.dataclass
class Validation:
    """A validated connector config: every key's value and errors, and the definitions they were checked by."""

    connector: type[Connector] | None
    definition: ConfigDef
    values: dict[str, ConfigValue]

    @property
    def error_count(self) -> int:
        return sum(len(v.errors) for v in self.values.values())

    @property
    def connector_type(self) -> str:
        return "source" if self.connector is not None and issubclass(self.connector, SourceConnector) else "sink"

    def infos(self, class_name: str) -> dict[str, Any]:
        """Kafka Connect's ``ConfigInfos`` JSON."""
        keys = self.definition.config_keys()
        configs = [{"definition": keys[name].info(), "value": value.info(keys[name].type)}
                   for name, value in self.values.items() if name in keys]
        return {"name": class_name, "error_count": self.error_count, "groups": self.definition.groups(),
                "configs": configs}

    def raise_if_invalid(self) -> None:
        """INVALID_CONFIG with Kafka Connect's message listing every error."""
        errors = [error for value in self.values.values() for error in value.errors]
        if errors:
            fail(ErrorCode.INVALID_CONFIG, f"Connector configuration is invalid and contains the following "
                 f"{len(errors)} error(s):\n" + "\n".join(errors) + "\n" + _VALIDATE_HINT)


def java_map(props: Mapping[str, str]) -> str:
    """A config as Java prints a map (``{name=x, tasks.max=1}``), sorted, for Kafka Connect's messages."""
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(props.items())) + "}"


def validate(plugins: Plugins, props: Mapping[str, str], worker_exactly_once: bool) -> Validation:
    """Check a whole connector config; INVALID_CONFIG only if it names no installed connector at all."""
    class_name = props.get("connector.class")
    if class_name is None:
        fail(ErrorCode.INVALID_CONFIG, f"Connector config {java_map(props)} contains no connector type")
    cls = plugins.connector(class_name)
    connector = cls()
    checked = definition(plugins, cls)
    values = checked.validate_all(props)
    for kind in ("transforms", "predicates"):
        keys, _ = _plugin_keys(plugins, props, kind)
        values.update(keys.validate_all(props))
        checked = checked.merged(keys)
    _check_plugin_types(plugins, props, values)
    own = connector.config()
    values.update(_own_values(connector, props))
    checked = checked.merged(own)
    _check_version(connector, values)
    if issubclass(cls, SourceConnector):
        _check_exactly_once(connector, props, values, worker_exactly_once)  # type: ignore[arg-type]
    else:
        _check_topics(values)
    return Validation(cls, checked, values)


def _own_values(connector: Connector, props: Mapping[str, str]) -> dict[str, ConfigValue]:
    """The connector's own validation; a connector that raises gets its error on ``connector.class``."""
    try:
        return connector.validate(props)
    except KafkaException as exc:
        return {"connector.class": ConfigValue("connector.class", props.get("connector.class"),
                                               errors=[f"Failed to perform config validation: {exc.error.str()}"])}


def _check_plugin_types(plugins: Plugins, props: Mapping[str, str], values: dict[str, ConfigValue]) -> None:
    """Each ``transforms.X.type`` / ``predicates.X.type`` must name an installed plugin of that kind."""
    for name, value in values.items():
        if name.endswith(".type") and value.value and not value.errors:
            kind = "transformation" if name.startswith("transforms.") else "predicate"
            desc = plugins.find(value.value)
            if desc is None or desc.kind != kind:
                value.errors.append(f"Invalid value {value.value} for configuration {name}: Class {value.value} "
                                    f"could not be found (no installed {kind} plugin is named so).")
    listed = [a.strip() for a in props.get("predicates", "").split(",")]
    for name, value in values.items():
        if name.startswith("transforms.") and name.endswith(".predicate") and value.value not in ("", None, *listed):
            value.errors.append(f"Invalid value {value.value} for configuration {name}: predicate "
                                    f"'{value.value}' is not listed in 'predicates'")


def _check_version(connector: Connector, values: dict[str, ConfigValue]) -> None:
    value = values["connector.plugin.version"]
    if value.value is None:
        value.value = connector.version()
    elif value.value != connector.version():
        value.errors.append(f"Plugin {type(connector).__name__} with version {value.value} not found; installed: "
                            f"{connector.version()}")
    value.recommended_values = [connector.version()]


def _check_topics(values: dict[str, ConfigValue]) -> None:
    topics, pattern = values["topics"], values["topics.regex"]
    dlq = values["errors.deadletterqueue.topic.name"].value
    if not topics.value and not pattern.value:
        for value in (topics, pattern):
            value.errors.append("Must configure one of topics or topics.regex")
    elif topics.value and pattern.value:
        for value in (topics, pattern):
            value.errors.append("topics and topics.regex are mutually exclusive options, but both are set.")
    if dlq and topics.value and dlq in topics.value:
        values["errors.deadletterqueue.topic.name"].errors.append(
            f"The DLQ topic '{dlq}' may not be included in the list of topics ('topics'='{','.join(topics.value)}') "
            "consumed by the connector")


def _check_exactly_once(connector: SourceConnector, props: Mapping[str, str], values: dict[str, ConfigValue],
                        worker_exactly_once: bool) -> None:
    """KIP-618's preflight checks."""
    support, boundary = values["exactly.once.support"], values["transaction.boundary"]
    if support.value == "required":
        if not worker_exactly_once:
            support.errors.append("This worker does not have exactly-once source support enabled.")
        answer = connector.exactly_once_support(props)
        if answer is None:
            support.errors.append("The connector does not implement the API required for preflight validation of "
                                  "exactly-once source support. Please consult the documentation for the connector "
                                  "to determine whether it supports exactly-once semantics, and then consider "
                                  "reconfiguring the connector to use the value \"requested\" for this property "
                                  "(which will disable this preflight check and allow the connector to be created).")
        elif answer is not ExactlyOnceSupport.SUPPORTED:
            support.errors.append("The connector does not support exactly-once semantics with the provided "
                                  "configuration.")
    if boundary.value == "connector" and not connector.can_define_transaction_boundaries(props):
        boundary.errors.append("The connector does not support connector-defined transaction boundaries with the "
                               "given configuration. Please reconfigure it to use a different transaction boundary "
                               "definition.")


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    """A valid connector config, parsed: what the worker needs to run it."""

    name: str
    connector_class: str
    type: str  # source | sink
    props: dict[str, str]
    values: dict[str, Any]
    transforms: dict[str, str]  # alias -> transformation class name, in order
    predicates: dict[str, str]

    @property
    def tasks_max(self) -> int:
        return int(self.values["tasks.max"])

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def converter_props(self, which: str) -> dict[str, str]:
        """A converter's own keys from this config (``value.converter.schemas.enable`` -> ``schemas.enable``)."""
        return prefixed(self.props, f"{which}.converter.")


def parse(plugins: Plugins, props: Mapping[str, str], worker_exactly_once: bool) -> ConnectorConfig:
    """A valid config, parsed; INVALID_CONFIG (Kafka Connect's message, every error) otherwise."""
    checked = validate(plugins, props, worker_exactly_once)
    checked.raise_if_invalid()
    values = {name: value.value for name, value in checked.values.items()}
    transforms = _plugin_keys(plugins, props, "transforms")[1]
    predicates = _plugin_keys(plugins, props, "predicates")[1]
    class_name = plugins.find(str(values["connector.class"]))
    return ConnectorConfig(str(values["name"]), class_name.class_name if class_name else "", checked.connector_type,
                           dict(props), values, transforms, predicates)

