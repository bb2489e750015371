"""The complete connector of docs/connect.md runs as written: installed as a plugin (plugin.path), created with
the documented PUT, it counts into its topic, and resumes after a restart without repeating a number."""

from __future__ import annotations

import re
from pathlib import Path

from onceflow.connect.app import ConnectWorker
from tests.connect.conftest import client, wait_until
from tests.connect.test_standalone import values

DOC = Path(__file__).parents[2] / "docs" / "connect.md"


def documented(after: str, language: str) -> str:
    """The first ``language`` code block after the heading or text ``after`` in docs/connect.md."""
    text = DOC.read_text()
    found = re.search(rf"```{language}\n(.*?)```", text[text.index(after):], re.S)
    assert found is not None, f"no {language} block after {after!r}"
    return found.group(1)


def install(directory: Path) -> None:
    """The documented module and entry point, as ``pip install --target directory`` leaves them."""
    (directory / "my_counter.py").write_text(documented("### A complete connector", "python"))
    info = directory / "my_counter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-counter\nVersion: 1.0\n")
    toml = documented("Register it", "toml")
    (info / "entry_points.txt").write_text(toml.replace('[project.entry-points."onceflow.connect.plugins"]',
                                                        "[onceflow.connect.plugins]").replace('"', ""))


def test_the_documented_connector_counts_exactly_once_across_a_restart(worker_props: dict[str, str],
                                                                       tmp_path: Path) -> None:
    install(tmp_path)
    props = {**worker_props, "plugin.path": str(tmp_path)}
    config = {"connector.class": "Counter", "topic": "numbers", "count": "100000"}
    with ConnectWorker(props) as worker:
        assert client(worker).request("PUT", "/connectors/counter/config", config)[0] == 201
        wait_until(lambda: len(values(props["store.url"], "numbers")) >= 300, "the first numbers")
    first = len(values(props["store.url"], "numbers"))
    with ConnectWorker(props) as worker:
        assert client(worker).request("PUT", "/connectors/counter/config", config)[0] == 201
        wait_until(lambda: len(values(props["store.url"], "numbers")) >= first + 300, "numbers after the restart")
    numbers = values(props["store.url"], "numbers")
    assert numbers == [str(n) for n in range(len(numbers))]
