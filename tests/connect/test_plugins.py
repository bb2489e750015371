"""Plugins are found only through installed entry points (or plugin.path); a config can name nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.connect.app import ConnectWorker
from onceflow.connect.plugins import ENTRY_POINT_GROUP, Plugins
from onceflow.connector.errors import ErrorCode, KafkaException
from tests.connect.conftest import client

PLUGIN_SOURCE = '''
from onceflow.connect.config_def import ConfigDef
from onceflow.connect.connector import SourceConnector

class EchoConnector(SourceConnector):
    def version(self): return "9.9"
    def config(self): return ConfigDef()
    def start(self, props): pass
    def task_class(self): raise NotImplementedError
    def task_configs(self, max_tasks): return []
    def stop(self): pass
'''


def install_plugin(directory: Path, module: str) -> None:
    """A distribution installed into ``directory`` (as ``pip install --target`` would) with one entry point."""
    (directory / f"{module}.py").write_text(PLUGIN_SOURCE)
    info = directory / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n"
                                           f"com.example.EchoConnector = {module}:EchoConnector\n")


def test_the_built_in_plugins_are_entry_points_under_kafkas_class_names() -> None:
    plugins = Plugins()
    names = {d.class_name: d.kind for d in plugins.all()}
    assert names["org.apache.kafka.connect.file.FileStreamSourceConnector"] == "source"
    assert names["org.apache.kafka.connect.file.FileStreamSinkConnector"] == "sink"
    assert names["org.apache.kafka.connect.json.JsonConverter"] == "converter"
    full = "org.apache.kafka.connect.file.FileStreamSourceConnector"
    for alias in ("FileStreamSource", "FileStreamSourceConnector", full):
        assert plugins.connector(alias).__name__ == "FileStreamSourceConnector"


def test_a_plugin_installed_in_a_plugin_path_directory_is_found_with_its_aliases(tmp_path: Path) -> None:
    install_plugin(tmp_path, "echo_plugin_a")
    without = Plugins()
    assert without.find("com.example.EchoConnector") is None
    plugins = Plugins([str(tmp_path)])
    desc = plugins.find("Echo")
    assert desc is not None and desc.info() == {"class": "com.example.EchoConnector", "type": "source",
                                                "version": "9.9"}


def test_a_config_naming_an_import_path_instead_of_a_plugin_is_refused(worker_props: dict[str, str],
                                                                        tmp_path: Path) -> None:
    with ConnectWorker(worker_props) as worker:
        rest = client(worker)
        for name in ("os.system", "onceflow.connect.file.FileStreamSourceConnector", "com.example.Missing"):
            status, error = rest.request("POST", "/connectors", {"name": "x", "config": {
                "connector.class": name, "topic": "t", "file": str(tmp_path / "f")}})
            assert status == 400 and error["error_code"] == 400
            assert error["message"].startswith(f"Failed to find any class that implements Connector and which name "
                                               f"matches {name}")
        assert rest.request("GET", "/connectors") == (200, [])


def test_a_worker_refuses_a_converter_that_is_not_installed(worker_props: dict[str, str]) -> None:
    with pytest.raises(KafkaException) as caught:
        ConnectWorker({**worker_props, "value.converter": "com.example.UninstalledConverter"})
    assert caught.value.code == ErrorCode.INVALID_CONFIG and "ProtobufConverter" in str(caught.value)


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("bootstrap.servers", "localhost:9092", "store.url=kafka://localhost:9092"),
    ("offset.flush.interval", "10", "unknown worker config key 'offset.flush.interval'"),
    ("exactly.once.source.support", "sometimes", "exactly.once.source.support"),
    ("group.id", "g", "standalone worker joins no group"),
])
def test_a_bad_worker_config_is_refused_naming_the_key(worker_props: dict[str, str], key: str, value: str,
                                                       needle: str) -> None:
    with pytest.raises(KafkaException) as caught:
        ConnectWorker({**worker_props, key: value})
    assert caught.value.code == ErrorCode.INVALID_CONFIG and needle in str(caught.value)


def test_the_plugin_api_is_the_packages_public_surface() -> None:
    import onceflow.connect

    assert sorted(onceflow.connect.__all__) == [
        "ConfigDef", "ConfigValue", "ConnectRecord", "Connector", "ConnectorContext", "Converter",
        "ErrantRecordReporter", "ExactlyOnceSupport", "Field", "Importance", "OffsetStorageReader", "Predicate",
        "RecordMetadata", "Schema", "SinkConnector", "SinkRecord", "SinkTask", "SinkTaskContext", "SourceConnector",
        "SourceRecord", "SourceTask", "SourceTaskContext", "Task", "TransactionContext", "Transformation", "Type",
        "Width"]
