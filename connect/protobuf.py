"""``ProtobufConverter``: Confluent's Protobuf converter (``io.confluent.connect.protobuf.ProtobufConverter``).

Bytes are Confluent's wire format (a zero byte, the schema's 4-byte id, the message indexes, then the Protobuf
binary), written and read by confluent-kafka's ``ProtobufSerializer`` and ``ProtobufDeserializer`` through
:class:`~onceflow.connect.converters.RegistryConverter` (``schema.registry.url``, ``auto.register.schemas``,
``use.latest.version``, the subject name strategies). Reading takes the writer's schema by the record's id and
its message by the record's indexes, so records any Protobuf producer wrote are read, not only this converter's.

Schemas map as Confluent's converter maps them: a struct is a proto3 message (named by the schema's name, default
``ConnectDefault1``; a dotted name's prefix is the package), its fields numbered 1, 2, ... in order; int8/int16/
int32 <-> int32, int64 <-> int64, float32 <-> float, float64 <-> double, boolean <-> bool, string, bytes, array <->
repeated, map <-> map (integral or string keys), a nested struct <-> a nested message named after its field. An
optional primitive is a proto3 ``optional`` field, so a null reads back as null (Confluent's
``optional.for.nullables``). Reading, sint/sfixed types are int32/int64, uint32/fixed32 and uint64/fixed64 are
int64, an enum is its value's name, and a message field (which has presence) is an optional struct.

A record is a message, so a value that is not a struct is written, as Confluent's converter writes it, in the
well-known wrapper of its type (``google/protobuf/wrappers.proto``, registered as it is): int8/int16/int32 in
``google.protobuf.Int32Value``, int64 ``Int64Value``, float32 ``FloatValue``, float64 ``DoubleValue``, boolean
``BoolValue``, string ``StringValue``, bytes ``BytesValue``; and a record holding a wrapper alone is read as the
value it wraps (Confluent's ``wrapper.for.raw.primitives``, on by default: ``UInt32Value``/``UInt64Value`` as
int64). An array or a map has no wrapper: "Unsupported root schema", as Confluent says.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any

from confluent_kafka.serialization import SerializationContext
from google.protobuf import descriptor, descriptor_pb2, wrappers_pb2
from google.protobuf.message import Message as ProtoMessage

from onceflow.connect.converters import RegistryConverter, SchemaAndValue
from onceflow.connect.records import Field, Schema
from onceflow.schemas import serdes

_FD = descriptor.FieldDescriptor
_Proto = descriptor_pb2.FieldDescriptorProto
_TO_PROTO = {"int8": _Proto.TYPE_INT32, "int16": _Proto.TYPE_INT32, "int32": _Proto.TYPE_INT32,
             "int64": _Proto.TYPE_INT64, "float32": _Proto.TYPE_FLOAT, "float64": _Proto.TYPE_DOUBLE,
             "boolean": _Proto.TYPE_BOOL, "string": _Proto.TYPE_STRING, "bytes": _Proto.TYPE_BYTES}
_FROM_PROTO = {
    **dict.fromkeys((_FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32), "int32"),
    **dict.fromkeys((_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64, _FD.TYPE_UINT32, _FD.TYPE_FIXED32,
                     _FD.TYPE_UINT64, _FD.TYPE_FIXED64), "int64"),
    _FD.TYPE_FLOAT: "float32", _FD.TYPE_DOUBLE: "float64", _FD.TYPE_BOOL: "boolean", _FD.TYPE_STRING: "string",
    _FD.TYPE_BYTES: "bytes", _FD.TYPE_ENUM: "string",
}
_MAP_KEYS = ("int8", "int16", "int32", "int64", "boolean", "string")
# protobuf's stubs type a descriptor as the Python or the upb class, and a message type as optional: these
# functions take either (a map entry and a message field always have their message type)
Descriptor = Any
FieldDescriptor = Any


_WRAPPERS: dict[str, type[ProtoMessage]] = {
    **dict.fromkeys(("int8", "int16", "int32"), wrappers_pb2.Int32Value), "int64": wrappers_pb2.Int64Value,
    "float32": wrappers_pb2.FloatValue, "float64": wrappers_pb2.DoubleValue, "boolean": wrappers_pb2.BoolValue,
    "string": wrappers_pb2.StringValue, "bytes": wrappers_pb2.BytesValue}
_WRAPPED = {cls.DESCRIPTOR.full_name: cls for cls in _WRAPPERS.values()}
_UNWRAPPED = {**{cls.DESCRIPTOR.full_name: kind for kind, cls in _WRAPPERS.items()},  # Int32Value: the last, int32
              "google.protobuf.UInt32Value": "int64", "google.protobuf.UInt64Value": "int64"}


def wrapper(schema: Schema) -> type[ProtoMessage] | None:
    """The well-known wrapper message a value of a primitive schema is written in (None for other schemas)."""
    return _WRAPPERS.get(schema.type)


def unwrapped(message: Descriptor) -> Schema | None:
    """The primitive schema a record holding only a wrapper message is read as (None for other messages)."""
    kind = _UNWRAPPED.get(message.full_name)
    return None if kind is None else Schema(kind)


def to_proto(schema: Schema) -> descriptor_pb2.FileDescriptorProto:
    """The proto3 file holding the message of a struct schema; ValueError for what Protobuf cannot hold."""
    if schema.type != "struct":
        raise ValueError(f"Unsupported root schema of type {schema.type}: a record is a message, and only structs "
                         f"and primitives (in their google.protobuf wrappers) are written")
    package, _, name = (schema.name or "ConnectDefault1").rpartition(".")
    file = descriptor_pb2.FileDescriptorProto(name=f"{schema.name or 'ConnectDefault1'}.proto", package=package,
                                              syntax="proto3")
    file.message_type.append(_message(name, schema, f".{package}".rstrip(".") + f".{name}"))
    return file


def _message(name: str, schema: Schema, full: str) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name)
    for number, field in enumerate(schema.fields, 1):
        out = message.field.add(name=field.name, number=number, label=_Proto.LABEL_OPTIONAL)
        inner = field.schema
        if inner.type == "array":
            out.label = _Proto.LABEL_REPEATED
            inner = _part(inner.value_schema, field.name)
            if inner.type in ("array", "map"):
                raise ValueError(f"field {field.name!r}: an array of {inner.type}s has no Protobuf form")
        if inner.type == "map":
            _map_field(out, message, field.name, inner, full)
        elif inner.type == "struct":
            nested = field.name[:1].upper() + field.name[1:]
            message.nested_type.append(_message(nested, inner, f"{full}.{nested}"))
            out.type, out.type_name = _Proto.TYPE_MESSAGE, f"{full}.{nested}"
        else:
            out.type = _TO_PROTO[inner.type]
            if field.schema.optional and out.label != _Proto.LABEL_REPEATED:
                out.proto3_optional, out.oneof_index = True, len(message.oneof_decl)
                message.oneof_decl.add(name=f"_{field.name}")
    return message


def _map_field(out: _Proto, message: descriptor_pb2.DescriptorProto, name: str, schema: Schema, full: str) -> None:
    keys, values = _part(schema.key_schema, name), _part(schema.value_schema, name)
    if keys.type not in _MAP_KEYS or values.type in ("array", "map"):
        raise ValueError(f"field {name!r}: a map of {keys.type} to {values.type} has no Protobuf form")
    entry = f"{name[:1].upper()}{name[1:]}Entry"
    holder = Schema("struct", fields=(Field("key", Schema(keys.type)),
                                      Field("value", dataclasses.replace(values, optional=False))))
    nested = _message(entry, holder, f"{full}.{entry}")
    nested.options.map_entry = True
    message.nested_type.append(nested)
    out.label, out.type, out.type_name = _Proto.LABEL_REPEATED, _Proto.TYPE_MESSAGE, f"{full}.{entry}"


def _part(schema: Schema | None, name: str) -> Schema:
    if schema is None:
        raise ValueError(f"field {name!r}: an array or map schema needs its parts' schemas")
    return schema


def from_proto(message: Descriptor) -> Schema:
    """The Connect schema of a Protobuf message (a struct named by its full name)."""
    return Schema("struct", name=message.full_name,
                  fields=tuple(Field(f.name, _field_schema(f)) for f in message.fields))


def _field_schema(field: FieldDescriptor) -> Schema:
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return Schema("map", key_schema=_single(key), value_schema=_single(value))
    single = _single(field)
    if field.is_repeated:
        return Schema("array", value_schema=single)
    return dataclasses.replace(single, optional=field.has_presence)


def _single(field: FieldDescriptor) -> Schema:
    if field.message_type is not None:
        return from_proto(field.message_type)
    return Schema(_FROM_PROTO[field.type])


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def to_value(message: ProtoMessage) -> dict[str, Any]:
    """A message as a connector's struct value (a dict; a field without presence set is None)."""
    out: dict[str, Any] = {}
    field: FieldDescriptor
    for field in message.DESCRIPTOR.fields:
        if field.has_presence and not field.is_repeated and not message.HasField(field.name):
            out[field.name] = None
            continue
        value = getattr(message, field.name)
        if _is_map(field):
            inner = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _single_value(inner, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single_value(field, v) for v in value]
        else:
            out[field.name] = _single_value(field, value)
    return out


def _single_value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return to_value(value)
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    return value


class ProtobufConverter(RegistryConverter):
    """See the module docstring."""

    schema_type = serdes.PROTOBUF

    def configure(self, configs: Mapping[str, str], is_key: bool) -> None:
        super().configure(configs, is_key)
        self._readers: dict[type[ProtoMessage], tuple[serdes.Deserialize, Schema, bool]] = {}

    def schema_text(self, schema: Schema) -> str:
        """A struct's proto3 file (base64 descriptor); for a primitive, its wrapper's full name (the writer
        registers google/protobuf/wrappers.proto, the file confluent-kafka's serializer sends for it)."""
        wrapped = wrapper(schema)
        if wrapped is not None:
            return wrapped.DESCRIPTOR.full_name
        return base64.b64encode(to_proto(schema).SerializeToString(deterministic=True)).decode()

    def new_writer(self, text: str) -> serdes.Serialize:
        wrapped = _WRAPPED.get(text)
        cls = wrapped or serdes.message_class(text, (), None, f"{type(self).__name__}: the schema")
        serialize = serdes.serializer(serdes.PROTOBUF, self.registry, cls, self.write_conf)

        def write(value: Any, ctx: SerializationContext) -> bytes | None:
            message = cls(value=value) if wrapped is not None else serdes.protobuf_message(cls, value)
            return serialize(message, ctx)

        return write

    def read(self, data: bytes, ctx: SerializationContext) -> SchemaAndValue:
        schema_id, indexes = serdes.framed_id(data, serdes.PROTOBUF)
        if not isinstance(schema_id, int):
            raise ValueError(f"schema guid {schema_id}: only schema ids are read")
        cls = serdes.writer_message_class(self.registry, schema_id, indexes)
        if cls not in self._readers:
            primitive = unwrapped(cls.DESCRIPTOR)
            # confluent-kafka's deserializer, given a registry, builds the writer's file into a pool that holds
            # the well-known types already, which fails for wrappers.proto itself (duplicate symbols): the
            # wrapper's class, found above by the record's schema id, reads it without the registry
            registry = None if primitive is not None else self.registry
            self._readers[cls] = (serdes.deserializer(serdes.PROTOBUF, registry, cls),
                                  primitive or from_proto(cls.DESCRIPTOR), primitive is not None)
        deserialize, schema, is_wrapper = self._readers[cls]
        message = deserialize(data, ctx)
        return schema, (message.value if is_wrapper else to_value(message))
