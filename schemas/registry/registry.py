"""A schema registry kept on the store: every change is a record of one stream, appended with CAS.

A change is appended with ``expected_offset`` = the end of the stream as this process last read it, so it lands
only if nobody changed the registry since; else the process reads on and decides again. Ids and versions are
therefore decided by the stream's order, and every registry process on one store agrees on them, across restarts:
a registration racing another of the same schema finds it on its retry and returns the same id.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from onceflow.connector.errors import ErrorCode, KafkaException
from onceflow.connector.store import Record, Store, read_range
from onceflow.schemas.registry import compatibility
from onceflow.schemas.registry.errors import RegistryError
from onceflow.schemas.registry.state import MODES, RegistryState, SchemaText, Version, canonical

STREAM = "__onceflow.schemas"
_ATTEMPTS = 100
T = TypeVar("T")


class SchemaRegistry:
    """Register and look up schemas on ``store``; thread-safe."""

    def __init__(self, store: Store) -> None:
        self._store = store
        if STREAM not in store.list_streams():
            try:
                store.create_stream(STREAM, 1)
            except KafkaException as exc:
                if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:  # another registry made it first
                    raise
        self._writer = store.open_writer()
        self._state = RegistryState()
        self._next = 0  # the next offset to read
        self._lock = threading.Lock()

    def close(self) -> None:
        self._writer.close()

    # -- reads ------------------------------------------------------------------------------------------------

    def subjects(self, deleted: bool = False) -> list[str]:
        with self._lock:
            self._catch_up()
            return sorted(s for s, versions in self._state.subjects.items()
                          if any(deleted or not v.deleted for v in versions))

    def versions(self, subject: str, deleted: bool = False) -> list[int]:
        with self._lock:
            self._catch_up()
            return [v.version for v in self._state.live_versions(subject, deleted)]

    def version(self, subject: str, version: str) -> tuple[Version, SchemaText]:
        with self._lock:
            self._catch_up()
            found = self._state.version(subject, version)
            return found, self._state.schema(found.schema_id)

    def schema(self, schema_id: int) -> SchemaText:
        """Schema ``schema_id``: an id never changes its schema, so one already read is answered without
        reading the stream on (what every deserializer asks)."""
        with self._lock:
            if schema_id not in self._state.schemas:
                self._catch_up()
            return self._state.schema(schema_id)

    def usages(self, schema_id: int) -> list[tuple[str, int]]:
        """(subject, version) of every live version that is schema ``schema_id`` (40403 if there is none)."""
        with self._lock:
            self._catch_up()
            self._state.schema(schema_id)
            return [(s, v.version) for s, versions in sorted(self._state.subjects.items()) for v in versions
                    if v.schema_id == schema_id and not v.deleted]

    def lookup(self, subject: str, schema_type: str, text: str, references: Any = ()) -> tuple[Version, SchemaText]:
        """The live version of ``subject`` that is this schema; 40401 / 40403 if there is none."""
        with self._lock:
            self._catch_up()
            wanted = self._canonical(schema_type, text, references)
            found = self._live_version_of(subject, wanted)
            if found is None:
                self._state.live_versions(subject)  # 40401 when the subject has no version at all
                raise RegistryError(40403, "Schema not found")
            return found, wanted

    # -- changes ----------------------------------------------------------------------------------------------

    def register(self, subject: str, schema_type: str, text: str, references: Any = ()) -> int:
        """The id of the schema under ``subject``, registering it as the subject's next version if it is not
        one of its live versions; 42201 for an invalid schema (nothing is stored then)."""

        def decide() -> tuple[dict[str, Any] | None, int]:
            wanted = self._canonical(schema_type, text, references)
            found = self._live_version_of(subject, wanted)
            if found is not None:
                return None, found.schema_id
            self._check_writable(subject)
            self._check_compatible(subject, wanted, "latest")
            schema_id = self._state.id_of(wanted) or self._state.next_id()
            version = max((v.version for v in self._state.subjects.get(subject, [])), default=0) + 1
            return {"op": "register", "subject": subject, "version": version, "id": schema_id,
                    "schemaType": wanted.schema_type, "schema": wanted.schema,
                    "references": [list(r) for r in wanted.references]}, schema_id

        return self._change(f"registering under {subject!r}", decide)

    def compatible(self, subject: str, version: str, schema_type: str, text: str,
                   references: Any = ()) -> list[str]:
        """What keeps the schema from following ``version`` of ``subject`` (``latest``: the subject's versions,
        as its level says) at the subject's level; [] if nothing."""
        with self._lock:
            self._catch_up()
            wanted = self._canonical(schema_type, text, references)
            try:
                self._check_compatible(subject, wanted, version)
            except RegistryError as exc:
                if exc.error_code != 409:
                    raise
                return [exc.message]
            return []

    def level(self, subject: str | None) -> str:
        with self._lock:
            self._catch_up()
            return self._state.level(subject)

    def set_level(self, subject: str | None, level: Any) -> str:
        """Set the compatibility level of ``subject`` (None: the registry's own); 42203 for an unknown one."""
        if level not in compatibility.LEVELS:
            raise RegistryError(42203, f"Invalid compatibility level {level!r}: expected one of "
                                f"{list(compatibility.LEVELS)}")
        return self._change(f"setting the level of {subject!r}",
                            lambda: ({"op": "config", "subject": subject, "compatibility": level}, str(level)))

    def mode(self, subject: str | None) -> str:
        with self._lock:
            self._catch_up()
            return self._state.mode(subject)

    def set_mode(self, subject: str | None, mode: Any) -> str:
        """Set the mode of ``subject`` (None: the registry's own): READWRITE, or READONLY, where registrations
        and deletions are refused (42205); 42204 for another one (IMPORT is not served)."""
        if mode not in MODES:
            raise RegistryError(42204, f"Invalid mode {mode!r}: this registry serves {list(MODES)}")
        return self._change(f"setting the mode of {subject!r}",
                            lambda: ({"op": "mode", "subject": subject, "mode": mode}, str(mode)))

    def delete(self, subject: str, version: str | None, permanent: bool) -> list[int]:
        """Soft-delete a subject or one version of it (``permanent``: remove what was soft-deleted before);
        the versions deleted."""

        def decide() -> tuple[dict[str, Any] | None, list[int]]:
            self._check_writable(subject)
            chosen = self._deletable(subject, version, permanent)
            return ({"op": "delete", "subject": subject, "permanent": permanent,
                     "version": None if version is None else chosen[0].version}, [v.version for v in chosen])

        return self._change(f"deleting {subject!r}", decide)

    # -- internals --------------------------------------------------------------------------------------------

    def _change(self, what: str, decide: Callable[[], tuple[dict[str, Any] | None, T]]) -> T:
        """Append the record ``decide`` makes from the registry as read (None: nothing to change) if nobody
        changed the registry meanwhile, else read on and decide again; ``decide``'s answer."""
        with self._lock:
            for _ in range(_ATTEMPTS):
                end = self._catch_up()
                record, answer = decide()
                if record is None or self._append(record, end):
                    return answer
        raise RegistryError(50001, f"{what}: the registry changed on every one of {_ATTEMPTS} attempts")

    def _check_writable(self, subject: str) -> None:
        if self._state.mode(subject) == "READONLY":
            raise RegistryError(42205, f"Subject {subject} is in read-only mode")

    def _deletable(self, subject: str, version: str | None, permanent: bool) -> list[Version]:
        if version is None:
            every = self._state.live_versions(subject, deleted=permanent)
            if permanent and any(not v.deleted for v in every):
                raise RegistryError(40405, f"Subject '{subject}' was not deleted first before being permanently "
                                    "deleted")
            return every
        if not permanent:
            return [self._state.version(subject, version)]
        number = int(version) if version.lstrip("-").isdigit() else -1
        found = next((v for v in self._state.live_versions(subject, deleted=True) if v.version == number), None)
        if found is None:
            raise RegistryError(40402, f"Version {version} not found.")
        if not found.deleted:
            raise RegistryError(40407, f"Subject '{subject}' Version {number} was not deleted first before being "
                                "permanently deleted")
        return [found]

    def _check_compatible(self, subject: str, wanted: SchemaText, version: str) -> None:
        """409 if ``wanted`` may not follow the subject's versions (``version``: one of them, or ``latest``)."""
        level = self._state.level(subject)
        live = [v for v in self._state.subjects.get(subject, []) if not v.deleted]
        if level == "NONE" or not live:
            return
        chosen = live if version == "latest" else [self._state.version(subject, version)]
        earlier = [self._state.schema(v.schema_id) for v in chosen]
        found = [f"the schema type changes from {e.schema_type} to {wanted.schema_type}" for e in earlier
                 if e.schema_type != wanted.schema_type][:1]
        found = found or compatibility.problems(level, wanted.schema_type, wanted.schema, [e.schema for e in earlier])
        if found:
            raise RegistryError(409, f"Schema being registered is incompatible with an earlier schema for subject "
                                f"\"{subject}\" ({level}), details: {found}")

    def _canonical(self, schema_type: str, text: str, references: Any) -> SchemaText:
        """The stored form of a schema as a request sends it, its references resolved as of the stream read."""
        named = _references(references)
        return canonical(schema_type, text, named, self._imports(named))

    def _imports(self, references: tuple[tuple[str, str, int], ...]) -> dict[str, str]:
        """The schemas ``references`` name, and those theirs name, by name; 42201 for one that is not there."""
        found: dict[str, str] = {}
        for name, subject, number in references:
            try:
                target = self._state.schema(self._state.version(subject, number).schema_id)
            except RegistryError as exc:
                raise RegistryError(42201, f"Invalid schema: reference {name!r}: {exc.message}") from exc
            found |= {name: target.schema, **self._imports(target.references)}
        return found

    def _live_version_of(self, subject: str, wanted: SchemaText) -> Version | None:
        return next((v for v in self._state.subjects.get(subject, [])
                     if not v.deleted and self._state.schemas.get(v.schema_id) == wanted), None)

    def _append(self, record: dict[str, Any], end: int) -> bool:
        """Append ``record`` if the stream still ends at ``end``; whether it did (then it is applied)."""
        try:
            self._writer.append(STREAM, 0, [Record(None, json.dumps(record).encode())], expected_offset=end)
        except KafkaException as exc:
            if exc.code != ErrorCode.CAS_MISMATCH:
                raise RegistryError(50001, f"Error in the backend data store: {exc}") from exc
            return False
        self._catch_up()
        return True

    def _catch_up(self) -> int:
        """Apply every record stored so far; the stream's end offset."""
        try:
            end = self._store.partition_state(STREAM, 0).end_offset
            for message in read_range(self._store, STREAM, 0, self._next, end):
                self._state.apply(json.loads(message.value() or b"{}"))
                self._next = (message.offset() or 0) + 1
        except KafkaException as exc:
            raise RegistryError(50001, f"Error in the backend data store: {exc}") from exc
        return end


def _references(references: Any) -> tuple[tuple[str, str, int], ...]:
    """Schema references as the REST API sends them (name, subject, version), checked."""
    try:
        return tuple((str(r["name"]), str(r["subject"]), int(r["version"])) for r in references or ())
    except (TypeError, KeyError, ValueError) as exc:
        raise RegistryError(42201, f"Invalid schema references: {exc}") from exc
