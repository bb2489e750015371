"""A Confluent-compatible schema registry kept on the store: :class:`SchemaRegistry` (ids by CAS on the
``__onceflow.schemas`` stream) and :class:`RegistryServer` (its REST API). See docs/schemas.md."""

from onceflow.schemas.registry.http import RegistryServer
from onceflow.schemas.registry.registry import STREAM, SchemaRegistry
from onceflow.schemas.registry.state import RegistryError

__all__ = ["STREAM", "RegistryError", "RegistryServer", "SchemaRegistry"]
