"""Every decoder of stored or received bytes, fuzzed: valid encodings damaged in every way hypothesis finds
(flips, cuts, insertions, splices) and arbitrary bytes. Only onceflow's typed errors may come out — never
another exception, a hang or a crash (the per-test timeout catches a hang)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.connector import ErrorCode, KafkaException
from onceflow.connector.store import Record, open_store
from onceflow.connector.store.batch_codec import decode as decode_batch
from onceflow.connector.store.batch_codec import encode as encode_batch
from onceflow.schemas.txn_log_pb2 import Participant, TransactionMetadataEntry
from onceflow.spark_sinks.formats import ValueFormat
from onceflow.txn import log_codec
from onceflow.txn.commit_log import CommitLog, Outcome

Kind = TransactionMetadataEntry
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def damaged(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding, then a few random edits to it."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["flip", "cut", "insert", "splice", "truncate"]))
        at = draw(st.integers(0, len(data)))
        if edit == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif edit == "cut":
            del data[at:at + draw(st.integers(1, 8))]
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif edit == "splice":
            data[at:at + 8] = draw(st.sampled_from([b"\xff" * 8, b"\x80" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff"]))
        else:
            del data[at:]
    return bytes(data)


def only_typed_errors(decode: Callable[[bytes], Any], data: bytes, *codes: ErrorCode) -> None:
    try:
        decode(data)
    except KafkaException as exc:
        assert exc.code in codes, exc


# -- stored batches ---------------------------------------------------------------------------------------

maybe_bytes = st.one_of(st.none(), st.binary(max_size=40))
valid_batches = st.lists(
    st.builds(Record, maybe_bytes, maybe_bytes,
              st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=6), maybe_bytes), min_size=1, max_size=2)),
              st.integers(-1, 2**62)),
    min_size=1, max_size=8).map(lambda records: encode_batch(records, 1 << 20, "fuzz"))


@FUZZ
@given(st.one_of(damaged(valid_batches), st.binary(max_size=300)))
def test_stored_batches(data: bytes) -> None:
    only_typed_errors(lambda b: decode_batch(b, "t", 0, 0), data, ErrorCode.CORRUPT_MESSAGE)


# -- batched transaction-log entries and their control records -------------------------------------------

txn_ids = st.builds(lambda entry, index: f"{entry}.{index}", st.integers(0, 12), st.integers(0, 3))
control_records = st.one_of(
    st.builds(lambda ts, timeout: Kind(kind=Kind.BEGIN, timestamp_ms=ts, timeout_ms=timeout),
              st.integers(0, 2**40), st.integers(1, 2**31)),
    st.builds(lambda txn_id, joined: Kind(kind=Kind.COMMIT, txn_id=txn_id, participants=[
        Participant(writer_id="w", first_offset=0, last_offset=1, last_sequence=1, txn_id=j) for j in joined]),
        txn_ids, st.lists(txn_ids, max_size=2)),
    st.builds(lambda txn_id: Kind(kind=Kind.ABORT, txn_id=txn_id, reason="requested"), txn_ids),
)
valid_entries = st.one_of(
    st.lists(control_records, min_size=1, max_size=6).map(log_codec.encode_batched),
    control_records.map(log_codec.encode_unbatched),
)


@FUZZ
@given(st.one_of(damaged(valid_entries), st.binary(max_size=300)))
def test_transaction_log_entries(data: bytes) -> None:
    only_typed_errors(lambda b: log_codec.decode(b, "fuzz"), data, ErrorCode.CORRUPT_MESSAGE,
                      ErrorCode.UNSUPPORTED_VERSION)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(control_records, min_size=1, max_size=4), min_size=1, max_size=12))
def test_control_records_in_any_order_decide_each_transaction_once(tmp_path: Path,
                                                                   entries: list[list[Kind]]) -> None:
    """COMMITs and ABORTs of unknown, finished or joined transactions, in any order: the commit log folds them
    without error, and a transaction's outcome is the first terminal record that could decide it."""
    store = open_store(f"sqlite://{tmp_path / f'log{abs(hash(repr(entries)))}.db'}")
    try:
        store.create_stream("log", 1)
        writer = store.open_writer()
        for records in entries:
            writer.append("log", 0, [Record(None, log_codec.encode_batched(records))])
        view = CommitLog(store, "log")
        view.catch_up()
        begun = {f"{offset}.{i}" for offset, records in enumerate(entries)
                 for i, r in enumerate(records) if r.kind == Kind.BEGIN}
        for txn_id in begun:
            logged = view.get(txn_id)
            assert logged is not None
            if not any(r.kind != Kind.BEGIN and txn_id in {r.txn_id, *(p.txn_id for p in r.participants)}
                       for records in entries for r in records):
                assert logged.outcome is Outcome.OPEN, "nothing named it"
    finally:
        store.close()


# -- value formats the Spark source decodes ------------------------------------------------------------------

AVRO_SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "extra", "type": ["null", {"type": "map", "values": "bytes"}]},
    {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
    {"name": "code", "type": {"type": "fixed", "name": "F", "size": 4}}]})
avro = ValueFormat("avro", AVRO_SCHEMA)
valid_orders = st.fixed_dictionaries({
    "id": st.integers(-2**63, 2**63 - 1), "customer": st.text(max_size=10), "amount": st.floats(),
    "tags": st.lists(st.text(max_size=5), max_size=3),
    "extra": st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.binary(max_size=4), max_size=2)),
    "kind": st.sampled_from(["A", "B"]), "code": st.binary(min_size=4, max_size=4),
}).map(lambda order: avro.encode(order) or b"")


@FUZZ
@given(st.one_of(damaged(valid_orders), st.binary(max_size=200)))
def test_avro_envelopes(data: bytes) -> None:
    only_typed_errors(avro.decode, data, ErrorCode.CORRUPT_MESSAGE)


@FUZZ
@given(st.one_of(damaged(st.recursive(st.none() | st.integers() | st.text(max_size=5),
                                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                                          st.text(max_size=3), inner, max_size=3)).map(
                                              lambda v: json.dumps(v).encode())),
                 st.binary(max_size=100), st.integers(1, 50_000).map(lambda n: b"[" * n)))
def test_json_and_string_values(data: bytes) -> None:
    for name in ("json", "string"):
        only_typed_errors(ValueFormat(name).decode, data, ErrorCode.CORRUPT_MESSAGE)


def test_avro_schemas_whose_arrays_cannot_be_bounded_are_refused() -> None:
    """Found by this fuzzing: an array of null items is a few bytes for a billion items."""
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        ValueFormat("avro", json.dumps({"type": "array", "items": "null"})).decode(b"\x80\x80\x80\x80\x10\x00")
