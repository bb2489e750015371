"""The Spark sink's key formats without Spark: bytes (the default) and string, written and read back."""

from __future__ import annotations

from onceflow.connector.message import Message
from onceflow.spark_sinks.options import parse


def test_keys_are_bytes_by_default_and_text_with_key_format_string() -> None:
    where = Message("t", 0, 0, None, None, None)
    default = parse({"topic": "t"}).key_format
    assert [default.to_bytes(k, "t") for k in (b"k", bytearray(b"k"), "k", 7, None)] == [b"k", b"k", b"k", b"7", None]
    assert default.to_column(b"k", where) == b"k" and default.column_type().simpleString() == "binary"
    text = parse({"topic": "t", "key.format": "string"}).key_format
    assert text.to_bytes("k\u00e9", "t") == "k\u00e9".encode()
    assert text.to_column("k\u00e9".encode(), where) == "k\u00e9" and text.column_type().simpleString() == "string"
