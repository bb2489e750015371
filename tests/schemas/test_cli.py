"""``onceflow schemas register|list|check`` on the registry kept in a store, with no server running."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.connector.cli import main
from onceflow.connector.store import open_store
from onceflow.schemas.registry import STREAM
from tests.schemas.test_registry import ADDS_DEFAULTED, ADDS_REQUIRED, BASE


def schemas(url: str, *args: str) -> int:
    return main(["--store", url, "schemas", *args])


def test_register_list_and_check_from_the_command_line(store_url: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    files = {name: tmp_path / f"{name}.avsc" for name in ("base", "defaulted", "required")}
    for (_, path), text in zip(files.items(), (BASE, ADDS_DEFAULTED, ADDS_REQUIRED), strict=True):
        path.write_text(text)
    assert schemas(store_url, "register", "orders-value", str(files["base"])) == 0
    assert schemas(store_url, "register", "audit-value", str(files["base"])) == 0
    assert capsys.readouterr().out == "1\n1\n"  # the same schema, the same id
    assert schemas(store_url, "check", "orders-value", str(files["defaulted"])) == 0
    assert capsys.readouterr().out == "compatible\n"
    assert schemas(store_url, "check", "orders-value", str(files["required"])) == 1
    out, err = capsys.readouterr()
    assert out == "incompatible\n" and "note" in err
    assert schemas(store_url, "register", "orders-value", str(files["required"])) == 1
    assert "409" in capsys.readouterr().err
    assert schemas(store_url, "list") == 0
    assert capsys.readouterr().out == "audit-value\t1\t1\tAVRO\norders-value\t1\t1\tAVRO\n"  # nothing more stored


def test_reading_a_store_without_a_registry_makes_none(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    open_store(store_url).close()
    assert schemas(store_url, "list") == 0
    assert schemas(store_url, "list", "orders-value") == 1
    assert "40401" in capsys.readouterr().err
    assert STREAM not in open_store(store_url).list_streams()
