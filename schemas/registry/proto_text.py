""".proto text (proto2 and proto3) to the ``FileDescriptorProto`` the registry keeps, for schemas given as text
(the CLI's files, clients that send text). Declarations are read as protoc reads them: syntax, package, imports,
messages (nested), enums, fields with their labels, maps, oneofs, proto3 ``optional``, reserved numbers and
names, ``json_name`` and ``packed``; type names are left for the descriptor pool to resolve by protobuf's scoping
rules. Other options and services are skipped; extensions, groups and editions are refused (42201).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from google.protobuf import descriptor_pb2

from onceflow.schemas.registry.errors import RegistryError

Field = descriptor_pb2.FieldDescriptorProto
_TOKEN = re.compile(r"""\s+|//[^\n]*|/\*.*?\*/|(?P<token>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\.?[A-Za-z_][\w.]*"""
                    r"""|[-+]?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|[{}\[\]()<>=;,:-])""", re.S)
_SCALARS = {name: getattr(Field, f"TYPE_{name.upper()}") for name in (
    "double", "float", "int64", "uint64", "int32", "fixed64", "fixed32", "bool", "string", "bytes", "uint32",
    "sfixed32", "sfixed64", "sint32", "sint64")}
_LABELS = {"optional": Field.LABEL_OPTIONAL, "required": Field.LABEL_REQUIRED, "repeated": Field.LABEL_REPEATED}
_MAX_FIELD = 536870911


def parse(text: str, name: str = "default.proto") -> descriptor_pb2.FileDescriptorProto:
    """The file descriptor that .proto ``text`` declares; 42201 naming the first thing it cannot read."""
    try:
        return _Parser(text, name).file()
    except (IndexError, ValueError) as exc:
        raise RegistryError(42201, f"Invalid schema: .proto text: {exc or 'it ends too early'}") from exc


class _Parser:
    def __init__(self, text: str, name: str) -> None:
        self._tokens: list[str] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                raise ValueError(f"unexpected character {text[position]!r} at offset {position}")
            if match.group("token"):
                self._tokens.append(match.group("token"))
            position = match.end()
        self._at = 0
        self._file = descriptor_pb2.FileDescriptorProto(name=name, syntax="proto2")

    def file(self) -> descriptor_pb2.FileDescriptorProto:
        while self._at < len(self._tokens):
            word = self._take()
            if word == "syntax":
                self._take("=")
                self._file.syntax = self._string()
                self._take(";")
            elif word == "edition":
                raise ValueError("editions are not read; use syntax = \"proto3\" or \"proto2\"")
            elif word == "package":
                self._file.package = self._take()
                self._take(";")
            elif word == "import":
                self._import()
            elif word == "message":
                self._message(self._file.message_type.add())
            elif word == "enum":
                self._enum(self._file.enum_type.add())
            elif word in ("option", "service"):
                self._skip()
            elif word != ";":
                raise ValueError(f"unexpected {word!r} at the top of the file")
        if self._file.syntax == "proto2":
            self._file.ClearField("syntax")  # as protoc leaves it
        return self._file

    def _import(self) -> None:
        if self._peek() in ("public", "weak"):
            kind = self._take()
            index = len(self._file.dependency)
            (self._file.public_dependency if kind == "public" else self._file.weak_dependency).append(index)
        self._file.dependency.append(self._string())
        self._take(";")

    def _message(self, message: descriptor_pb2.DescriptorProto) -> None:
        message.name = self._take()
        for word in self._block():
            if word in ("message", "enum", "oneof", "reserved", "option", "extensions", "extend", ";", "map"):
                self._take()
            if word == "message":
                self._message(message.nested_type.add())
            elif word == "enum":
                self._enum(message.enum_type.add())
            elif word == "oneof":
                self._oneof(message)
            elif word == "reserved":
                self._reserved(message.reserved_range, message.reserved_name, end_exclusive=True)
            elif word == "option":
                self._skip()
            elif word in ("extensions", "extend"):
                raise ValueError(f"{word} in message {message.name} are not read")
            elif word == "map":
                self._map(message)
            elif word != ";":
                self._field(message, message.field.add())
        _synthetic_oneofs_last(message)

    def _field(self, message: descriptor_pb2.DescriptorProto, field: Field, oneof: int | None = None) -> None:
        label = _LABELS.get(self._peek()) if oneof is None else None
        if label is not None:
            self._take()
        if label == Field.LABEL_OPTIONAL and self._file.syntax == "proto3":
            field.proto3_optional = True
            oneof = len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{self._peek(1)}")  # the synthetic oneof protoc declares
        field.label = label or Field.LABEL_OPTIONAL
        kind = self._take()
        if kind == "group":
            raise ValueError(f"groups are not read (message {message.name})")
        if kind in _SCALARS:
            field.type = _SCALARS[kind]
        else:
            field.type_name = kind  # message or enum: the pool resolves which, and the full name
        field.name = self._take()
        field.number = self._number(self._after("="))
        if oneof is not None:
            field.oneof_index = oneof
        self._field_options(field)
        self._take(";")

    def _field_options(self, field: Field) -> None:
        if self._peek() != "[":
            return
        self._take("[")
        while True:
            key = self._take()
            self._take("=")
            value = self._take()
            if key == "json_name":
                field.json_name = _unquote(value)
            elif key == "packed":
                field.options.packed = value == "true"
            elif key == "deprecated":
                field.options.deprecated = value == "true"
            elif key == "default":
                field.default_value = _unquote(value)
            if self._take() == "]":
                return

    def _map(self, message: descriptor_pb2.DescriptorProto) -> None:
        self._take("<")
        key = self._take()
        value = self._after(",")
        self._take(">")
        name = self._take()
        entry = message.nested_type.add(name="".join(p[:1].upper() + p[1:] for p in name.split("_")) + "Entry")
        entry.options.map_entry = True
        for number, (part, kind) in enumerate((("key", key), ("value", value)), start=1):
            entry.field.add(name=part, number=number, label=Field.LABEL_OPTIONAL,
                            **({"type": _SCALARS[kind]} if kind in _SCALARS else {"type_name": kind}))
        field = message.field.add(name=name, label=Field.LABEL_REPEATED, type=Field.TYPE_MESSAGE,
                                  type_name=entry.name)
        field.number = self._number(self._after("="))
        self._field_options(field)
        self._take(";")

    def _oneof(self, message: descriptor_pb2.DescriptorProto) -> None:
        index = len(message.oneof_decl)
        message.oneof_decl.add(name=self._take())
        for word in self._block():
            if word == "option":
                self._take()
                self._skip()
            else:
                self._field(message, message.field.add(), index)

    def _enum(self, enum: descriptor_pb2.EnumDescriptorProto) -> None:
        enum.name = self._take()
        for _ in self._block():
            word = self._take()
            if word == "option":
                if self._peek() == "allow_alias":
                    self._take()
                    enum.options.allow_alias = self._after("=") == "true"
                    self._take(";")
                else:
                    self._skip()
            elif word == "reserved":
                self._reserved(enum.reserved_range, enum.reserved_name, end_exclusive=False)
            elif word != ";":
                enum.value.add(name=word, number=self._number(self._after("="), signed=True))
                if self._peek() == "[":
                    self._skip_brackets()
                self._take(";")

    def _reserved(self, ranges: Any, names: Any, end_exclusive: bool) -> None:
        """``reserved 2, 9 to 11, 40 to max;`` or ``reserved "foo", "bar";`` (message ranges end exclusive)."""
        while True:
            word = self._take()
            if word[:1] in "\"'":
                names.append(_unquote(word))
            else:
                start = end = self._number(word, signed=not end_exclusive)
                if self._peek() == "to":
                    self._take()
                    bound = self._take()
                    end = _MAX_FIELD if bound == "max" else self._number(bound, signed=not end_exclusive)
                ranges.add(start=start, end=end + 1 if end_exclusive else end)
            if self._take() == ";":
                return

    def _block(self) -> Iterator[str]:
        """The first token of each statement of a ``{...}`` block, which the caller reads; past the block after."""
        self._take("{")
        while self._peek() != "}":
            yield self._peek()
        self._take("}")

    def _skip(self) -> None:
        """Past the rest of a statement: to its ``;``, or past its ``{...}`` block."""
        depth = 0
        while True:
            word = self._take()
            depth += (word == "{") - (word == "}")
            if depth == 0 and word in (";", "}"):
                return

    def _skip_brackets(self) -> None:
        while self._take() != "]":
            pass

    def _number(self, word: str, signed: bool = False) -> int:
        number = int(word, 0)
        if not signed and not 1 <= number <= _MAX_FIELD:
            raise ValueError(f"field number {word} is out of range [1, {_MAX_FIELD}]")
        return number

    def _string(self) -> str:
        word = self._take()
        if word[:1] not in "\"'":
            raise ValueError(f"expected a quoted string, got {word!r}")
        return _unquote(word)

    def _peek(self, ahead: int = 0) -> str:
        return self._tokens[self._at + ahead]

    def _after(self, expected: str) -> str:
        """The token after ``expected`` (``= 3``: 3)."""
        self._take(expected)
        return self._take()

    def _take(self, expected: str | None = None) -> str:
        word = self._tokens[self._at]
        if expected is not None and word != expected:
            raise ValueError(f"expected {expected!r}, got {word!r} (token {self._at + 1})")
        self._at += 1
        return word


def _synthetic_oneofs_last(message: descriptor_pb2.DescriptorProto) -> None:
    """Put the oneofs of proto3 ``optional`` fields after the declared ones, as protoc does (the pool requires it)."""
    synthetic = {f.oneof_index for f in message.field if f.proto3_optional}
    order = [i for i in range(len(message.oneof_decl)) if i not in synthetic] + sorted(synthetic)
    moved = {old: new for new, old in enumerate(order)}
    declared = [descriptor_pb2.OneofDescriptorProto(name=message.oneof_decl[i].name) for i in order]
    del message.oneof_decl[:]
    message.oneof_decl.extend(declared)
    for field in message.field:
        if field.HasField("oneof_index"):
            field.oneof_index = moved[field.oneof_index]


def _unquote(word: str) -> str:
    return word[1:-1].encode().decode("unicode_escape") if word[:1] in "\"'" else word
