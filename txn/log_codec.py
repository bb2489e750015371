"""The stored form of commit-log entries (PIP-160): batched entries framed by magic and version, and the
unbatched entries written while batching is off, which stay readable either way.

A batched entry is ``magic u16 = 0x0e01 | version u16 = 1 | BatchedTransactionMetadataEntry`` (big-endian, as
PIP-160). An unbatched entry is one serialized ``TransactionMetadataEntry``; it starts with byte 0x08, which no
magic can. Anything else is refused with a typed error: CORRUPT_MESSAGE for damaged bytes or an unknown magic,
UNSUPPORTED_VERSION for a batched entry of a version this code does not know.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from onceflow.connector.errors import ErrorCode, fail
from onceflow.schemas.txn_log_pb2 import BatchedTransactionMetadataEntry, TransactionMetadataEntry

MAGIC = 0x0E01
VERSION = 1
_FRAME = struct.Struct(">HH")
_UNBATCHED_FIRST_BYTE = 0x08  # field 1 (kind), varint: how every serialized TransactionMetadataEntry starts
_KINDS = (TransactionMetadataEntry.BEGIN, TransactionMetadataEntry.COMMIT, TransactionMetadataEntry.ABORT)


def encode_batched(records: Sequence[TransactionMetadataEntry]) -> bytes:
    body = BatchedTransactionMetadataEntry(transaction_log=records, record_count=len(records))
    return _FRAME.pack(MAGIC, VERSION) + body.SerializeToString()


def encode_unbatched(record: TransactionMetadataEntry) -> bytes:
    return record.SerializeToString()


def decode(entry: bytes, where: str) -> list[TransactionMetadataEntry]:
    """The control records of one stored entry, in order; typed errors for anything else."""
    if len(entry) >= _FRAME.size and _FRAME.unpack_from(entry)[0] == MAGIC:
        version = _FRAME.unpack_from(entry)[1]
        if version != VERSION:
            fail(ErrorCode.UNSUPPORTED_VERSION, f"{where}: batched entry version {version}, this onceflow reads "
                 f"version {VERSION}")
        batch = BatchedTransactionMetadataEntry()
        _parse(batch, entry[_FRAME.size:], where)
        records = list(batch.transaction_log)
        if batch.record_count != len(records) or not records:
            fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: batched entry holds {len(records)} records, its header says "
                 f"{batch.record_count}")
    elif entry[:1] == bytes([_UNBATCHED_FIRST_BYTE]):
        record = TransactionMetadataEntry()
        _parse(record, entry, where)
        records = [record]
    else:
        magic = entry[:2].hex() or "(empty)"
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: unknown entry magic 0x{magic} (batched entries start with "
             f"0x{MAGIC:04x}, unbatched ones with 0x{_UNBATCHED_FIRST_BYTE:02x})")
    for i, record in enumerate(records):
        _check(record, f"{where} record {i}")
    return records


def _parse(message: TransactionMetadataEntry | BatchedTransactionMetadataEntry, data: bytes, where: str) -> None:
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: damaged entry ({exc})")


def _check(record: TransactionMetadataEntry, where: str) -> None:
    if record.kind not in _KINDS:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: unknown control record kind {record.kind}")
    if (record.kind == TransactionMetadataEntry.BEGIN) == bool(record.txn_id):
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: a BEGIN carries no txn id and a COMMIT or ABORT carries one")
    if record.kind == TransactionMetadataEntry.BEGIN and record.timeout_ms <= 0:
        fail(ErrorCode.CORRUPT_MESSAGE, f"{where}: BEGIN with timeout {record.timeout_ms} ms")
