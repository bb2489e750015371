"""``SerializingProducer`` and ``DeserializingConsumer``: confluent-kafka's serde clients on any onceflow store.

As confluent-kafka's: the config keys ``key.serializer`` / ``value.serializer`` (``key.deserializer`` /
``value.deserializer``) hold callables ``(obj, SerializationContext) -> bytes`` (and back), such as
confluent-kafka's ``StringSerializer`` or its Schema Registry serdes; a serde that raises is reported as
``KeySerializationError`` / ``ValueSerializationError`` (``KeyDeserializationError`` /
``ValueDeserializationError``, carrying the record), and an error event a poll returns is raised as
``ConsumeError``. The errors are onceflow's :class:`KafkaException` (one error type), with confluent-kafka's
attributes (``exception``, ``kafka_message``) and codes (``_KEY_SERIALIZATION``, ...).
``SerializationContext`` and ``MessageField`` are confluent-kafka's own, so its serdes work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from onceflow.connector.accumulator import DeliveryCallback
from onceflow.connector.consumer import Consumer
from onceflow.connector.errors import ErrorCode, KafkaError, KafkaException
from onceflow.connector.message import Message
from onceflow.connector.producer import Producer

Serde = Callable[[Any, SerializationContext], Any]


class SerializationError(KafkaException):
    """A serde failed (confluent-kafka's ``confluent_kafka.serialization.SerializationError``)."""


class _ClientError(KafkaException):
    """An error with what caused it and the record concerned, as confluent-kafka's ``_KafkaClientError``."""

    def __init__(self, kafka_error: KafkaError, exception: BaseException | None = None,
                 kafka_message: Message | None = None) -> None:
        super().__init__(kafka_error)
        self.exception = exception
        self.kafka_message = kafka_message

    @property
    def name(self) -> str:
        return self.code.name


class ConsumeError(_ClientError):
    """An error event a ``DeserializingConsumer.poll`` met (``kafka_message`` is the event)."""


class ProduceError(_ClientError):
    """A ``SerializingProducer.produce`` failed before the record was queued."""


class KeySerializationError(ProduceError, SerializationError):
    def __init__(self, exception: BaseException | None = None) -> None:
        super().__init__(KafkaError(ErrorCode._KEY_SERIALIZATION, str(exception)), exception)


class ValueSerializationError(ProduceError, SerializationError):
    def __init__(self, exception: BaseException | None = None) -> None:
        super().__init__(KafkaError(ErrorCode._VALUE_SERIALIZATION, str(exception)), exception)


class KeyDeserializationError(ConsumeError, SerializationError):
    def __init__(self, exception: BaseException | None = None, kafka_message: Message | None = None) -> None:
        super().__init__(KafkaError(ErrorCode._KEY_DESERIALIZATION, str(exception)), exception, kafka_message)


class ValueDeserializationError(ConsumeError, SerializationError):
    def __init__(self, exception: BaseException | None = None, kafka_message: Message | None = None) -> None:
        super().__init__(KafkaError(ErrorCode._VALUE_DESERIALIZATION, str(exception)), exception, kafka_message)


def _pop_serdes(config: Mapping[str, Any], key_name: str, value_name: str) -> tuple[Serde | None, Serde | None,
                                                                                      dict[str, Any]]:
    """(key serde, value serde, the rest of the config): the client's own config refuses unknown keys."""
    rest = dict(config)
    serdes = rest.pop(key_name, None), rest.pop(value_name, None)
    for name, serde in zip((key_name, value_name), serdes, strict=True):
        if serde is not None and not callable(serde):
            raise KafkaException(KafkaError(ErrorCode.INVALID_CONFIG, f"{name} must be a callable "
                                            f"(obj, SerializationContext), got {type(serde).__name__}"))
    return serdes[0], serdes[1], rest


class SerializingProducer(Producer):
    """A :class:`Producer` whose ``produce`` serializes the key and value with the configured serializers."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._key_serializer, self._value_serializer, rest = _pop_serdes(conf, "key.serializer", "value.serializer")
        super().__init__(rest)

    def produce(  # type: ignore[override]
        self,
        topic: str,
        key: Any = None,
        value: Any = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
    ) -> None:
        """Serialize the key, then the value (KeySerializationError / ValueSerializationError, nothing queued),
        and produce them; note the argument order (key before value), as confluent-kafka's."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        context = SerializationContext(topic, MessageField.KEY, headers)  # type: ignore[arg-type]
        if self._key_serializer is not None:
            try:
                key = self._key_serializer(key, context)
            except Exception as exc:
                raise KeySerializationError(exc) from exc
        context.field = MessageField.VALUE
        if self._value_serializer is not None:
            try:
                value = self._value_serializer(value, context)
            except Exception as exc:
                raise ValueSerializationError(exc) from exc
        super().produce(topic, value, key, headers=headers, partition=partition, timestamp=timestamp,
                        on_delivery=on_delivery)


class DeserializingConsumer(Consumer):
    """A :class:`Consumer` whose ``poll`` deserializes each record's key and value in place."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self._key_deserializer, self._value_deserializer, rest = _pop_serdes(
            conf, "key.deserializer", "value.deserializer")
        super().__init__(rest)

    def poll(self, timeout: float | None = -1) -> Message | None:
        """The next record, deserialized (key first), or None after ``timeout``; an error event (such as
        _PARTITION_EOF) is raised as ConsumeError, as confluent-kafka's."""
        message = super().poll(timeout)
        if message is None:
            return None
        error = message.error()
        if error is not None:
            raise ConsumeError(error, kafka_message=message)
        context = SerializationContext(message.topic() or "", MessageField.KEY, message.headers())  # type: ignore[arg-type]
        key = message.key()
        if self._key_deserializer is not None:
            try:
                key = self._key_deserializer(key, context)
            except Exception as exc:
                raise KeyDeserializationError(exc, message) from exc
        value = message.value()
        if self._value_deserializer is not None:
            context.field = MessageField.VALUE
            try:
                value = self._value_deserializer(value, context)
            except Exception as exc:
                raise ValueDeserializationError(exc, message) from exc
        message.set_key(key)
        message.set_value(value)
        return message

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Not implemented, as in confluent-kafka: use :meth:`poll`, which deserializes."""
        raise NotImplementedError("DeserializingConsumer.consume() is not implemented (as in confluent-kafka); "
                                  "use poll()")


__all__ = [
    "ConsumeError",
    "DeserializingConsumer",
    "KeyDeserializationError",
    "KeySerializationError",
    "MessageField",
    "ProduceError",
    "SerializationContext",
    "SerializationError",
    "SerializingProducer",
    "ValueDeserializationError",
    "ValueSerializationError",
]
