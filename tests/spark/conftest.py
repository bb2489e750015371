"""One Spark session for the in-process Spark tests (it takes ~10 s to start)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from onceflow.connector.store import Store, open_store
from onceflow.schemas.registry import RegistryServer, SchemaRegistry


@pytest.fixture
def embedded(sqlite_url: str) -> Iterator[Store]:
    """A store on the embedded backend only, for the Spark tests that need not run on both."""
    store = open_store(sqlite_url)
    yield store
    store.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from onceflow import spark_sinks

    session = (SparkSession.builder.master("local[2,4]").appName("onceflow-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    spark_sinks.register(session)
    yield session
    session.stop()



@pytest.fixture
def registry(embedded: Store) -> Iterator[tuple[SchemaRegistry, str]]:
    """A schema registry kept on the embedded store and served over HTTP: (the registry, its URL)."""
    kept = SchemaRegistry(embedded)
    with contextlib.closing(kept), contextlib.closing(RegistryServer(kept, port=0).start()) as server:
        yield kept, server.url
