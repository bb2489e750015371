"""A whole worker process: config, plugins, store, offsets, worker, herder and REST API, put together.

``onceflow connect standalone WORKER.properties CONNECTOR.properties...`` runs :func:`run` with mode standalone
(connectors from the files, kept in memory, every one run here); ``onceflow connect distributed
WORKER.properties`` joins the workers sharing its ``group.id`` (:mod:`onceflow.connect.distributed`). Both stop
gracefully on SIGTERM or Ctrl-C: tasks stop after their current batch and commit it.
"""

from __future__ import annotations

import hashlib
import signal
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType

from onceflow.connect.herder import Herder
from onceflow.connect.offsets import FileOffsets, OffsetStore, StreamOffsets, compacted
from onceflow.connect.plugins import Plugins
from onceflow.connect.properties import load_properties
from onceflow.connect.rest import RestServer
from onceflow.connect.status import StatusBoard, TargetState
from onceflow.connect.task_runner import WorkerContext
from onceflow.connect.worker import Worker
from onceflow.connect.worker_config import Mode, WorkerConfig, worker_config
from onceflow.connector.errors import ErrorCode, fail
from onceflow.connector.store import Store, open_store

STANDALONE_PREFIX = "connect"


def cluster_id(store_url: str) -> str:
    """A stable id of the store, shown as Kafka Connect's ``kafka_cluster_id``."""
    return hashlib.sha256(store_url.encode()).hexdigest()[:22]


def offset_store(config: WorkerConfig, store: Store, client_conf: Mapping[str, str]) -> OffsetStore:
    """A local file for a standalone worker without exactly-once that names one, else the offsets stream."""
    filename = config["offset.storage.file.filename"]
    if config.mode is Mode.STANDALONE and filename and not config.exactly_once:
        return FileOffsets(filename)
    return StreamOffsets(store, config["offset.storage.topic"], config["offset.storage.partitions"],
                         compacted(store, config["offset.storage.replication.factor"]), client_conf)


class ConnectWorker:
    """A running standalone worker (the distributed one subclasses it); :meth:`close` stops it gracefully."""

    mode = Mode.STANDALONE

    def __init__(self, props: Mapping[str, str], extra_plugins: Iterable[tuple[str, type]] = ()) -> None:
        self.config = worker_config(props, self.mode)
        self.plugins = Plugins(self.config["plugin.path"], extra_plugins)
        for which in ("key", "value"):
            self.plugins.converter(self.config[f"{which}.converter"])  # INVALID_CONFIG unless installed
        host, port = self.config.listener
        self.server = RestServer(host, port, self.config["rest.auth.token"])
        try:
            self.store = open_store(self.config.store_url)
            self.herder = self._start()
        except BaseException:
            self.server.close()
            raise
        self.server.serve(self.herder)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def worker_id(self) -> str:
        host, port = self.server.address
        return f"{self.config['rest.advertised.host.name'] or host}:{self.config['rest.advertised.port'] or port}"

    def _start(self) -> Herder:
        client = {"store.url": self.config.store_url, "transaction.group": self.config["transaction.group"]}
        self.offsets = offset_store(self.config, self.store, client)
        statuses = StatusBoard()
        context = WorkerContext(self.config, self.plugins, self.worker_id, self.offsets, self._prefix(),
                                statuses.add_topic)
        worker = Worker(context, statuses.put_connector, statuses.put_task)
        return Herder(worker, self.store, statuses, cluster_id(self.config.store_url))

    def _prefix(self) -> str:
        return STANDALONE_PREFIX

    def add_connector(self, props: Mapping[str, str]) -> None:
        """Create a connector from a properties file's keys (its ``name`` among them)."""
        name = props.get("name")
        if not name:
            fail(ErrorCode.INVALID_CONFIG, "a connector's properties need its name (name=...)")
        self.herder.put_connector_config(name, props, False, TargetState.RUNNING)

    def close(self) -> None:
        """Stop serving, stop every task (each commits its batch) and connector, release the store."""
        self.server.close()
        try:
            self.herder.stop()
        finally:
            self.offsets.close()
            self.store.close()

    def __enter__(self) -> ConnectWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run(mode: str, worker_file: str, connector_files: Sequence[str], store_url: str | None) -> int:
    """The ``onceflow connect`` command: serve until SIGTERM or Ctrl-C."""
    props = load_properties(worker_file)
    if store_url and "store.url" not in props:
        props["store.url"] = store_url
    if mode == "distributed":
        if connector_files:
            fail(ErrorCode.INVALID_CONFIG, "a distributed worker takes connectors through its REST API, not files")
        from onceflow.connect.distributed import DistributedWorker

        worker: ConnectWorker = DistributedWorker(props)
    else:
        worker = ConnectWorker(props)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        for path in connector_files:
            worker.add_connector(load_properties(path))
        print(f"onceflow: Connect worker ({mode}) {worker.worker_id} serving {worker.url}, store "
              f"{worker.config.store_url}", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        worker.close()
    return 0
