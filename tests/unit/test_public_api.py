"""The public surface of ``connector`` is pinned: a change here is a change for users."""

from __future__ import annotations

import confluent_kafka
import confluent_kafka.admin

from onceflow import connector


def test_exported_names() -> None:
    assert sorted(connector.__all__) == sorted([
        "OFFSET_BEGINNING", "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED",
        "TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE",
        "AdminClient", "ClusterMetadata", "Consumer", "ConsumerGroupMetadata", "ErrorCode", "KafkaError",
        "KafkaException", "Message",
        "NewPartitions", "NewTopic", "PartitionMetadata", "Producer", "TopicMetadata", "TopicPartition",
        "BrokerMetadata", "ConsumerGroupState", "ConsumerGroupTopicPartitions", "IsolationLevel", "Node",
        "TopicCollection", "TopicPartitionInfo", "SerializingProducer", "DeserializingConsumer", "Record",
    ])


def test_record_is_the_one_txn_writers_take() -> None:
    from onceflow.connector.store import Record

    assert connector.Record is Record


def test_admin_value_types_are_confluent_kafkas_own() -> None:
    """Requests and results of the admin API are confluent-kafka's classes, so code that builds or checks them
    (``isinstance``, enum comparisons) runs unchanged."""
    from onceflow.connector import admin

    for name in ("ConsumerGroupState", "ConsumerGroupTopicPartitions", "IsolationLevel", "Node", "TopicCollection",
                 "TopicPartitionInfo"):
        assert getattr(connector, name) is getattr(confluent_kafka, name), name
    assert admin.OffsetSpec is confluent_kafka.admin.OffsetSpec


def test_constants_equal_confluent_kafkas() -> None:
    for name in ("OFFSET_BEGINNING", "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED",
                 "TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE"):
        assert getattr(connector, name) == getattr(confluent_kafka, name), name


def test_error_codes_carry_kafkas_protocol_numbers() -> None:
    for name in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "OUT_OF_ORDER_SEQUENCE_NUMBER",
                 "DUPLICATE_SEQUENCE_NUMBER", "INVALID_TXN_STATE", "CONCURRENT_TRANSACTIONS",
                 "INVALID_TRANSACTION_TIMEOUT", "UNKNOWN_TOPIC_OR_PART", "MSG_SIZE_TOO_LARGE",
                 "INVALID_CONFIG", "OFFSET_OUT_OF_RANGE", "UNKNOWN_MEMBER_ID", "TOPIC_EXCEPTION",
                 "TOPIC_ALREADY_EXISTS", "INVALID_PARTITIONS", "INVALID_RECORD", "_PARTITION_EOF", "_FS", "_STATE",
                 "UNSUPPORTED_VERSION", "INVALID_REQUEST", "_PURGE_QUEUE"):
        assert connector.ErrorCode[name] == getattr(confluent_kafka.KafkaError, name), name
    assert connector.ErrorCode.CORRUPT_MESSAGE == confluent_kafka.KafkaError.INVALID_MSG


def test_txn_exported_names() -> None:
    from onceflow import txn

    assert sorted(txn.__all__) == sorted([
        "BatchedLogWriter", "Outcome", "Participant", "Position", "StagingWriter", "TransactionGroup",
        "TransactionStateMachine", "TxnState", "open_group",
    ])
