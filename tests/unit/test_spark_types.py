"""Registry schemas as Spark columns, without Spark: the type each schema is read as and the values it becomes."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from onceflow.connector import ErrorCode, KafkaException
from onceflow.spark_sinks.spark_types import avro_column, json_column, protobuf_column

LINE = {"type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}]}


def test_avro_types_map_to_spark_types_unions_with_null_nullable() -> None:
    schema = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "ok", "type": "boolean"}, {"name": "f", "type": "float"},
        {"name": "d", "type": "double"}, {"name": "n", "type": "int"}, {"name": "raw", "type": "bytes"},
        {"name": "note", "type": ["null", "string"]},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "amount", "type": {"type": "fixed", "name": "Amount", "size": 8, "logicalType": "decimal",
                                    "precision": 12, "scale": 3}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "first", "type": ["null", LINE]}, {"name": "rest", "type": {"type": "array", "items": "shop.Line"}},
        {"name": "by", "type": {"type": "map", "values": ["null", "Line"]}},
    ]}
    column = avro_column(schema)
    assert column.type.simpleString() == (
        "struct<id:bigint,ok:boolean,f:float,d:double,n:int,raw:binary,note:string,status:string,hash:binary,"
        "amount:decimal(12,3),day:date,at:timestamp,local:timestamp_ntz,first:struct<sku:string>,"
        "rest:array<struct<sku:string>>,by:map<string,struct<sku:string>>>")
    nullable = {f.name: f.nullable for f in column.type.fields}  # type: ignore[attr-defined]
    assert [name for name, yes in nullable.items() if yes] == ["note", "first"]
    assert column.type.fields[-1].dataType.valueContainsNull  # type: ignore[attr-defined]
    assert column.convert is None  # fastavro's values are Spark's: rows pass through as they are


def test_an_avro_uuid_becomes_text() -> None:
    column = avro_column({"type": "record", "name": "R", "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}}]})
    value = uuid.UUID(int=7)
    assert column.apply({"id": value}) == {"id": str(value)}


@pytest.mark.parametrize(("schema", "where"), [  # unions and time types: tests/schemas/test_avro_spark_types.py
    ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}, "next: the recursive"),
], ids=["recursive"])
def test_avro_types_spark_cannot_hold_are_refused_naming_the_field(schema: Any, where: str) -> None:
    with pytest.raises(KafkaException) as info:
        avro_column(schema)
    assert info.value.code == ErrorCode.INVALID_CONFIG and where in str(info.value)


Field = descriptor_pb2.FieldDescriptorProto


def order_message() -> Any:
    """shop.Order: scalars, an enum, a nested message, repeated, a map, a Timestamp, a proto3 optional."""
    file = descriptor_pb2.FileDescriptorProto(name="o.proto", package="shop", syntax="proto3",
                                              dependency=["google/protobuf/timestamp.proto"])
    file.enum_type.add(name="Status").value.add(name="NEW", number=0)
    file.enum_type[0].value.add(name="PAID", number=1)
    file.message_type.add(name="Line").field.add(name="sku", number=1, type=Field.TYPE_STRING)
    order = file.message_type.add(name="Order")
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=Field.TYPE_STRING)
    entry.field.add(name="value", number=2, type=Field.TYPE_INT32)
    for name, number, kind, extra in [
        ("id", 1, Field.TYPE_INT64, {}), ("big", 2, Field.TYPE_UINT64, {}), ("small", 3, Field.TYPE_UINT32, {}),
        ("status", 4, Field.TYPE_ENUM, {"type_name": ".shop.Status"}),
        ("line", 5, Field.TYPE_MESSAGE, {"type_name": ".shop.Line"}),
        ("lines", 6, Field.TYPE_MESSAGE, {"type_name": ".shop.Line", "label": Field.LABEL_REPEATED}),
        ("attrs", 7, Field.TYPE_MESSAGE, {"type_name": ".shop.Order.AttrsEntry", "label": Field.LABEL_REPEATED}),
        ("at", 8, Field.TYPE_MESSAGE, {"type_name": ".google.protobuf.Timestamp"}),
        ("raw", 9, Field.TYPE_BYTES, {}), ("ok", 10, Field.TYPE_BOOL, {}),
    ]:
        order.field.add(name=name, number=number, type=kind, **extra)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_protobuf_messages_map_to_structs_and_read_as_dicts() -> None:
    order = order_message()
    column = protobuf_column(order.DESCRIPTOR)
    assert column.type.simpleString() == (
        "struct<id:bigint,big:decimal(20,0),small:bigint,status:string,line:struct<sku:string>,"
        "lines:array<struct<sku:string>>,attrs:map<string,int>,at:timestamp,raw:binary,ok:boolean>")
    at = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    message = order(id=1, big=2**64 - 1, small=2**32 - 1, status=1, lines=[{"sku": "a"}], attrs={"x": 3},
                    raw=b"\x00")
    message.at.FromDatetime(at)
    assert column.apply(message) == {
        "id": 1, "big": decimal.Decimal(2**64 - 1), "small": 2**32 - 1, "status": "PAID", "line": None,
        "lines": [{"sku": "a"}], "attrs": {"x": 3}, "at": at, "raw": b"\x00", "ok": False}


def test_json_schema_objects_with_properties_are_structs_the_rest_json_text() -> None:
    schema = {"type": "object", "properties": {
        "id": {"type": "integer"}, "price": {"type": "number"}, "name": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "extra": {}, "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "line": {"type": "object", "properties": {"sku": {"type": "string"}}}}}
    column = json_column(schema)
    assert column.type.simpleString() == (
        "struct<id:bigint,price:double,name:string,tags:array<string>,counts:map<string,bigint>,extra:string,"
        "either:string,line:struct<sku:string>>")
    assert column.apply({"id": 1, "price": 2, "tags": ["a"], "counts": {"a": 1}, "extra": {"deep": [1]},
                         "either": 3, "undeclared": True}) == {
        "id": 1, "price": 2.0, "name": None, "tags": ["a"], "counts": {"a": 1}, "extra": '{"deep":[1]}',
        "either": "3", "line": None}
    assert isinstance(column.apply({"price": 2})["price"], float)
    whole = json_column({"type": "object"})
    assert whole.type.simpleString() == "string" and json.loads(whole.apply({"a": [1]})) == {"a": [1]}
