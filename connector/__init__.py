"""onceflow's Kafka-facing layer: confluent-kafka-shaped clients over the store backends.

Existing confluent-kafka code runs after changing its import and config (``store.url`` picks the backend).

The package also holds the base every layer uses (errors, config, failpoints, messages, topics, the store), and
the clients are built on transactions (:mod:`onceflow.txn`), which use that base: so the clients are imported
when first named here, not with the package, and importing the base never loads ``txn`` or the clients.
Dependencies point one way: base -> txn -> clients -> spark_sinks, the CLI (tests/unit/test_layers.py).
"""

import importlib
from typing import TYPE_CHECKING, Any

from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.connector.message import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
)
from onceflow.connector.topic import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    BrokerMetadata,
    ClusterMetadata,
    ConsumerGroupMetadata,
    NewPartitions,
    NewTopic,
    PartitionMetadata,
    TopicMetadata,
    TopicPartition,
)

if TYPE_CHECKING:
    from onceflow.connector.admin import AdminClient
    from onceflow.connector.consumer import Consumer
    from onceflow.connector.producer import Producer
    from onceflow.connector.serializing import DeserializingConsumer, SerializingProducer
    from onceflow.connector.store import Record

_CLIENTS = {"AdminClient": "onceflow.connector.admin", "Consumer": "onceflow.connector.consumer",
            "Producer": "onceflow.connector.producer",
            "DeserializingConsumer": "onceflow.connector.serializing",
            "SerializingProducer": "onceflow.connector.serializing",
            "Record": "onceflow.connector.store",  # what txn's StagingWriter.produce takes
            # confluent-kafka's own value types of the admin API, used as they are (onceflow.connector.admin):
            **dict.fromkeys(("ConsumerGroupState", "ConsumerGroupTopicPartitions", "IsolationLevel", "Node",
                             "TopicCollection", "TopicPartitionInfo"), "confluent_kafka")}


def __getattr__(name: str) -> Any:
    """The clients (and confluent-kafka's admin value types, and the store's ``Record``), imported when first named
    (see the module docstring)."""
    if name not in _CLIENTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    client = getattr(importlib.import_module(_CLIENTS[name]), name)
    globals()[name] = client
    return client


__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "AdminClient",
    "BrokerMetadata",
    "ClusterMetadata",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerGroupState",
    "ConsumerGroupTopicPartitions",
    "DeserializingConsumer",
    "ErrorCode",
    "IsolationLevel",
    "KafkaError",
    "KafkaException",
    "Message",
    "NewPartitions",
    "NewTopic",
    "Node",
    "PartitionMetadata",
    "Producer",
    "Record",
    "SerializingProducer",
    "TopicCollection",
    "TopicMetadata",
    "TopicPartition",
    "TopicPartitionInfo",
]
