"""The sink and the source with the schema registry's formats (avro-registry, protobuf-registry, json-registry) on
real PySpark: what the sink writes, confluent-kafka's own deserializers read; what the source reads is Spark
structs; a row that does not fit and a record whose schema id is unknown fail with typed errors, writing nothing."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from onceflow.connector import Consumer, TopicPartition
from onceflow.connector.store import Record, Store, read_stream
from onceflow.schemas.registry import SchemaRegistry

pytestmark = [pytest.mark.spark]  # with pytest-xdist, run with --dist loadfile: one worker, one Spark session

ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
]})
ORDER_COLUMNS = ("id long, customer string, note string, tags array<string>, attrs map<string, bigint>, status string, "
                 "amount decimal(9,2), day date, at timestamp, lines array<struct<sku: string, qty: int>>")


def order(i: int) -> dict[str, Any]:
    return {"id": i, "customer": f"c{i % 3}", "note": None if i % 2 else f"note {i}", "tags": [f"t{i}"] * (i % 3),
            "attrs": {"n": i}, "status": "PAID" if i % 2 else "NEW", "amount": decimal.Decimal(i) / 4,
            "day": datetime.date(2024, 1, 1 + i), "at": datetime.datetime(2024, 1, 1, i, tzinfo=datetime.UTC),
            "lines": [{"sku": f"s{i}", "qty": i}]}


def consumed(store: Store, topic: str) -> list[bytes]:
    """The values of ``topic``'s partition 0, read through onceflow's Consumer."""
    consumer = Consumer({"store.url": store.url, "group.id": "check", "enable.auto.commit": False})
    with contextlib.closing(consumer):
        consumer.assign([TopicPartition(topic, 0, 0)])
        return [m.value() or b"" for m in consumer.consume(1000, timeout=10)]


def registry_options(writer: Any, store: Store, url: str, topic: str, value_format: str) -> Any:
    return (writer.format("onceflow").option("store.url", store.url).option("topic", topic)
            .option("value.format", value_format).option("schema.registry.url", url))


def test_rows_written_as_avro_registry_are_read_back_as_structs_and_by_confluents_deserializer(
        spark: Any, embedded: Store, registry: tuple[SchemaRegistry, str], tmp_path: Path) -> None:
    kept, url = registry
    schema_id = kept.register("orders-value", "AVRO", ORDER, [])
    embedded.create_stream("orders", 1)
    rows = spark.createDataFrame([(o["customer"], *o.values()) for o in map(order, range(6))],
                                 f"key string, {ORDER_COLUMNS}")
    registry_options(rows.write, embedded, url, "orders", "avro-registry").option("job.id", "load").mode(
        "append").save()  # no value column: the other columns make up the value; the subject's latest schema

    written = consumed(embedded, "orders")
    assert {int.from_bytes(v[1:5], "big") for v in written} == {schema_id}
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": url}))
    context = SerializationContext("orders", MessageField.VALUE)
    assert sorted((deserialize(v, context) for v in written), key=lambda o: o["id"]) == [order(i) for i in range(6)]

    kept.register("copies-value", "AVRO", ORDER, [])
    embedded.create_stream("copies", 1)  # a streaming query copies the structs it reads, re-serialized
    (registry_options(spark.readStream, embedded, url, "orders", "avro-registry").load().select("key", "value")
     .writeStream.format("onceflow").option("store.url", embedded.url).option("topic", "copies")
     .option("sink.id", "copies").option("value.format", "avro-registry").option("schema.registry.url", url)
     .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start().awaitTermination())
    assert sorted((deserialize(v, context) for v in consumed(embedded, "copies")), key=lambda o: o["id"]) == [
        order(i) for i in range(6)]

    read = registry_options(spark.read, embedded, url, "orders", "avro-registry").load()
    assert read.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,customer:string,note:string,tags:array<string>,attrs:map<string,bigint>,status:string,"
        "amount:decimal(9,2),day:date,at:timestamp,lines:array<struct<sku:string,qty:int>>>")
    assert sorted(read.select("value.*").collect()) == sorted(rows.drop("key").collect())


def test_a_row_that_does_not_fit_and_a_record_of_an_unknown_schema_id_write_nothing(
        spark: Any, embedded: Store, registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("orders-value", "AVRO", ORDER, [])
    embedded.create_stream("orders", 1)
    embedded.create_stream("copy", 1)
    misfit = spark.createDataFrame([(i, f"c{i}") for i in range(5)], "id long, customer string")  # no tags, ...
    with pytest.raises(Exception, match=r"INVALID_RECORD.*orders-value"):
        registry_options(misfit.write, embedded, url, "orders", "avro-registry").option("job.id", "j").mode(
            "append").save()
    assert list(read_stream(embedded, "orders")) == []

    with contextlib.closing(embedded.open_writer()) as writer:
        writer.append("orders", 0, [Record(b"k", b"\x00" + (4242).to_bytes(4, "big") + b"\x02")])
    records = registry_options(spark.read, embedded, url, "orders", "avro-registry").load()
    with pytest.raises(Exception, match=r"_VALUE_DESERIALIZATION.*orders\[0\]@0: the value's schema id 4242 is not"):
        records.select("key", "value.id").write.format("onceflow").option("store.url", embedded.url).option(
            "topic", "copy").option("job.id", "copy").option("value.format", "json").mode("append").save()
    assert list(read_stream(embedded, "copy")) == []


def test_protobuf_values_and_json_schema_keys_are_read_back_as_structs(
        spark: Any, embedded: Store, registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("events-value", "PROTOBUF", 'syntax = "proto3"; package app; message Event { int64 id = 1; '
                  'repeated string tags = 2; map<string, int32> counts = 3; }', [])
    kept.register("events-key", "JSON", json.dumps({"type": "object", "properties": {"user": {"type": "string"}}}),
                  [])
    embedded.create_stream("events", 2)
    rows = spark.createDataFrame([((f"u{i % 2}",), (i, [f"t{i}"], {"n": i})) for i in range(8)],
                                 "key struct<user: string>, value struct<id: long, tags: array<string>, "
                                 "counts: map<string, int>>")
    (registry_options(rows.write, embedded, url, "events", "protobuf-registry").option("key.format", "json-registry")
     .option("job.id", "events").mode("append").save())

    read = (registry_options(spark.read, embedded, url, "events", "protobuf-registry")
            .option("key.format", "json-registry").load())
    assert [read.schema[c].dataType.simpleString() for c in ("key", "value")] == [
        "struct<user:string>", "struct<id:bigint,tags:array<string>,counts:map<string,int>>"]
    assert sorted(read.select("key", "value").collect()) == sorted(rows.collect())


READING = json.dumps({"type": "record", "name": "Reading", "namespace": "lab", "fields": [
    {"name": "id", "type": ["int", "long"]},
    {"name": "measure", "type": ["null", "long", "string", {"type": "record", "name": "Pair", "fields": [
        {"name": "a", "type": "double"}, {"name": "b", "type": "double"}]}]},
    {"name": "opens", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "closes", "type": {"type": "long", "logicalType": "time-micros"}},
]})
READING_COLUMNS = ("id long, measure struct<member0: long, member1: string, member2: struct<a: double, b: double>>, "
                   "opens int, closes long")


def test_avro_unions_of_several_types_are_member_structs_and_times_numbers_both_ways(
        spark: Any, embedded: Store, registry: tuple[SchemaRegistry, str]) -> None:
    kept, url = registry
    kept.register("readings-value", "AVRO", READING, [])
    embedded.create_stream("readings", 1)
    values = [None, (7, None, None), (None, "seven", None), (None, None, (0.5, 2.0))]
    rows = spark.createDataFrame([(i, values[i % 4], 3_600_000 + i, 7_200_000_000 + i) for i in range(8)],
                                 READING_COLUMNS)
    registry_options(rows.write, embedded, url, "readings", "avro-registry").option("job.id", "r").mode(
        "append").save()

    deserialize = AvroDeserializer(SchemaRegistryClient({"url": url}))
    context = SerializationContext("readings", MessageField.VALUE)
    plain = [None, 7, "seven", {"a": 0.5, "b": 2.0}]
    assert sorted((deserialize(v, context) for v in consumed(embedded, "readings")), key=lambda r: r["id"]) == [
        {"id": i, "measure": plain[i % 4], "opens": datetime.time(1, 0, 0, 1000 * i),
         "closes": datetime.time(2, 0, 0, i)} for i in range(8)]

    read = registry_options(spark.read, embedded, url, "readings", "avro-registry").load()
    assert read.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,measure:struct<member0:bigint,member1:string,member2:struct<a:double,b:double>>,"
        "opens:int,closes:bigint>")
    assert sorted(read.select("value.*").collect()) == sorted(rows.collect())

    kept.register("trees-value", "AVRO", json.dumps({"type": "record", "name": "Tree", "namespace": "lab", "fields": [
        {"name": "children", "type": {"type": "array", "items": "Tree"}}]}), [])
    embedded.create_stream("trees", 1)
    with pytest.raises(Exception, match=r"INVALID_CONFIG.*recursive type 'lab.Tree'"):
        registry_options(spark.read, embedded, url, "trees", "avro-registry").load().schema  # noqa: B018
