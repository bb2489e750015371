"""Protobuf schemas: checked by building them into a descriptor pool, and their evolutions compared field by field.

A Protobuf schema is kept in the form confluent-kafka's clients send and ask for (``format=serialized``): a
base64 ``FileDescriptorProto``, as the descriptor pool builds it (type names resolved); one given as .proto text
is read first (:mod:`proto_text`). Its imports are its references (other subjects' schemas) or Protobuf's
well-known types. Between two versions, each message of the writer's is looked up by full name in the reader's,
and each field by number: a message dropped, a field renumbered (same name, new number) or retyped beyond what
the wire format reads alike, or a change between singular and repeated, is named. A field dropped without its
number or name reserved is named too, whichever the direction (stricter than Confluent's checker): its number
could later come back with another meaning, and data written before would be misread.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator, Mapping

from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.message import DecodeError

from onceflow.schemas.registry import proto_text
from onceflow.schemas.registry.errors import RegistryError

FileProto = descriptor_pb2.FileDescriptorProto
Field = descriptor_pb2.FieldDescriptorProto
_WELL_KNOWN = {m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb for m in (
    any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)}
# Field types one wire encoding carries alike: a reader of any type of a group reads what a writer of another wrote.
_ALIKE = [{Field.TYPE_INT32, Field.TYPE_INT64, Field.TYPE_UINT32, Field.TYPE_UINT64, Field.TYPE_BOOL},
          {Field.TYPE_SINT32, Field.TYPE_SINT64}, {Field.TYPE_FIXED32, Field.TYPE_SFIXED32},
          {Field.TYPE_FIXED64, Field.TYPE_SFIXED64}, {Field.TYPE_STRING, Field.TYPE_BYTES}]


def parse(text: str) -> FileProto:
    """The file descriptor that ``text`` holds (base64, as confluent-kafka's clients send it) or declares (.proto
    text); 42201 if neither."""
    try:
        proto = FileProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        proto = proto_text.parse(text)
    except DecodeError as exc:
        raise RegistryError(42201, f"Invalid schema: not a FileDescriptorProto ({exc})") from exc
    if not proto.message_type and not proto.enum_type:
        raise RegistryError(42201, "Invalid schema: the file descriptor declares no message and no enum")
    return proto


def canonical(text: str, imports: Mapping[str, str]) -> str:
    """``text`` in its stored form, once it builds with ``imports`` (file name -> base64 descriptor, the
    references' schemas); 42201 if it does not (an unknown import, an undefined type)."""
    proto, pool = built_pool(text, imports)
    built = FileProto()
    pool.FindFileByName(proto.name).CopyToProto(built)  # type names resolved, as protoc writes them
    return base64.b64encode(built.SerializeToString(deterministic=True)).decode()


def built_pool(text: str, imports: Mapping[str, str]) -> tuple[FileProto, descriptor_pool.DescriptorPool]:
    """``text``'s file descriptor and a pool it is built in with ``imports`` (file name -> base64 descriptor) and
    the well-known types; 42201 if it does not build."""
    proto = parse(text)
    pool = descriptor_pool.DescriptorPool()
    sources = {**_WELL_KNOWN, **{n: base64.b64decode(t) for n, t in imports.items()}}
    try:
        _add(pool, proto, sources, set())
    except (TypeError, KeyError, DecodeError) as exc:
        raise RegistryError(42201, f"Invalid schema: {exc}") from exc
    return proto, pool


def _add(pool: descriptor_pool.DescriptorPool, proto: FileProto, sources: Mapping[str, bytes], done: set[str]) -> None:
    """Build ``proto`` into ``pool`` after the files it imports."""
    for name in proto.dependency:
        if name not in done:
            if name not in sources:
                raise KeyError(f"the import {name!r} is neither a reference nor a well-known type")
            done.add(name)
            imported = FileProto.FromString(sources[name])
            imported.name = name  # the name it is imported by, whatever it was registered as
            _add(pool, imported, sources, done)
    pool.Add(proto)


def removed(new: str, old: str) -> list[str]:
    """The fields of ``old`` that ``new`` drops without reserving their number or name."""
    kept = dict(_messages(parse(new).message_type, parse(new).package))
    return [f"{name}.{field.name}: field {field.number} was removed without reserving its number or name"
            for name, message in _messages(parse(old).message_type, parse(old).package) if name in kept
            for field in message.field if field.number not in {f.number for f in kept[name].field}
            and field.name not in kept[name].reserved_name and not _reserved(kept[name], field.number)]


def problems(reader: str, writer: str) -> list[str]:
    """Why data written with Protobuf schema ``writer`` would not be read alike with ``reader``; [] if it would."""
    read_file, written_file = parse(reader), parse(writer)
    read = dict(_messages(read_file.message_type, read_file.package))
    found = []
    for name, message in _messages(written_file.message_type, written_file.package):
        if name not in read:
            found.append(f"{name}: the message is not in the reader's schema")
        else:
            found += _fields(name, read[name], message)
    return found


def _messages(messages: Iterable[descriptor_pb2.DescriptorProto], prefix: str
              ) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """Every message, nested ones too, by full name."""
    for message in messages:
        name = f"{prefix}.{message.name}" if prefix else message.name
        yield name, message
        yield from _messages(message.nested_type, name)


def _fields(name: str, reader: descriptor_pb2.DescriptorProto, writer: descriptor_pb2.DescriptorProto) -> list[str]:
    by_number = {f.number: f for f in reader.field}
    by_name = {f.name: f for f in reader.field}
    found = []
    for field in writer.field:
        path = f"{name}.{field.name}"
        read = by_number.get(field.number)
        if field.name in by_name and by_name[field.name].number != field.number:
            found.append(f"{path}: renumbered from {field.number} to {by_name[field.name].number}")
        elif read is not None:
            found += _retyped(path, read, field)
    return found


def _reserved(message: descriptor_pb2.DescriptorProto, number: int) -> bool:
    return any(r.start <= number < r.end for r in message.reserved_range)


def _retyped(path: str, reader: Field, writer: Field) -> list[str]:
    if (reader.label == Field.LABEL_REPEATED) != (writer.label == Field.LABEL_REPEATED):
        return [f"{path}: changed between singular and repeated"]
    same = reader.type == writer.type or any({reader.type, writer.type} <= group for group in _ALIKE)
    if not same or reader.type_name.lstrip(".") != writer.type_name.lstrip("."):
        return [f"{path}: retyped from {_type(writer)} to {_type(reader)}"]
    return []


def _type(field: Field) -> str:
    return field.type_name.lstrip(".") or Field.Type.Name(field.type).removeprefix("TYPE_").lower()
