"""Confluent's registry converters (Avro, Protobuf, JSON Schema) against onceflow's own registry: connector data
round-trips, what they write confluent-kafka's own deserializers read and what confluent-kafka's serializers write
they read, configs name them by Confluent's class names and keys, and failures are typed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory, wrappers_pb2

from onceflow.connect.app import ConnectWorker
from onceflow.connect.converters import Converter
from onceflow.connect.plugins import Plugins
from onceflow.connect.records import Field, Schema
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import open_store, read_stream
from onceflow.schemas.registry import RegistryServer, SchemaRegistry
from onceflow.schemas.registry.protobuf import built_pool
from tests.connect.conftest import wait_until
from tests.connect.sample_plugins import COLLECTED, COLLECTING, COUNTING, PLUGINS

AVRO = "io.confluent.connect.avro.AvroConverter"
PROTOBUF = "io.confluent.connect.protobuf.ProtobufConverter"
JSON_SCHEMA = "io.confluent.connect.json.JsonSchemaConverter"
CONVERTERS = [AVRO, PROTOBUF, JSON_SCHEMA]
ORDER = Schema("struct", name="shop.Order", fields=(
    Field("id", Schema("int64")), Field("note", Schema("string", True)),
    Field("tags", Schema("array", value_schema=Schema("string"))),
    Field("counts", Schema("map", key_schema=Schema("string"), value_schema=Schema("int32"))),
    Field("blob", Schema("bytes", True)), Field("price", Schema("float64"))))
VALUE = {"id": 7, "note": None, "tags": ["a", "b"], "counts": {"x": 1, "y": 2}, "blob": b"\x00\xff", "price": 2.5}
CONTEXT = SerializationContext("orders", MessageField.VALUE)
ORDER_PROTO = ('syntax = "proto3"; package shop; message Order { int64 id = 1; repeated string tags = 2; '
               'optional string note = 3; }')


@pytest.fixture
def registry(tmp_path: Any) -> Iterator[tuple[SchemaRegistry, str]]:
    store = open_store(f"sqlite://{tmp_path / 'registry.db'}")
    kept = SchemaRegistry(store)
    server = RegistryServer(kept, "127.0.0.1", 0).start()
    yield kept, server.url
    server.close()
    kept.close()
    store.close()


def converter(name: str, url: str, is_key: bool = False, **settings: str) -> Converter:
    """The converter a config naming ``name`` gets, found through the installed plugins."""
    made = Plugins().converter(name)()
    made.configure({"schema.registry.url": url, **{k.replace("_", "."): v for k, v in settings.items()}}, is_key)
    return made


def refused(code: ErrorCode, call: Any, *args: Any) -> str:
    with pytest.raises(KafkaException) as info:
        call(*args)
    assert info.value.code == code, info.value
    return str(info.value)


@pytest.mark.parametrize("name", CONVERTERS)
def test_a_struct_round_trips_through_each_converter(registry: tuple[SchemaRegistry, str], name: str) -> None:
    kept, url = registry
    data = converter(name, url).from_connect_data("orders", ORDER, VALUE)
    assert data is not None and data[0] == 0 and kept.subjects() == ["orders-value"]
    schema, back = converter(name, url).to_connect_data("orders", data)  # a fresh converter: nothing cached
    assert back == VALUE
    assert schema is not None and schema.type == "struct" and schema.field("id") == Field("id", Schema("int64"))
    assert schema.field("note") == Field("note", Schema("string", True))


def test_confluents_own_deserializers_read_what_the_converters_write(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    client = SchemaRegistryClient({"url": url})
    avro = converter(AVRO, url).from_connect_data("orders", ORDER, VALUE)
    assert AvroDeserializer(client)(avro, CONTEXT) == VALUE
    as_json = converter(JSON_SCHEMA, url).from_connect_data("json-orders", ORDER, VALUE)
    read = JSONDeserializer(None, schema_registry_client=client)(as_json, SerializationContext("json-orders", "value"))
    assert read == {**{k: v for k, v in VALUE.items() if v is not None}, "blob": "AP8="}
    proto = converter(PROTOBUF, url).from_connect_data("pb-orders", ORDER, VALUE)
    registered = kept.version("pb-orders-value", "latest")[1]
    pool = built_pool(registered.schema, {})[1]
    order = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    message = ProtobufDeserializer(order, {}, schema_registry_client=client)(
        proto, SerializationContext("pb-orders", MessageField.VALUE))
    assert (message.id, list(message.tags), dict(message.counts), message.blob, message.HasField("note")) == (
        7, ["a", "b"], {"x": 1, "y": 2}, b"\x00\xff", False)


def test_the_converters_read_what_confluents_own_serializers_write(registry: tuple[SchemaRegistry, str]) -> None:
    _, url = registry
    client = SchemaRegistryClient({"url": url})
    avro_schema = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}]})
    data = AvroSerializer(client, avro_schema)({"id": 3, "note": "n"}, CONTEXT)
    schema, value = converter(AVRO, url).to_connect_data("orders", data)
    assert value == {"id": 3, "note": "n"}
    assert schema == Schema("struct", name="shop.Order", fields=(Field("id", Schema("int64")),
                                                                 Field("note", Schema("string", True))))
    json_schema = json.dumps({"type": "object", "title": "Payment", "required": ["id"], "properties": {
        "id": {"type": "integer"}, "memo": {"type": "string"}}})
    json_context = SerializationContext("payments", MessageField.VALUE)
    data = JSONSerializer(json_schema, client)({"id": 9, "memo": "m"}, json_context)
    schema, value = converter(JSON_SCHEMA, url).to_connect_data("payments", data)
    assert value == {"id": 9, "memo": "m"}
    assert schema == Schema("struct", name="Payment", fields=(Field("id", Schema("int64")),
                                                              Field("memo", Schema("string", True))))
    order = message_factory.GetMessageClass(built_pool(ORDER_PROTO, {})[1].FindMessageTypeByName("shop.Order"))
    proto_context = SerializationContext("pb", MessageField.VALUE)
    data = ProtobufSerializer(order, client, {"use.deprecated.format": False})(order(id=5, tags=["t"]), proto_context)
    schema, value = converter(PROTOBUF, url).to_connect_data("pb", data)
    assert value == {"id": 5, "tags": ["t"], "note": None}
    assert schema is not None and schema.name == "shop.Order" and schema.field("note") == Field(
        "note", Schema("string", True))


PRIMITIVES = [  # Connect schema, value, the wrapper Confluent's converter writes it in, the schema read back
    (Schema("string"), "hi", wrappers_pb2.StringValue, Schema("string")),
    (Schema("int8"), -3, wrappers_pb2.Int32Value, Schema("int32")),
    (Schema("int32"), 2**31 - 1, wrappers_pb2.Int32Value, Schema("int32")),
    (Schema("int64", True), 2**40, wrappers_pb2.Int64Value, Schema("int64")),
    (Schema("float32"), 0.5, wrappers_pb2.FloatValue, Schema("float32")),
    (Schema("float64"), 0.1, wrappers_pb2.DoubleValue, Schema("float64")),
    (Schema("boolean"), True, wrappers_pb2.BoolValue, Schema("boolean")),
    (Schema("bytes"), b"\x00\xff", wrappers_pb2.BytesValue, Schema("bytes")),
]


@pytest.mark.parametrize(("schema", "value", "wrapper", "read_as"), PRIMITIVES,
                         ids=[p[0].type for p in PRIMITIVES])
def test_a_protobuf_primitive_is_written_in_its_wrapper_message_and_read_back_unwrapped(
        registry: tuple[SchemaRegistry, str], schema: Schema, value: Any, wrapper: Any, read_as: Schema) -> None:
    kept, url = registry
    client, context = SchemaRegistryClient({"url": url}), SerializationContext("prims", MessageField.VALUE)
    data = converter(PROTOBUF, url).from_connect_data("prims", schema, value)
    assert data is not None and kept.version("prims-value", "latest")[1].schema_type == "PROTOBUF"
    # without a registry client: given one, confluent-kafka's deserializer cannot build wrappers.proto (the writer's
    # schema) into its pool, which holds the well-known files already (duplicate symbols)
    assert ProtobufDeserializer(wrapper, {"use.deprecated.format": False})(data, context).value == value
    assert converter(PROTOBUF, url).to_connect_data("prims", data) == (read_as, value)  # a fresh converter

    written = ProtobufSerializer(wrapper, client, {"use.deprecated.format": False})(wrapper(value=value), context)
    assert converter(PROTOBUF, url).to_connect_data("prims", written) == (read_as, value)


def test_protobuf_values_without_a_wrapper_are_refused_as_confluents_converter_refuses_them(
        registry: tuple[SchemaRegistry, str]) -> None:
    url = registry[1]
    array = Schema("array", value_schema=Schema("string"))
    assert "Unsupported root schema of type array" in refused(
        ErrorCode._VALUE_SERIALIZATION, converter(PROTOBUF, url).from_connect_data, "prims", array, ["a"])
    assert "topic prims" in refused(ErrorCode._VALUE_SERIALIZATION, converter(PROTOBUF, url).from_connect_data,
                                    "prims", Schema("int32"), "seven")
    assert registry[0].subjects() == []


@pytest.mark.parametrize("name", CONVERTERS)
def test_an_unknown_schema_id_is_a_deserialization_error_naming_it(registry: tuple[SchemaRegistry, str],
                                                                   name: str) -> None:
    unknown = b"\x00" + (991).to_bytes(4, "big") + b"\x00\x02"
    message = refused(ErrorCode._KEY_DESERIALIZATION, converter(name, registry[1], is_key=True).to_connect_data,
                      "orders", unknown)
    assert "schema id 991 is not in the schema registry" in message and "topic orders" in message
    assert "Unknown magic byte" in refused(ErrorCode._VALUE_DESERIALIZATION, converter(name, registry[1])
                                           .to_connect_data, "orders", b"{plain json}")


@pytest.mark.parametrize("name", CONVERTERS)
def test_a_value_that_does_not_fit_its_schema_is_a_serialization_error(registry: tuple[SchemaRegistry, str],
                                                                       name: str) -> None:
    message = refused(ErrorCode._VALUE_SERIALIZATION, converter(name, registry[1]).from_connect_data, "orders", ORDER,
                      {**VALUE, "id": "seven"})
    assert "topic orders" in message


@pytest.mark.parametrize("name", CONVERTERS)
def test_the_subject_name_strategy_and_registration_follow_confluents_keys(registry: tuple[SchemaRegistry, str],
                                                                           name: str) -> None:
    kept, url = registry
    careful = converter(name, url, auto_register_schemas="false")
    assert "orders-value" in refused(ErrorCode._VALUE_SERIALIZATION, careful.from_connect_data, "orders", ORDER,
                                     VALUE)
    assert kept.subjects() == []
    by_record = converter(name, url, value_subject_name_strategy="io.confluent.kafka.serializers.subject."
                                                                 "TopicRecordNameStrategy")
    by_record.from_connect_data("orders", ORDER, VALUE)
    assert kept.subjects() == ["orders-shop.Order"]
    assert "use.latest.version" in refused(ErrorCode.INVALID_CONFIG, lambda: converter(
        name, url, auto_register_schemas="true", use_latest_version="true"))
    assert "value.subject.name.strategy" in refused(ErrorCode.INVALID_CONFIG, lambda: converter(
        name, url, value_subject_name_strategy="ByTopic"))


@pytest.mark.parametrize("name", [PROTOBUF, JSON_SCHEMA])
def test_a_source_and_a_sink_exchange_records_through_the_converter(worker_props: dict[str, str], name: str) -> None:
    registry = SchemaRegistry(open_store(worker_props["store.url"]))
    server = RegistryServer(registry, "127.0.0.1", 0).start()
    try:
        props = {**worker_props, "value.converter": name, "value.converter.schema.registry.url": server.url}
        with ConnectWorker(props, PLUGINS) as worker:
            worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers", "count": "20",
                                  "struct": "true"})
            worker.add_connector({"name": "schema-sink", "connector.class": COLLECTING, "topics": "numbers"})
            wait_until(lambda: len(COLLECTED.get("schema-sink", [])) == 20, f"the records through {name}")
            stored = [m.value() or b"" for m in read_stream(worker.store, "numbers")]
    finally:
        server.close()
        registry.close()
    assert [r.value for r in COLLECTED.pop("schema-sink")] == [{"n": n, "note": "x"} for n in range(20)]
    assert {data[:5] for data in stored} == {stored[0][:5]} and stored[0][0] == 0  # one schema id for all


def test_use_latest_version_writes_with_the_subjects_latest_schema(registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    first = converter(AVRO, url).from_connect_data("orders", ORDER, VALUE)
    assert first is not None
    latest = json.loads(kept.version("orders-value", "latest")[1].schema)
    latest["fields"].append({"name": "qty", "type": "int", "default": 1})
    latest_id = kept.register("orders-value", "AVRO", json.dumps(latest), [])
    data = converter(AVRO, url, auto_register_schemas="false", use_latest_version="true").from_connect_data(
        "orders", ORDER, VALUE)
    assert data is not None and int.from_bytes(data[1:5], "big") == latest_id != int.from_bytes(first[1:5], "big")
    schema, value = converter(AVRO, url).to_connect_data("orders", data)
    assert value == {**VALUE, "qty": 1} and schema is not None and schema.field("qty") == Field("qty", Schema("int32"))


def test_an_avro_record_without_a_connect_schema_is_a_key_deserialization_error(
        registry: tuple[SchemaRegistry, str]) -> None:
    _, url = registry
    either = json.dumps({"type": "record", "name": "Either", "fields": [{"name": "v", "type": ["int", "string"]}]})
    data = AvroSerializer(SchemaRegistryClient({"url": url}), either)({"v": 1}, SerializationContext("t", "key"))
    message = refused(ErrorCode._KEY_DESERIALIZATION, converter(AVRO, url, is_key=True).to_connect_data, "t", data)
    assert "has no Connect schema" in message
