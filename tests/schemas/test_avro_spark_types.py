"""Avro's unions of several types, time types and recursive types as Spark columns, without Spark: the Spark type
(as Spark's own from_avro gives it), and values through fastavro both ways (a column's value prepared, written
and read back, read by confluent-kafka's deserializer as the plain value)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import time
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import Store
from onceflow.schemas import serdes
from onceflow.spark_sinks.spark_types import avro_column

LINE = {"type": "record", "name": "Line", "namespace": "shop", "fields": [{"name": "sku", "type": "string"}]}
EVENT = {"type": "record", "name": "Event", "namespace": "shop", "fields": [
    {"name": "payload", "type": ["null", "int", "string", LINE, {"type": "array", "items": "string"}]},
    {"name": "code", "type": [{"type": "enum", "name": "Code", "symbols": ["A", "B"]}, "string"]},
    {"name": "raw", "type": [{"type": "fixed", "name": "Four", "size": 4}, "bytes"]},
    {"name": "ratio", "type": ["float", "double", "boolean"]},
    {"name": "count", "type": ["int", "long"]},
    {"name": "share", "type": ["null", "float", "double"]},
    {"name": "when", "type": ["null", {"type": "int", "logicalType": "date"},
                              {"type": "long", "logicalType": "timestamp-micros"}, "shop.Line"]},
    {"name": "opens", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "closes", "type": ["null", {"type": "long", "logicalType": "time-micros"}]},
    {"name": "many", "type": {"type": "array", "items": ["long", "string"]}},
]}
EVENT_TYPE = (
    "struct<payload:struct<member0:int,member1:string,member2:struct<sku:string>,member3:array<string>>,"
    "code:struct<member0:string,member1:string>,raw:struct<member0:binary,member1:binary>,"
    "ratio:struct<member0:float,member1:double,member2:boolean>,count:bigint,share:double,"
    "when:struct<member0:date,member1:timestamp,member2:struct<sku:string>>,opens:int,closes:bigint,"
    "many:array<struct<member0:bigint,member1:string>>>")


def members(n: int, index: int | None, value: Any) -> dict[str, Any]:
    """A union's member struct with ``n`` members, ``index`` set to ``value``."""
    return {f"member{i}": (value if i == index else None) for i in range(n)}


def event(i: int) -> dict[str, Any]:
    """An Event as a Spark row holds it: unions as member structs, times as numbers."""
    payloads = [(None, None), (0, i), (1, f"s{i}"), (2, {"sku": f"k{i}"}), (3, ["a", "b"])]
    index, payload = payloads[i % len(payloads)]
    return {
        "payload": None if index is None else members(4, index, payload),
        "code": members(2, 0, "B") if i % 2 else members(2, 1, f"free {i}"),
        "raw": members(2, 0, b"1234") if i % 2 else members(2, 1, b"xy"),
        "ratio": members(3, i % 3, [0.5, 0.1, True][i % 3]),
        "count": 2**40 + i if i % 2 else i, "share": None if i % 3 == 0 else i / 3,
        "when": members(3, i % 3, [datetime.date(2024, 2, 1 + i),
                                   datetime.datetime(2024, 2, 1, i, 0, 0, 7, tzinfo=datetime.UTC),
                                   {"sku": "w"}][i % 3]),
        "opens": 9 * 3_600_000 + i, "closes": None if i == 1 else 17 * 3_600_000_000 + i,
        "many": [members(2, 0, 2**40), members(2, 1, "x")],
    }


def through_fastavro(schema: Any, value: Any) -> Any:
    """``value`` prepared by the column, written by fastavro, read back and made the column's value again."""
    column, parsed = avro_column(schema), fastavro.parse_schema(schema)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, column.prepared(value))
    out.seek(0)
    return column.apply(fastavro.schemaless_reader(out, parsed, None))


def test_unions_of_several_types_are_member_structs_and_times_numbers_as_spark_reads_them() -> None:
    column = avro_column(EVENT)
    assert column.type.simpleString() == EVENT_TYPE
    nullable = {f.name: f.nullable for f in column.type.fields}  # type: ignore[attr-defined]
    assert [name for name, yes in nullable.items() if yes] == ["payload", "share", "when", "closes"]
    payload = column.type.fields[0].dataType  # type: ignore[attr-defined]
    assert all(f.nullable for f in payload.fields)  # one member is set at a time


@pytest.mark.parametrize("i", range(6))
def test_member_structs_and_times_round_trip_through_avro(i: int) -> None:
    assert through_fastavro(EVENT, event(i)) == event(i)


def test_a_member_is_written_as_its_own_branch_and_confluent_reads_the_plain_value(
        served: tuple[Store, str]) -> None:
    _, url = served
    schema = {"type": "record", "name": "Reading", "fields": [
        {"name": "value", "type": ["int", "long", "double", "float", "string", LINE]}]}
    client = SchemaRegistryClient({"url": url})
    serialize = serdes.serializer(serdes.AVRO, client, json.dumps(schema), serdes.WriteConf(auto_register=True))
    column, context = avro_column(schema), serdes.context("readings", False)
    read = AvroDeserializer(client)
    cases = [(1, 5, 5), (2, 0.1, 0.1), (4, "five", "five"), (5, {"sku": "k"}, {"sku": "k"})]
    for index, value, plain in cases:
        data = serialize(column.prepared({"value": members(6, index, value)}), context)
        assert data is not None and read(data, context) == {"value": plain}
        branch = fastavro.schemaless_reader(io.BytesIO(data[5:]), {"type": "long"}, None)
        assert branch == index  # the union's branch written is the member's: a small long stays a long


@pytest.mark.parametrize(("schema", "record"), [
    ({"type": "record", "name": "Node", "namespace": "graph", "fields": [
        {"name": "value", "type": "int"}, {"name": "children", "type": {"type": "array", "items": "Node"}}]},
     "graph.Node"),
    ({"type": "record", "name": "Expr", "fields": [
        {"name": "op", "type": ["null", "int", "string", "Expr"]}]}, "Expr"),
    ({"type": "record", "name": "A", "fields": [{"name": "b", "type": {"type": "record", "name": "B", "fields": [
        {"name": "back", "type": ["null", "A"]}]}}]}, "A"),
], ids=["array", "union-member", "through-another-record"])
def test_a_recursive_record_is_refused_naming_it_not_recursed_into(schema: Any, record: str) -> None:
    started = time.monotonic()
    with pytest.raises(KafkaException) as info:
        avro_column(schema)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert f"recursive type {record!r}" in str(info.value)
    assert time.monotonic() - started < 5


def test_decimals_and_local_timestamps_in_unions() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "v", "type": [
        "null", {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
        {"type": "long", "logicalType": "local-timestamp-millis"}, "string"]}]}
    assert avro_column(schema).type.simpleString() == (
        "struct<v:struct<member0:decimal(6,2),member1:timestamp_ntz,member2:string>>")
    for value in [members(3, 0, decimal.Decimal("12.34")), members(3, 1, datetime.datetime(2024, 3, 4, 5, 6, 7)),
                  members(3, 2, "x"), None]:
        assert through_fastavro(schema, {"v": value}) == {"v": value}
