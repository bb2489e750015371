"""Kafka Connect's single message transforms and predicates, alone and chained in a running connector."""

from __future__ import annotations

import json

import pytest

from onceflow.connect.app import ConnectWorker
from onceflow.connect.records import Field, Schema, SinkRecord, SourceRecord
from onceflow.connect.smt import (
    CastKey,
    CastValue,
    InsertFieldValue,
    RecordIsTombstone,
    RegexRouter,
    ReplaceFieldValue,
    TimestampRouter,
    TopicNameMatches,
)
from onceflow.connect.transform import Predicate, Transformation
from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import read_stream
from tests.connect.conftest import client, wait_until
from tests.connect.sample_plugins import COUNTING, PLUGINS

ROW = Schema("struct", fields=(Field("id", Schema("int64")), Field("price", Schema("string")),
                               Field("secret", Schema("string", True))))


def configured(cls: type[Transformation] | type[Predicate], **props: str) -> Transformation | Predicate:
    plugin = cls()
    plugin.configure({k.replace("_", "."): v for k, v in props.items()})
    return plugin


def sink_record(value: object, schema: Schema | None = None, key: object = None, topic: str = "orders") -> SinkRecord:
    return SinkRecord(topic=topic, kafka_partition=2, kafka_offset=41, key=key, value=value, value_schema=schema,
                      timestamp=1_700_000_000_123)


def test_insert_field_adds_position_and_static_fields_to_a_struct_and_its_schema() -> None:
    insert = configured(InsertFieldValue, topic_field="t", offset_field="o!", static_field="from", static_value="x")
    out = insert.apply(sink_record({"id": 1, "price": "2.50", "secret": None}, ROW))  # type: ignore[union-attr]
    assert out.value == {"id": 1, "price": "2.50", "secret": None, "t": "orders", "o": 41, "from": "x"}
    assert out.value_schema.fields[-3:] == (Field("t", Schema("string", True)), Field("o", Schema("int64")),
                                            Field("from", Schema("string", True)))


def test_replace_field_and_cast_reshape_a_struct() -> None:
    replace = configured(ReplaceFieldValue, exclude="secret", renames="price:cost")
    cast = configured(CastValue, spec="cost:float64,id:string")
    out = cast.apply(replace.apply(sink_record({"id": 7, "price": "2.50", "secret": "s"}, ROW)))  # type: ignore
    assert out.value == {"id": "7", "cost": 2.5}
    assert [(f.name, f.schema.type) for f in out.value_schema.fields] == [("id", "string"), ("cost", "float64")]
    assert configured(CastKey, spec="int64").apply(sink_record(None, key="12")).key == 12  # type: ignore


def test_routers_rename_topics() -> None:
    by_time = configured(TimestampRouter, topic_format="${topic}_${timestamp}", timestamp_format="yyyy-MM-dd.SSS")
    assert by_time.apply(sink_record("v")).topic == "orders_2023-11-14.123"  # type: ignore[union-attr]
    regex = configured(RegexRouter, regex="(.*)ers", replacement="$1-renamed")
    assert regex.apply(sink_record("v")).topic == "ord-renamed"  # type: ignore[union-attr]
    assert regex.apply(sink_record("v", topic="other")).topic == "other"  # type: ignore[union-attr]


def test_predicates() -> None:
    assert configured(TopicNameMatches, pattern="ord.*").test(sink_record("v"))  # type: ignore[union-attr]
    assert not configured(TopicNameMatches, pattern="ord").test(sink_record("v"))  # type: ignore[union-attr]
    assert configured(RecordIsTombstone).test(sink_record(None))  # type: ignore[union-attr]


@pytest.mark.parametrize(("cls", "props", "needle"), [
    (CastValue, {"spec": "id:decimal"}, "Cast transformations only support"),
    (ReplaceFieldValue, {"renames": "a"}, "Invalid rename mapping: a"),
    (RegexRouter, {"regex": "(", "replacement": "x"}, "not a valid regular expression"),
])
def test_a_bad_transform_config_is_invalid_config(cls: type[Transformation], props: dict[str, str],
                                                  needle: str) -> None:
    with pytest.raises(KafkaException) as caught:
        cls().configure(props)
    assert caught.value.code == ErrorCode.INVALID_CONFIG and needle in str(caught.value)


def test_a_field_transform_given_a_string_fails_the_record() -> None:
    with pytest.raises(KafkaException) as caught:
        configured(InsertFieldValue, topic_field="t").apply(SourceRecord(topic="t", value="text"))  # type: ignore
    assert caught.value.code == ErrorCode.INVALID_RECORD


def test_a_chain_with_a_predicate_transforms_a_running_connectors_records(worker_props: dict[str, str]) -> None:
    chain = {
        "transforms": "insert,rename,cast,route,skip",
        "transforms.insert.type": "InsertField$Value", "transforms.insert.topic.field": "origin",
        "transforms.rename.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
        "transforms.rename.exclude": "note", "transforms.rename.renames": "n:number",
        "transforms.cast.type": "Cast$Value", "transforms.cast.spec": "number:string",
        "transforms.route.type": "RegexRouter", "transforms.route.regex": "(.*)-raw",
        "transforms.route.replacement": "$1-clean",
        "transforms.skip.type": "Filter", "transforms.skip.predicate": "marked",
        "predicates": "marked", "predicates.marked.type": "HasHeaderKey", "predicates.marked.name": "skip",
    }
    with ConnectWorker({**worker_props, "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                        "value.converter.schemas.enable": "false"}, PLUGINS) as worker:
        worker.add_connector({"name": "count", "connector.class": COUNTING, "topic": "numbers-raw", "count": "30",
                              "struct": "true", "skip.every": "3", **chain})
        rest = client(worker)
        wait_until(lambda: rest.request("GET", "/connectors/count/offsets")[1]["offsets"] != [] and
                   rest.request("GET", "/connectors/count/offsets")[1]["offsets"][0]["offset"] == {"next": 30},
                   "every record committed")
        got = [json.loads(m.value() or b"") for m in read_stream(worker.store, "numbers-clean")]
        assert "numbers-raw" not in worker.store.list_streams()
    assert got == [{"number": str(n), "origin": "numbers-raw"} for n in range(30) if n % 3]


def test_transform_configs_are_validated_naming_the_key(worker_props: dict[str, str]) -> None:
    with ConnectWorker(worker_props, PLUGINS) as worker:
        status, error = client(worker).request("POST", "/connectors", {"name": "x", "config": {
            "connector.class": COUNTING, "topic": "t", "transforms": "a,b", "transforms.b.type": "com.example.Nope",
            "transforms.a.type": "Cast$Value", "transforms.a.spec": "id:decimal"}})
    assert status == 400
    assert "Invalid value com.example.Nope for configuration transforms.b.type" in error["message"]
    assert "Invalid value id:decimal for configuration transforms.a.spec: Cast transformations" in error["message"]
