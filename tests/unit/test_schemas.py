"""The generated protobuf module matches its .proto: a schema edit without regenerating fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

SCHEMAS = Path(__file__).parents[2] / "schemas"


def test_txn_log_pb2_is_generated_from_txn_log_proto(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (the dev extra) regenerates the module")
    assert protoc.main(["protoc", f"-I{SCHEMAS}", f"--python_out={tmp_path}", str(SCHEMAS / "txn_log.proto")]) == 0
    generated = (tmp_path / "txn_log_pb2.py").read_text()
    committed = (SCHEMAS / "txn_log_pb2.py").read_text()
    descriptor = lambda text: [line for line in text.splitlines() if "AddSerializedFile" in line]  # noqa: E731
    regenerate = "python3 -m grpc_tools.protoc -I schemas --python_out=schemas --pyi_out=schemas schemas/txn_log.proto"
    assert descriptor(generated) == descriptor(committed), f"run: {regenerate}"
