"""A registry served over HTTP on each backend's store, for the tests that talk to it as clients do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.connector.store import Store
from onceflow.schemas.registry import RegistryServer, SchemaRegistry


@pytest.fixture
def served(store: Store) -> Iterator[tuple[Store, str]]:
    """The store and the URL of a registry kept on it."""
    registry = SchemaRegistry(store)
    server = RegistryServer(registry, port=0).start()
    yield store, server.url
    server.close()
    registry.close()
