"""The Spark sink without Spark: the key formats bytes (the default) and string, written and read back, and the
rows the registry formats' Arrow writers make of Spark's Arrow batches."""

from __future__ import annotations

import dataclasses
import pickle

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql import Row

from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.message import Message
from onceflow.connector.store import Record
from onceflow.spark_sinks.datasource import _rows
from onceflow.spark_sinks.options import parse
from onceflow.spark_sinks.rows import RowMapping


def test_keys_are_bytes_by_default_and_text_with_key_format_string() -> None:
    where = Message("t", 0, 0, None, None, None)
    default = parse({"topic": "t"}).key_format
    assert [default.to_bytes(k, "t") for k in (b"k", bytearray(b"k"), "k", 7, None)] == [b"k", b"k", b"k", b"7", None]
    assert default.to_column(b"k", where) == b"k" and default.column_type().simpleString() == "binary"
    text = parse({"topic": "t", "key.format": "string"}).key_format
    assert text.to_bytes("k\u00e9", "t") == "k\u00e9".encode()
    assert text.to_column("k\u00e9".encode(), where) == "k\u00e9" and text.column_type().simpleString() == "string"


def test_arrow_batches_become_plain_rows_structs_and_maps_as_dicts_null_structs_as_none() -> None:
    values = [{"id": 1, "line": {"sku": "a", "qty": 2}, "tags": ["x"], "counts": [("n", 1)]}, None,
              {"id": 3, "line": None, "tags": [], "counts": []}]
    kind = pa.struct([("id", pa.int64()), ("line", pa.struct([("sku", pa.string()), ("qty", pa.int32())])),
                      ("tags", pa.list_(pa.string())), ("counts", pa.map_(pa.string(), pa.int64()))])
    batch = pa.RecordBatch.from_arrays([pa.array([b"k1", None, b"k3"]), pa.array(values, kind)], ["key", "value"])
    assert list(_rows(iter([batch, batch.slice(2)]))) == [
        {"key": b"k1", "value": {"id": 1, "line": {"sku": "a", "qty": 2}, "tags": ["x"], "counts": {"n": 1}}},
        {"key": None, "value": None},
        {"key": b"k3", "value": {"id": 3, "line": None, "tags": [], "counts": {}}},
        {"key": b"k3", "value": {"id": 3, "line": None, "tags": [], "counts": {}}}]


def test_binary_rows_become_the_same_records_on_the_short_path_as_on_the_general_one() -> None:
    """Binary key and value columns (the usual sink) skip the formats' conversions; anything else, or any value
    the short path does not take as it is, goes the general way, with its errors."""
    options = parse({"store.url": "sqlite:///unused.db", "topic": "out"})
    short = RowMapping.of(options, ["key", "value"])
    general = dataclasses.replace(short, binary=False)
    assert short.binary
    rows = [Row(key=b"k", value=b"v"), Row(key=None, value=b"v"), Row(key=b"k", value=None),
            Row(key=bytearray(b"k"), value=bytearray(b"v")), Row(key="text", value=b"v"), {"key": b"k", "value": b"v"}]
    assert [short.record(r) for r in rows] == [general.record(r) for r in rows]
    with pytest.raises(KafkaException) as info:
        short.record(Row(key=b"k", value="not bytes"))
    assert info.value.code == ErrorCode.INVALID_RECORD
    assert not RowMapping.of(options, ["key", "value", "partition"]).binary  # a partition column: the general way
    assert pickle.loads(pickle.dumps(short)) == short  # (shipped to Spark's executors)
    for option in ({"value.format": "string"}, {"key.format": "string"}):
        assert not RowMapping.of(parse({"store.url": "sqlite:///unused.db", "topic": "out", **option}),
                                 ["key", "value"]).binary
    assert not RowMapping.of(options, ["key", "value", "headers"]).binary


def test_a_row_of_the_written_columns_is_read_by_position_and_any_other_by_name() -> None:
    options = parse({"store.url": "sqlite:///unused.db", "topic": "out"})
    mapping = RowMapping.of(options, ["id", "value", "key"])
    general = dataclasses.replace(mapping, binary=False)
    schema_rows = Row("id", "value", "key")
    rows = [schema_rows(1, b"v", b"k"), schema_rows(2, None, None), Row(key=b"k", value=b"v", id=3),  # another order
            Row(id=4, value=b"v"), (5, b"v", b"k")]  # a missing key column, and a plain tuple: by name, as before
    assert [mapping.record(r) for r in rows[:3]] == [general.record(r) for r in rows[:3]] == [
        (Record(b"k", b"v"), -1), (Record(None, None), -1), (Record(b"k", b"v"), -1)]
    for row in rows[3:]:
        with pytest.raises((ValueError, TypeError, KeyError)):  # what Spark's Row and a tuple raise, as before
            mapping.record(row)
