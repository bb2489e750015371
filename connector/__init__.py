"""onceflow's Kafka-facing layer: confluent-kafka-shaped clients over the store backends.

Existing confluent-kafka code runs after changing its import and config (``store.url`` picks the backend).
"""

from onceflow.connector.admin import AdminClient
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.connector.message import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
)
from onceflow.connector.producer import Producer
from onceflow.connector.topic import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    ClusterMetadata,
    ConsumerGroupMetadata,
    NewTopic,
    PartitionMetadata,
    TopicMetadata,
    TopicPartition,
)

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "AdminClient",
    "ClusterMetadata",
    "Consumer",
    "ConsumerGroupMetadata",
    "ErrorCode",
    "KafkaError",
    "KafkaException",
    "Message",
    "NewTopic",
    "PartitionMetadata",
    "Producer",
    "TopicMetadata",
    "TopicPartition",
]
