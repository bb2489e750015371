"""A Confluent-compatible schema registry kept on the store: :class:`SchemaRegistry` (ids by CAS on the
``__onceflow.schemas`` stream) and :class:`RegistryServer` (its REST API). See docs/schemas.md."""

from onceflow.schemas.registry.errors import RegistryError
from onceflow.schemas.registry.http import RegistryServer
from onceflow.schemas.registry.registry import STREAM, SchemaRegistry

__all__ = ["STREAM", "RegistryError", "RegistryServer", "SchemaRegistry"]
