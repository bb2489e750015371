"""Java ``.properties`` files, as Kafka's worker and connector configs are written.

Lines are ``key=value``, ``key: value`` or ``key value``; ``#`` and ``!`` start comments; a line ending in a
backslash continues on the next; ``\\t``, ``\\n``, ``\\uXXXX`` and an escaped separator are understood.
"""

from __future__ import annotations

import re
from pathlib import Path

from onceflow.connector.errors import ErrorCode, fail

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_SEPARATOR = re.compile(r"(?<!\\)(?:\s*[=:]\s*|\s+)")


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6]):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not current and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            current += line[:-1]
            continue
        lines.append(current + line)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse_properties(text: str) -> dict[str, str]:
    """The key/value pairs of a properties document (a later key wins, as in Java)."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        match = _SEPARATOR.search(line)
        key, value = (line[:match.start()], line[match.end():]) if match else (line, "")
        props[_unescape(key)] = _unescape(value)
    return props


def load_properties(path: str | Path) -> dict[str, str]:
    """A properties file; _NOENT naming it if it cannot be read."""
    try:
        return parse_properties(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        fail(ErrorCode._NOENT, f"{path}: cannot read it: {exc.strerror}")
