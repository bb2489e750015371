"""Protobuf and JSON Schema in the registry: confluent-kafka's own serdes through onceflow's clients (and plain
confluent-kafka clients on Kafka), bad schemas refused, and each level's passing and failing evolutions."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from onceflow.connector import Consumer, Producer, TopicPartition
from onceflow.connector.store import Store, open_store, read_range
from onceflow.schemas.registry import STREAM, RegistryError, RegistryServer, SchemaRegistry
from tests.schemas.test_registry import ORDER_V1, call

Field = descriptor_pb2.FieldDescriptorProto
LEVELS = ["BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE"]
PAYMENT = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}, "method": {"type": "string"}},
                      "required": ["id"]})


def order_file(*fields: tuple[str, int, int], reserved: tuple[int, ...] = ()) -> descriptor_pb2.FileDescriptorProto:
    """order.proto with message shop.Order of (name, number, type) fields, ``reserved`` numbers reserved."""
    file = descriptor_pb2.FileDescriptorProto(name="order.proto", package="shop", syntax="proto3")
    message = file.message_type.add(name="Order")
    for name, number, kind in fields:
        message.field.add(name=name, number=number, type=kind, label=Field.LABEL_OPTIONAL, json_name=name)
    for number in reserved:
        message.reserved_range.add(start=number, end=number + 1)
    return file


def proto_text(file: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.b64encode(file.SerializeToString()).decode()


ORDER = order_file(("id", 1, Field.TYPE_INT64), ("note", 2, Field.TYPE_STRING))


def order_class() -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(ORDER)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def produce_and_read(store: Store, topic: str, values: list[bytes]) -> list[bytes]:
    """``values`` written by onceflow's Producer and read back by its Consumer."""
    store.create_stream(topic, 1)
    producer = Producer({"store.url": store.url})
    for value in values:
        producer.produce(topic, value, partition=0)
    producer.flush()
    consumer = Consumer({"store.url": store.url, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = consumer.consume(len(values), timeout=30)
    consumer.close()
    return [m.value() or b"" for m in read]


def test_confluent_protobuf_serdes_round_trip_through_onceflow_clients(served: tuple[Store, str]) -> None:
    store, url = served
    client, order = SchemaRegistryClient({"url": url}), order_class()
    context = SerializationContext("orders", MessageField.VALUE)
    serialize = ProtobufSerializer(order, client, {"use.deprecated.format": False})
    values = produce_and_read(store, "orders", [serialize(order(id=i, note=f"n{i}"), context) for i in range(3)])
    assert [v[:1] + v[5:6] for v in values] == [b"\x00\x00"] * 3  # magic byte, id, message index [0] as one byte
    schema = client.get_latest_version("orders-value")
    assert schema.schema.schema_type == "PROTOBUF" and schema.schema_id == int.from_bytes(values[0][1:5], "big")
    deserialize = ProtobufDeserializer(order, {"use.deprecated.format": False}, client)
    assert [(m.id, m.note) for m in (deserialize(v, context) for v in values)] == [(0, "n0"), (1, "n1"), (2, "n2")]


def test_confluent_json_serdes_round_trip_through_onceflow_clients(served: tuple[Store, str]) -> None:
    store, url = served
    client, context = SchemaRegistryClient({"url": url}), SerializationContext("payments", MessageField.VALUE)
    serialize = JSONSerializer(PAYMENT, client)
    values = produce_and_read(store, "payments", [serialize({"id": i, "method": "card"}, context) for i in range(2)])
    assert client.get_latest_version("payments-value").schema.schema_type == "JSON"
    deserialize = JSONDeserializer(None, schema_registry_client=client)  # the writer's schema, fetched by id
    assert [deserialize(v, context) for v in values] == [{"id": 0, "method": "card"}, {"id": 1, "method": "card"}]
    with pytest.raises(Exception, match="is not of type 'integer'"):  # the serializer validates against it
        serialize({"id": "one"}, context)


@pytest.mark.kafka
def test_plain_confluent_kafka_clients_read_and_write_alongside_onceflows(kafka_bootstrap: str) -> None:
    """On a Kafka store: onceflow's Producer writes Avro a plain confluent-kafka Consumer reads, and a plain
    Producer writes JSON onceflow's Consumer reads, the registry itself kept on the same cluster."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    store = open_store(f"kafka://{kafka_bootstrap}/{namespace}")
    registry = SchemaRegistry(store)
    server = RegistryServer(registry, port=0).start()
    client = SchemaRegistryClient({"url": server.url})
    try:
        context = SerializationContext("orders", MessageField.VALUE)
        produce_and_read(store, "orders", [AvroSerializer(client, ORDER_V1)({"id": 7}, context)])
        plain = confluent_kafka.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": namespace,
                                          "isolation.level": "read_committed", "enable.auto.commit": False})
        plain.assign([confluent_kafka.TopicPartition(f"{namespace}.orders", 0, 0)])
        read = plain.consume(1, timeout=30)
        plain.close()
        assert [AvroDeserializer(client)(m.value(), context) for m in read] == [{"id": 7}]

        store.create_stream("payments", 1)
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
        payments = SerializationContext("payments", MessageField.VALUE)
        producer.produce(f"{namespace}.payments", JSONSerializer(PAYMENT, client)({"id": 1}, payments), partition=0)
        assert producer.flush(30) == 0
        consumer = Consumer({"store.url": store.url, "group.id": "g", "enable.auto.commit": False})
        consumer.assign([TopicPartition("payments", 0, 0)])
        values = [m.value() for m in consumer.consume(1, timeout=30)]
        consumer.close()
        assert [JSONDeserializer(None, schema_registry_client=client)(v, payments) for v in values] == [{"id": 1}]
        assert _config(kafka_bootstrap, f"{namespace}.{STREAM}", "retention.ms") == "-1"  # the schemas never expire
    finally:
        server.close()
        registry.close()
        store.close()


def _config(bootstrap: str, topic: str, name: str) -> str:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    resource = confluent_kafka.admin.ConfigResource(confluent_kafka.admin.RESOURCE_TOPIC, topic)
    return str(admin.describe_configs([resource])[resource].result(timeout=30)[name].value)


@pytest.mark.parametrize(("schema_type", "text"), ids=[
    "proto-no-number", "proto-undefined-type", "proto-not-a-descriptor", "json-bad-type", "json-array"], argvalues=[
    ("PROTOBUF", "syntax = \"proto3\"; message Order { int64 id = ; }"),
    ("PROTOBUF", proto_text(order_file(("shop", 1, Field.TYPE_MESSAGE)))),  # a field of no type
    ("PROTOBUF", base64.b64encode(b"\xff\xff").decode()),
    ("JSON", json.dumps({"type": "object", "properties": {"id": {"type": 5}}})),
    ("JSON", "[1, 2]"),
])
def test_a_bad_schema_gets_42201_and_nothing_is_stored(store_url: str, schema_type: str, text: str) -> None:
    store = open_store(store_url)
    registry = SchemaRegistry(store)
    server = RegistryServer(registry, port=0).start()
    url = server.url
    status, body = call("POST", f"{url}/subjects/s/versions", {"schema": text, "schemaType": schema_type})
    assert (status, body["error_code"]) == (422, 42201), body
    assert list(read_range(store, STREAM, 0)) == []
    server.close()
    registry.close()


def test_a_protobuf_schema_imports_its_references_and_well_known_types(store_url: str) -> None:
    registry = SchemaRegistry(open_store(store_url))
    money = descriptor_pb2.FileDescriptorProto(name="money.proto", package="shop", syntax="proto3")
    money.message_type.add(name="Money").field.add(name="cents", number=1, type=Field.TYPE_INT64,
                                                   label=Field.LABEL_OPTIONAL)
    registry.register("money", "PROTOBUF", proto_text(money))
    order = order_file(("id", 1, Field.TYPE_INT64))
    order.dependency.extend(["money.proto", "google/protobuf/timestamp.proto"])
    order.message_type[0].field.add(name="total", number=2, type=Field.TYPE_MESSAGE, type_name=".shop.Money",
                                    label=Field.LABEL_OPTIONAL)
    order.message_type[0].field.add(name="at", number=3, type=Field.TYPE_MESSAGE,
                                    type_name=".google.protobuf.Timestamp", label=Field.LABEL_OPTIONAL)
    with pytest.raises(RegistryError, match=r"money\.proto"):  # not resolvable without its reference
        registry.register("orders", "PROTOBUF", proto_text(order))
    assert registry.register("orders", "PROTOBUF", proto_text(order), [
        {"name": "money.proto", "subject": "money", "version": 1}]) == 2
    registry.close()


def json_object(required: list[str], **properties: Any) -> str:
    return json.dumps({"type": "object", "properties": properties, "required": required})


JSON_BASE = json_object(["id"], id={"type": "integer"})
JSON_ADDS_OPTIONAL = json_object(["id"], id={"type": "integer"}, note={"type": "string"})
JSON_ADDS_REQUIRED = json_object(["id", "note"], id={"type": "integer"}, note={"type": "string"})
JSON_WIDENS = json_object(["id"], id={"type": ["integer", "string"]})
PROTO_BASE = proto_text(ORDER)
PROTO_ADDS = proto_text(order_file(("id", 1, Field.TYPE_INT64), ("note", 2, Field.TYPE_STRING),
                                   ("qty", 3, Field.TYPE_INT32)))
PROTO_DROPS_RESERVED = proto_text(order_file(("id", 1, Field.TYPE_INT64), reserved=(2,)))
PROTO_DROPS = proto_text(order_file(("id", 1, Field.TYPE_INT64)))
PROTO_RETYPES = proto_text(order_file(("id", 1, Field.TYPE_INT64), ("note", 2, Field.TYPE_DOUBLE)))
PROTO_RENUMBERS = proto_text(order_file(("id", 1, Field.TYPE_INT64), ("note", 3, Field.TYPE_STRING)))
# (type, base, evolution, the levels' families that accept it, the word the refusal names)
EVOLUTIONS = [pytest.param(*e, id=name) for name, e in zip([
    "json-adds-optional", "json-adds-required", "json-widens", "proto-adds", "proto-drops-reserved", "proto-drops",
    "proto-retypes", "proto-renumbers"], [
    ("JSON", JSON_BASE, JSON_ADDS_OPTIONAL, {"BACKWARD", "FORWARD", "FULL"}, ""),
    ("JSON", JSON_BASE, JSON_ADDS_REQUIRED, {"FORWARD"}, "note"),
    ("JSON", JSON_BASE, JSON_WIDENS, {"BACKWARD"}, "string"),
    ("PROTOBUF", PROTO_BASE, PROTO_ADDS, {"BACKWARD", "FORWARD", "FULL"}, ""),
    ("PROTOBUF", PROTO_BASE, PROTO_DROPS_RESERVED, {"BACKWARD", "FORWARD", "FULL"}, ""),
    ("PROTOBUF", PROTO_BASE, PROTO_DROPS, set(), "removed"),
    ("PROTOBUF", PROTO_BASE, PROTO_RETYPES, set(), "retyped"),
    ("PROTOBUF", PROTO_BASE, PROTO_RENUMBERS, set(), "renumbered"),
], strict=True)]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistry]:
    shared = SchemaRegistry(open_store(f"sqlite://{tmp_path_factory.mktemp('matrix') / 'store.db'}"))
    yield shared
    shared.close()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("schema_type", "base", "new", "accepted_by", "named"), EVOLUTIONS)
def test_each_level_accepts_the_json_and_protobuf_evolutions_it_can_read(
        registry: SchemaRegistry, level: str, schema_type: str, base: str, new: str, accepted_by: set[str],
        named: str) -> None:
    subject = uuid.uuid4().hex
    registry.set_level(subject, level)
    registry.register(subject, schema_type, base)
    if level == "NONE" or level.removesuffix("_TRANSITIVE") in accepted_by:
        registry.register(subject, schema_type, new)
        assert registry.versions(subject) == [1, 2]
    else:
        with pytest.raises(RegistryError) as info:
            registry.register(subject, schema_type, new)
        assert info.value.status == 409 and named in info.value.message, info.value.message
        assert registry.versions(subject) == [1]
