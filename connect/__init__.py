"""A Kafka Connect-style worker on onceflow stores: connectors and tasks as plugins, exactly-once delivery.

The plugin API (this package's names) mirrors Kafka Connect's: a :class:`SourceConnector` splits its job into
:class:`SourceTask` s that ``poll()`` :class:`SourceRecord` s (each with its source partition and offset); a
:class:`SinkConnector`'s :class:`SinkTask` s are ``put()`` the :class:`SinkRecord` s consumed for them. Configs
are declared with :class:`ConfigDef`; :class:`Converter` s turn data into bytes and back; :class:`Transformation`
s and :class:`Predicate` s change records on the way. Plugins are installed entry points of the group
``onceflow.connect.plugins`` (:mod:`onceflow.connect.plugins`).

The worker (``onceflow connect standalone|distributed``, :mod:`onceflow.connect.app`) commits a source task's
records with their source offsets in one transaction, and a sink task's consumed offsets with what it wrote to
streams; its REST API is Kafka Connect's. See docs/connect.md.
"""

from onceflow.connect.config_def import ConfigDef, ConfigValue, Importance, Type, Width
from onceflow.connect.connector import (
    Connector,
    ConnectorContext,
    ExactlyOnceSupport,
    SinkConnector,
    SourceConnector,
)
from onceflow.connect.converters import Converter
from onceflow.connect.records import ConnectRecord, Field, Schema, SinkRecord, SourceRecord
from onceflow.connect.task import (
    ErrantRecordReporter,
    OffsetStorageReader,
    RecordMetadata,
    SinkTask,
    SinkTaskContext,
    SourceTask,
    SourceTaskContext,
    Task,
    TransactionContext,
)
from onceflow.connect.transform import Predicate, Transformation

__all__ = [
    "ConfigDef",
    "ConfigValue",
    "ConnectRecord",
    "Connector",
    "ConnectorContext",
    "Converter",
    "ErrantRecordReporter",
    "ExactlyOnceSupport",
    "Field",
    "Importance",
    "OffsetStorageReader",
    "Predicate",
    "RecordMetadata",
    "Schema",
    "SinkConnector",
    "SinkRecord",
    "SinkTask",
    "SinkTaskContext",
    "SourceConnector",
    "SourceRecord",
    "SourceTask",
    "SourceTaskContext",
    "Task",
    "TransactionContext",
    "Transformation",
    "Type",
    "Width",
]
