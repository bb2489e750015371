from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Participant(_message.Message):
    __slots__ = ("writer_id", "staging_partition", "first_offset", "last_offset", "first_sequence", "last_sequence", "txn_id")
    WRITER_ID_FIELD_NUMBER: _ClassVar[int]
    STAGING_PARTITION_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    writer_id: str
    staging_partition: int
    first_offset: int
    last_offset: int
    first_sequence: int
    last_sequence: int
    txn_id: str
    def __init__(self, writer_id: _Optional[str] = ..., staging_partition: _Optional[int] = ..., first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., first_sequence: _Optional[int] = ..., last_sequence: _Optional[int] = ..., txn_id: _Optional[str] = ...) -> None: ...

class PartitionOffset(_message.Message):
    __slots__ = ("stream", "partition", "offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    offset: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class GroupOffsets(_message.Message):
    __slots__ = ("group", "offsets")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group: str
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, group: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...

class InlineBatch(_message.Message):
    __slots__ = ("stream", "partition", "records")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    records: bytes
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class TransactionMetadataEntry(_message.Message):
    __slots__ = ("kind", "txn_id", "timestamp_ms", "timeout_ms", "owner", "owner_epoch", "participants", "offsets", "reason", "inline")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[TransactionMetadataEntry.Kind]
        BEGIN: _ClassVar[TransactionMetadataEntry.Kind]
        COMMIT: _ClassVar[TransactionMetadataEntry.Kind]
        ABORT: _ClassVar[TransactionMetadataEntry.Kind]
    KIND_UNSPECIFIED: TransactionMetadataEntry.Kind
    BEGIN: TransactionMetadataEntry.Kind
    COMMIT: TransactionMetadataEntry.Kind
    ABORT: TransactionMetadataEntry.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    OWNER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    kind: TransactionMetadataEntry.Kind
    txn_id: str
    timestamp_ms: int
    timeout_ms: int
    owner: str
    owner_epoch: int
    participants: _containers.RepeatedCompositeFieldContainer[Participant]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupOffsets]
    reason: str
    inline: _containers.RepeatedCompositeFieldContainer[InlineBatch]
    def __init__(self, kind: _Optional[_Union[TransactionMetadataEntry.Kind, str]] = ..., txn_id: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., owner: _Optional[str] = ..., owner_epoch: _Optional[int] = ..., participants: _Optional[_Iterable[_Union[Participant, _Mapping]]] = ..., offsets: _Optional[_Iterable[_Union[GroupOffsets, _Mapping]]] = ..., reason: _Optional[str] = ..., inline: _Optional[_Iterable[_Union[InlineBatch, _Mapping]]] = ...) -> None: ...

class BatchedTransactionMetadataEntry(_message.Message):
    __slots__ = ("transaction_log", "record_count")
    TRANSACTION_LOG_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    transaction_log: _containers.RepeatedCompositeFieldContainer[TransactionMetadataEntry]
    record_count: int
    def __init__(self, transaction_log: _Optional[_Iterable[_Union[TransactionMetadataEntry, _Mapping]]] = ..., record_count: _Optional[int] = ...) -> None: ...
