"""The registry's refusals, with Confluent Schema Registry's error codes."""

from __future__ import annotations


class RegistryError(Exception):
    """A request the registry refuses, with Confluent Schema Registry's error code and HTTP status."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    @property
    def status(self) -> int:
        return self.error_code if self.error_code < 1000 else self.error_code // 100  # 409, or 40401 -> 404


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(40401, f"Subject '{subject}' not found.")
