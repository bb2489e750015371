"""The Spark formats avro-registry, protobuf-registry and json-registry without Spark: the options resolved against
a served registry (subjects by strategy, the schema by option or latest version, registration only when asked),
confluent-kafka's deserializers reading what they write, and the typed errors."""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory
from pyspark.sql import Row

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.message import Message
from onceflow.connector.store import open_store
from onceflow.schemas import serdes
from onceflow.schemas.registry import RegistryServer, SchemaRegistry
from onceflow.schemas.registry.protobuf import built_pool
from onceflow.spark_sinks.options import OnceflowOptions, parse
from onceflow.spark_sinks.rows import RowMapping

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}]})
ORDER_PROTO = 'syntax = "proto3"; package shop; message Order { int64 id = 1; repeated string tags = 2; }'
PAYMENT = json.dumps({"type": "object", "title": "Payment", "properties": {"id": {"type": "integer"}},
                      "required": ["id"]})


@pytest.fixture
def registry(sqlite_url: str) -> Iterator[tuple[SchemaRegistry, str]]:
    store = open_store(sqlite_url)
    kept = SchemaRegistry(store)
    with contextlib.closing(store), contextlib.closing(kept), contextlib.closing(
            RegistryServer(kept, port=0).start()) as server:
        yield kept, server.url


def options(url: str, **given: str) -> OnceflowOptions:
    return parse({"topic": "orders", "schema.registry.url": url, **{k.replace("_", "."): v for k, v in given.items()}})


def at(offset: int) -> Message:
    return Message("orders", 3, offset, None, None, None)


def refused(code: ErrorCode, call: Any, *args: Any) -> str:
    with pytest.raises(KafkaException) as info:
        call(*args)
    assert info.value.code == code, info.value
    return str(info.value)


@pytest.mark.parametrize(("strategy", "subject"), [
    ("topic", "orders-value"), ("record", "shop.Order"), ("topic-record", "orders-shop.Order")])
def test_avro_values_go_to_the_strategys_subject_and_confluent_reads_them(
        registry: tuple[SchemaRegistry, str], strategy: str, subject: str) -> None:
    kept, url = registry
    schema_id = kept.register(subject, "AVRO", ORDER, [])
    chosen = options(url, value_format="avro-registry", avro_schema=ORDER, value_subject_name_strategy=strategy)
    data = chosen.value_format.to_bytes({"id": 7, "note": None}, "orders")
    assert data is not None and int.from_bytes(data[1:5], "big") == schema_id
    context = SerializationContext("orders", MessageField.VALUE)
    assert AvroDeserializer(SchemaRegistryClient({"url": url}))(data, context) == {"id": 7, "note": None}
    assert chosen.value_format.to_column(data, at(0)) == {"id": 7, "note": None}


def test_a_schema_is_registered_only_with_auto_register_schemas(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    careful = options(url, value_format="avro-registry", avro_schema=ORDER)
    message = refused(ErrorCode.INVALID_CONFIG, careful.value_format.to_bytes, {"id": 1}, "orders")
    assert "'orders-value'" in message and kept.subjects() == []
    eager = options(url, value_format="avro-registry", avro_schema=ORDER, auto_register_schemas="true")
    assert eager.value_format.to_bytes({"id": 1}, "orders") is not None
    assert kept.subjects() == ["orders-value"]


def test_use_latest_version_writes_with_the_latest_version_an_option_schema_otherwise(
        registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    first = kept.register("orders-value", "AVRO", ORDER, [])
    order_v2 = json.loads(ORDER)
    order_v2["fields"].append({"name": "qty", "type": "int", "default": 1})
    latest = kept.register("orders-value", "AVRO", json.dumps(order_v2), [])
    for given, schema_id in (({}, latest), ({"avro_schema": ORDER}, first),
                             ({"avro_schema": ORDER, "use_latest_version": "true"}, latest)):
        data = options(url, value_format="avro-registry", **given).value_format.to_bytes({"id": 3}, "orders")
        assert data is not None and int.from_bytes(data[1:5], "big") == schema_id, given


@pytest.mark.parametrize(("given", "named"), [
    ({"value_format": "avro-registry"}, "'orders-value'"),  # no version to write with
    ({"value_format": "avro-registry", "avro_schema": ORDER, "use_latest_version": "true",
      "auto_register_schemas": "true"}, "cannot both be true"),
    ({"value_format": "avro-registry", "value_subject_name_strategy": "record"}, "needs a record name"),
    ({"value_format": "avro-registry", "value_subject_name_strategy": "by-topic"}, "value.subject.name.strategy"),
    ({"key_format": "avro-registry", "use_latest_version": "yes"}, "use.latest.version"),
    ({"key_format": "xml"}, "key.format"),
], ids=["no-subject", "latest-and-register", "record-without-schema", "strategy", "flag", "key-format"])
def test_bad_registry_options_are_refused_naming_what_is_wrong(registry: tuple[SchemaRegistry, str],
                                                                given: dict[str, str], named: str) -> None:
    assert named in refused(ErrorCode.INVALID_CONFIG, lambda: options(registry[1], **given))


def test_a_row_that_does_not_fit_is_invalid_record(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("orders-value", "AVRO", ORDER, [])
    kept.register("orders-key", "JSON", PAYMENT, [])
    chosen = options(url, value_format="avro-registry", key_format="json-registry")
    assert "'orders-value'" in refused(ErrorCode.INVALID_RECORD, chosen.value_format.to_bytes, {"id": "x"}, "orders")
    assert "'orders-key'" in refused(ErrorCode.INVALID_RECORD, chosen.key_format.to_bytes, {"id": "x"}, "orders")


def test_an_unknown_schema_id_names_the_record_and_the_id(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("orders-key", "AVRO", ORDER, [])
    chosen = options(url, key_format="avro-registry")
    unknown = b"\x00" + (991).to_bytes(4, "big") + b"\x02\x00"
    message = refused(ErrorCode._KEY_DESERIALIZATION, chosen.key_format.to_column, unknown, at(41))
    assert "orders[3]@41: the key's schema id 991 is not in the schema registry" in message
    assert "orders[3]@41" in refused(ErrorCode.CORRUPT_MESSAGE, chosen.key_format.to_column, b"not framed", at(41))


def test_protobuf_and_json_values_round_trip_and_confluent_reads_them(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("orders-value", "PROTOBUF", ORDER_PROTO, [])
    kept.register("Payment", "JSON", PAYMENT, [])
    proto = options(url, value_format="protobuf-registry").value_format
    data = proto.to_bytes({"id": 5, "tags": ["a", "b"]}, "orders")
    assert proto.to_column(data, at(0)) == {"id": 5, "tags": ["a", "b"]}
    pool = built_pool(ORDER_PROTO, {})[1]  # the class of the reader's own, built from the .proto text
    order = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    context = SerializationContext("orders", MessageField.VALUE)
    read = ProtobufDeserializer(order, {}, SchemaRegistryClient({"url": url}))(data, context)
    assert (read.id, list(read.tags)) == (5, ["a", "b"])
    payments = options(url, value_format="json-registry", json_schema=PAYMENT,
                       value_subject_name_strategy="record").value_format
    assert payments.to_column(payments.to_bytes({"id": 9}, "orders"), at(1)) == {"id": 9}
    assert "'Payment'" in refused(ErrorCode.INVALID_RECORD, payments.to_bytes, {"id": "nine"}, "orders")


def test_spark_rows_from_foreach_batch_are_written_as_their_structs(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("orders-value", "AVRO", ORDER, [])
    chosen = options(url, value_format="avro-registry")
    record, _ = RowMapping.of(chosen, ["key", "value"]).record(Row(key="k", value=Row(id=4, note="n")))
    assert chosen.value_format.to_column(record.value, at(0)) == {"id": 4, "note": "n"}


def test_a_format_that_has_written_still_ships_to_tasks_and_writes_alike(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("orders-value", "PROTOBUF", ORDER_PROTO, [])
    chosen = options(url, value_format="protobuf-registry").value_format
    written = chosen.to_bytes({"id": 5, "tags": ["a"]}, "orders")
    shipped = pickle.loads(pickle.dumps(chosen))  # as Spark ships it to its tasks, after a write on the driver
    assert shipped == chosen and shipped.to_bytes({"id": 5, "tags": ["a"]}, "orders") == written


def test_avro_rows_after_the_first_are_written_as_confluents_serializer_writes_them(
        registry: tuple[SchemaRegistry, str]) -> None:
    """The sink writes a topic's first row through confluent-kafka's AvroSerializer and the rest with its framing and
    fastavro (serdes.avro_records): the same bytes, under each topic's subject, and misfits still INVALID_RECORD."""
    kept, url = registry
    chosen = options(url, value_format="avro-registry", avro_schema=ORDER, auto_register_schemas="true").value_format
    confluent = AvroSerializer(SchemaRegistryClient({"url": url}), ORDER, conf={"auto.register.schemas": False})
    rows = [{"id": i, "note": None if i % 2 else f"n{i}"} for i in range(5)]
    for topic in ("orders", "returns", "orders"):
        written = [chosen.to_bytes(row, topic) for row in rows]
        assert written == [confluent(row, SerializationContext(topic, MessageField.VALUE)) for row in rows]
        assert "returns: " in refused(ErrorCode.INVALID_RECORD, chosen.to_bytes, {"id": 1, "note": 2}, "returns")
    assert kept.subjects() == ["orders-value", "returns-value"]  # registered by the first row of each topic


def test_avro_rows_are_written_by_confluents_serializer_where_fastavros_internals_differ(
        registry: tuple[SchemaRegistry, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path calls fastavro's compiled writer, which is not fastavro's public API: a fastavro release that
    calls it otherwise must not fail the sink's writes, only make them as slow as confluent-kafka's own."""
    class Changed:
        @staticmethod
        def write_data(out: bytearray, value: object) -> None:  # another signature
            raise AssertionError("not reached")

    monkeypatch.setattr(serdes, "_fastavro_write", Changed)
    _, url = registry
    chosen = options(url, value_format="avro-registry", avro_schema=ORDER, auto_register_schemas="true").value_format
    confluent = AvroSerializer(SchemaRegistryClient({"url": url}), ORDER, conf={"auto.register.schemas": False})
    rows = [{"id": i, "note": f"n{i}"} for i in range(3)]
    assert [chosen.to_bytes(row, "orders") for row in rows] == [
        confluent(row, SerializationContext("orders", MessageField.VALUE)) for row in rows]

