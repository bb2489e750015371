"""Code written for confluent-kafka keeps working: its error constants and TopicPartition semantics are ours."""

from __future__ import annotations

import confluent_kafka

from onceflow.connector import ErrorCode, KafkaError, Message, TopicPartition


def confluent_codes() -> dict[str, int]:
    return {name: value for name, value in vars(confluent_kafka.KafkaError).items()
            if name.lstrip("_").isupper() and isinstance(value, int)}


def test_every_confluent_error_constant_exists_with_its_number() -> None:
    codes = confluent_codes()
    assert len(codes) > 150
    for name, value in codes.items():
        assert getattr(KafkaError, name) == value, name
        assert ErrorCode[name] == value, name


def test_the_common_idioms_work_unchanged() -> None:
    eof = KafkaError(ErrorCode._PARTITION_EOF, "orders[0] at end")
    assert eof.code() == KafkaError._PARTITION_EOF
    assert KafkaError(KafkaError.TOPIC_ALREADY_EXISTS).code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    assert KafkaError.CAS_MISMATCH == ErrorCode.CAS_MISMATCH  # onceflow's own codes are constants too
    assert "CAS_MISMATCH" in dir(KafkaError)


def test_topic_partition_equality_order_and_hash_match_confluent_kafkas() -> None:
    pairs = [(("t", 0, 5), ("t", 0, 6)), (("t", 0, 7), ("t", 0, 5)), (("t", 0, 5), ("t", 1, 5)),
             (("a", 1, 9), ("b", 0, 1)), (("t", 0), ("t", 0, 3))]
    for left, right in pairs:
        ours = TopicPartition(*left), TopicPartition(*right)
        theirs = confluent_kafka.TopicPartition(*left), confluent_kafka.TopicPartition(*right)
        assert (ours[0] == ours[1]) == (theirs[0] == theirs[1]), (left, right)
        assert (ours[0] < ours[1]) == (theirs[0] < theirs[1]), (left, right)
        assert (hash(ours[0]) == hash(ours[1])) == (hash(theirs[0]) == hash(theirs[1])), (left, right)
    assert len({TopicPartition("t", 0, 1), TopicPartition("t", 0, 2)}) == 1


def test_message_latency_and_leader_epoch_are_none_where_unknown_as_confluent_kafkas() -> None:
    """confluent-kafka's consumed messages answer None for both; code that reads them must not break."""
    message = Message("t", 0, 5, b"k", b"v", timestamp=1_000)
    assert message.latency() is None
    assert message.leader_epoch() is None
    theirs = [name for name in ("latency", "leader_epoch") if hasattr(confluent_kafka.Message, name)]
    assert theirs == ["latency", "leader_epoch"]
