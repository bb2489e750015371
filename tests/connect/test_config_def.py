"""Declared configs check values as Kafka Connect's ConfigDef does, with its messages, and report every problem."""

from __future__ import annotations

import pytest

from onceflow.connect.config_def import ConfigDef, Importance, Type, at_least, one_of
from onceflow.connect.properties import parse_properties
from onceflow.connector.errors import ErrorCode, KafkaException


def definition() -> ConfigDef:
    return (ConfigDef()
            .define("topic", Type.STRING, importance=Importance.HIGH, documentation="where to write")
            .define("batch.size", Type.INT, "2000", at_least(1))
            .define("mode", Type.STRING, "poll", one_of("poll", "interval"))
            .define("enabled", Type.BOOLEAN, "false")
            .define("topics", Type.LIST, ""))


def test_values_are_parsed_to_their_types_with_defaults() -> None:
    parsed = definition().parse({"topic": "t", "batch.size": "10", "enabled": "TRUE", "topics": "a, b"})
    assert parsed == {"topic": "t", "batch.size": 10, "mode": "poll", "enabled": True, "topics": ["a", "b"]}


@pytest.mark.parametrize(("props", "message"), [
    ({}, 'Missing required configuration "topic" which has no default value.'),
    ({"topic": "t", "batch.size": "x"}, "Invalid value x for configuration batch.size: Not a number of type INT"),
    ({"topic": "t", "batch.size": "0"}, "Invalid value 0 for configuration batch.size: Value must be at least 1"),
    ({"topic": "t", "batch.size": str(2**31)}, f"Invalid value {2**31} for configuration batch.size: Not a number "
                                                "of type INT"),
    ({"topic": "t", "mode": "never"}, "Invalid value never for configuration mode: String must be one of: poll, "
                                      "interval"),
    ({"topic": "t", "enabled": "yes"}, "Invalid value yes for configuration enabled: Expected value to be either "
                                       "true or false"),
])
def test_a_bad_value_is_invalid_config_naming_the_key_in_kafkas_words(props: dict[str, str], message: str) -> None:
    with pytest.raises(KafkaException) as caught:
        definition().parse(props)
    assert caught.value.code == ErrorCode.INVALID_CONFIG and caught.value.error.str() == message


def test_validation_reports_every_problem_and_the_rest_api_shape() -> None:
    values = definition().validate_all({"batch.size": "x", "mode": "never"})
    assert {name: len(v.errors) for name, v in values.items()} == {"topic": 1, "batch.size": 1, "mode": 1,
                                                                   "enabled": 0, "topics": 0}
    info = values["batch.size"].info(Type.INT)
    assert set(info) == {"name", "value", "recommended_values", "errors", "visible"}
    key = definition().config_keys()["batch.size"].info()
    assert set(key) == {"name", "type", "required", "default_value", "importance", "documentation", "group",
                        "order_in_group", "width", "display_name", "dependents"}
    assert (key["type"], key["default_value"], key["required"]) == ("INT", "2000", False)


def test_a_key_defined_twice_is_refused() -> None:
    with pytest.raises(KafkaException) as caught:
        definition().define("topic", Type.STRING)
    assert caught.value.code == ErrorCode.INVALID_CONFIG


def test_java_properties_files_parse_as_java_does() -> None:
    text = ("# a comment\n! another\nname=file-source\nfile : /tmp/in.txt\ntopic lines\nlong=a,\\\n   b\n"
            "esc=x\\=y\\u0041\n")
    assert parse_properties(text) == {"name": "file-source", "file": "/tmp/in.txt", "topic": "lines", "long": "a,b",
                                      "esc": "x=yA"}
