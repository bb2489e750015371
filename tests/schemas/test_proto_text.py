""".proto text reads as protoc reads it, and registers as the serialized form does."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from onceflow.connector.store import open_store
from onceflow.schemas.registry import RegistryError, SchemaRegistry
from onceflow.schemas.registry.protobuf import canonical

SHOP = """
syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";

/* An order. */
message Order {
  int64 id = 1;
  optional string note = 2 [json_name = "memo"];  // proto3 optional: a synthetic oneof, after the declared ones
  repeated Line lines = 3;
  map<string, int32> counts = 4;
  Status status = 5;
  google.protobuf.Timestamp at = 6;
  oneof payment { string card = 7; bytes token = 8; }
  reserved 9, 12 to 14;
  reserved "old";
  message Line { string sku = 1; repeated int32 qty = 2 [packed = false]; }
  enum Status { option allow_alias = true; NEW = 0; OPEN = 1; STARTED = 1; reserved 5 to 7; }
}
enum Kind { KIND_UNSPECIFIED = 0; KIND_BACK = -1; }
"""


def test_the_descriptor_read_from_text_is_protocs(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (the dev extra) brings protoc")
    (tmp_path / "shop.proto").write_text(SHOP)
    well_known = Path(protoc.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{well_known}", f"-I{tmp_path}", f"--descriptor_set_out={tmp_path}/out.pb",
                        "shop.proto"]) == 0
    expected = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "out.pb").read_bytes()).file[0]
    read = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(canonical(SHOP, {})))
    read.name = expected.name
    for message in [*expected.message_type, *expected.message_type[0].nested_type]:
        for field in message.field:
            if field.json_name == field.name:  # protoc writes the default json_name, the pool leaves it out
                field.ClearField("json_name")
    assert read == expected


@pytest.mark.parametrize(("text", "named"), [
    ("message Order { int64 id = 0; }", "field number 0"),
    ("message Order { Missing m = 1; }", "Missing"),
    ("syntax = \"proto3\"; message Order { int64 id = 1 }", "expected ';'"),
    ("message Order { extensions 100 to 199; }", "extensions"),
])
def test_bad_proto_text_is_refused_naming_what_is_wrong(store_url: str, text: str, named: str) -> None:
    registry = SchemaRegistry(open_store(store_url))
    with pytest.raises(RegistryError) as info:
        registry.register("s", "PROTOBUF", text)
    assert info.value.error_code == 42201 and named in info.value.message, info.value.message
    assert registry.subjects() == []
    registry.close()


def test_proto_text_evolutions_are_checked_like_serialized_ones(store_url: str) -> None:
    registry = SchemaRegistry(open_store(store_url))
    first = registry.register("s", "PROTOBUF", "syntax = 'proto3'; message Order { int64 id = 1; string note = 2; }")
    with pytest.raises(RegistryError, match="retyped from string to double"):
        registry.register("s", "PROTOBUF", "syntax = 'proto3'; message Order { int64 id = 1; double note = 2; }")
    assert registry.register("s", "PROTOBUF", "syntax = 'proto3';\nmessage Order {\n  int64 id = 1;\n"
                                              "  string note = 2;\n}\n") == first  # the same schema, laid out anew
    registry.close()
