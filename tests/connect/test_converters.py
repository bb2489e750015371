"""Converters turn connector data into a stream's bytes and back, as Kafka Connect's built-in ones do."""

from __future__ import annotations

import json

import pytest

from onceflow.connect.converters import ByteArrayConverter, JsonConverter, StringConverter
from onceflow.connect.records import Field, Schema
from onceflow.connector.errors import ErrorCode, KafkaException

ORDER = Schema("struct", name="Order", fields=(Field("id", Schema("int64")), Field("note", Schema("string", True)),
                                                Field("blob", Schema("bytes", True))))


def json_converter(schemas: bool, is_key: bool = False) -> JsonConverter:
    converter = JsonConverter()
    converter.configure({"schemas.enable": str(schemas).lower()}, is_key)
    return converter


def test_json_with_schemas_writes_kafkas_envelope_and_reads_it_back() -> None:
    converter = json_converter(True)
    value = {"id": 7, "note": None, "blob": b"\x00\xff"}
    data = converter.from_connect_data("orders", ORDER, value)
    assert json.loads(data or b"") == {
        "schema": {"type": "struct", "optional": False, "name": "Order", "fields": [
            {"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "note"},
            {"type": "bytes", "optional": True, "field": "blob"}]},
        "payload": {"id": 7, "note": None, "blob": "AP8="}}
    schema, back = converter.to_connect_data("orders", data)
    assert back == value and schema is not None and schema.field("id") == Field("id", Schema("int64"))


def test_json_without_schemas_is_plain_json() -> None:
    converter = json_converter(False)
    assert converter.from_connect_data("t", None, {"a": [1, 2]}) == b'{"a":[1,2]}'
    assert converter.to_connect_data("t", b'{"a":[1,2]}') == (None, {"a": [1, 2]})
    assert converter.from_connect_data("t", None, None) is None


def test_plain_json_given_to_a_schema_converter_is_a_value_deserialization_error() -> None:
    with pytest.raises(KafkaException) as caught:
        json_converter(True).to_connect_data("t", b'{"a": 1}')
    assert caught.value.code == ErrorCode._VALUE_DESERIALIZATION and "schemas.enable=false" in str(caught.value)
    with pytest.raises(KafkaException) as key_error:
        json_converter(False, is_key=True).to_connect_data("t", b"{not json")
    assert key_error.value.code == ErrorCode._KEY_DESERIALIZATION


def test_a_null_for_a_required_schema_cannot_be_written() -> None:
    with pytest.raises(KafkaException) as caught:
        json_converter(True).from_connect_data("t", Schema("int32"), None)
    assert caught.value.code == ErrorCode._VALUE_SERIALIZATION


def test_string_and_byte_array_converters() -> None:
    strings = StringConverter()
    strings.configure({}, False)
    assert strings.from_connect_data("t", None, 42) == b"42"
    assert strings.to_connect_data("t", "é".encode())[1] == "é"
    latin = StringConverter()
    latin.configure({"converter.encoding": "ISO-8859-1"}, False)
    assert latin.from_connect_data("t", None, "é") == b"\xe9"
    raw = ByteArrayConverter()
    raw.configure({}, True)
    assert raw.from_connect_data("t", None, b"\x00") == b"\x00" and raw.to_connect_data("t", b"x")[1] == b"x"
    with pytest.raises(KafkaException) as caught:
        raw.from_connect_data("t", None, "text")
    assert caught.value.code == ErrorCode._KEY_SERIALIZATION


def test_an_unknown_encoding_is_invalid_config() -> None:
    with pytest.raises(KafkaException) as caught:
        StringConverter().configure({"converter.encoding": "klingon"}, False)
    assert caught.value.code == ErrorCode.INVALID_CONFIG
