"""One REST conversation with a Connect worker, step by step, with what each step must answer.

Run against onceflow's worker alone (the statuses and Kafka Connect's messages it must give) and against Apache
Kafka Connect beside it (the same answers, compared by shape: keys, status codes, error bodies).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from onceflow.integration.kafka_connect import FILE_SINK, FILE_SOURCE, ConnectWorker

EXACT, SHAPE, PREFIX = "exact", "shape", "prefix"
OFFSETS = "offsets"  # an ``until``: the answer lists offsets (a source task commits its first a moment after it runs)
# An ``until``: no partition is listed with a null offset. Kafka Connect lists a partition just reset, offset null,
# until its worker's offset store has read the reset's tombstone (it takes the partitions from that store, then
# reads their offsets to the end of the topic).
SETTLED = "settled"


@dataclasses.dataclass(frozen=True)
class Step:
    """A request, the status it must get, and how its body is compared with the peer's (exact, shape, or the
    first ``prefix`` characters of the error message); ``until`` repeats it until the body satisfies it."""

    method: str
    path: str
    status: int
    body: Any = None
    compare: str = SHAPE
    prefix: int = 0
    until: str | None = None  # a state every status in the answer must be in, OFFSETS or SETTLED


def scenario(directory: Path) -> list[Step]:
    source = {"connector.class": FILE_SOURCE, "tasks.max": "1", "file": str(directory / "in.txt"), "topic": "lines"}
    sink = {"connector.class": FILE_SINK, "topics": "lines", "file": str(directory / "out.txt")}
    partition = {"filename": str(directory / "in.txt")}
    return [
        Step("GET", "/", 200),
        Step("GET", "/connectors", 200, compare=EXACT),
        Step("GET", "/connector-plugins", 200),
        Step("POST", "/connectors", 201, {"name": "src", "config": source}),
        Step("POST", "/connectors", 409, {"name": "src", "config": source}, EXACT),
        Step("POST", "/connectors", 400, {"name": "no-class", "config": {"tasks.max": "1"}}, EXACT),
        Step("POST", "/connectors", 400, {"name": "bad", "config": {"connector.class": "com.example.Missing"}},
             PREFIX, len("Failed to find any class that implements Connector and which name matches "
                         "com.example.Missing, available connectors are: ")),
        Step("POST", "/connectors", 400, {"name": "bad", "config": {**source, "tasks.max": "zero"}}, PREFIX,
             len("Connector configuration is invalid and contains the following ")),
        Step("POST", "/connectors", 400, {"name": "bad", "config": {"connector.class": FILE_SINK}}, EXACT),
        Step("POST", "/connectors", 400, {"name": " ", "config": source}, EXACT),
        Step("GET", "/connectors/src/status", 200, until="RUNNING"),
        Step("GET", "/connectors/src", 200),
        Step("GET", "/connectors/src/config", 200, compare=EXACT),
        Step("GET", "/connectors/src/tasks", 200),
        Step("GET", "/connectors/src/tasks/0/status", 200),
        Step("GET", "/connectors/src/tasks/5/status", 404, compare=EXACT),
        Step("GET", "/connectors/src/topics", 200),
        Step("GET", "/connectors?expand=status", 200),
        Step("GET", "/connectors?expand=info", 200),
        Step("GET", "/connectors?expand=status&expand=info", 200),
        Step("GET", "/connectors/src/offsets", 200, compare=EXACT, until=OFFSETS),
        Step("DELETE", "/connectors/src/offsets", 400, compare=EXACT),
        Step("PATCH", "/connectors/src/offsets", 400,
             {"offsets": [{"partition": partition, "offset": {"position": 0}}]}, EXACT),
        Step("PUT", "/connectors/src/pause", 202, compare=EXACT),
        Step("GET", "/connectors/src/status", 200, until="PAUSED"),
        Step("PUT", "/connectors/src/resume", 202, compare=EXACT),
        Step("GET", "/connectors/src/status", 200, until="RUNNING"),
        Step("POST", "/connectors/src/restart", 204, compare=EXACT),
        Step("POST", "/connectors/src/restart?includeTasks=true", 202),
        Step("GET", "/connectors/src/status", 200, until="RUNNING"),
        Step("POST", "/connectors/src/restart?includeTasks=true&onlyFailed=true", 202),
        Step("POST", "/connectors/src/tasks/0/restart", 204, compare=EXACT),
        Step("POST", "/connectors/src/tasks/9/restart", 404, compare=EXACT),
        Step("PUT", "/connectors/src/config", 200, source),
        Step("PUT", "/connectors/new/config", 201, sink),
        Step("PUT", "/connectors/other/config", 400, {"connector.class": FILE_SINK}, EXACT),
        Step("PUT", "/connectors/src/stop", 204, compare=EXACT),
        Step("GET", "/connectors/src/status", 200, until="STOPPED"),
        Step("GET", "/connectors/src/offsets", 200, compare=EXACT),
        Step("PATCH", "/connectors/src/offsets", 200, {"offsets": [{"partition": partition,
                                                                    "offset": {"position": 2}}]}, EXACT),
        Step("GET", "/connectors/src/offsets", 200, compare=EXACT),
        Step("PATCH", "/connectors/src/offsets", 400, {"offsets": []}, EXACT),
        Step("DELETE", "/connectors/src/offsets", 200, compare=EXACT),
        Step("GET", "/connectors/src/offsets", 200, compare=EXACT, until=SETTLED),
        Step("GET", "/connectors/src/tasks", 200, compare=EXACT),
        Step("GET", "/connectors/new/status", 200, until="RUNNING"),
        Step("PUT", "/connectors/new/stop", 204, compare=EXACT),
        Step("GET", "/connectors/new/status", 200, until="STOPPED"),
        Step("PATCH", "/connectors/new/offsets", 200, {"offsets": [{"partition": {"kafka_topic": "lines",
                                                                                  "kafka_partition": 0},
                                                                    "offset": {"kafka_offset": 1}}]}, EXACT),
        Step("GET", "/connectors/new/offsets", 200, compare=EXACT),
        Step("DELETE", "/connectors/new/offsets", 200, compare=EXACT),
        Step("DELETE", "/connectors/src", 204, compare=EXACT),
        Step("DELETE", "/connectors/src", 404, compare=EXACT),
        Step("GET", "/connectors/src", 404, compare=EXACT),
        Step("GET", "/connectors/src/status", 404, compare=EXACT),
        Step("GET", "/connectors/src/config", 404, compare=EXACT),
        Step("PUT", "/connectors/src/pause", 404, compare=EXACT),
        Step("PUT", "/connectors/src/stop", 404, compare=EXACT),
        Step("POST", "/connectors/src/restart", 404, compare=EXACT),
        Step("GET", "/connectors/src/offsets", 404, compare=EXACT),
        Step("GET", "/nothing/here", 404, compare=EXACT),
        Step("DELETE", "/connectors", 405, compare=EXACT),
        Step("GET", "/connector-plugins/FileStreamSource/config", 200),
        Step("PUT", "/connector-plugins/FileStreamSource/config/validate", 200,
             {"connector.class": FILE_SOURCE, "tasks.max": "x"}),
        Step("PUT", "/connector-plugins/FileStreamSink/config/validate", 400, {"connector.class": FILE_SOURCE},
             EXACT),
    ]


def _holds(step: Step, answer: tuple[int, Any]) -> bool:
    """Whether ``answer`` satisfies the step's ``until`` (any answer does without one)."""
    if step.until is None:
        return True
    if answer[0] != 200:
        return False
    if step.until == OFFSETS:
        return bool(answer[1]["offsets"])
    if step.until == SETTLED:
        return all(listed["offset"] is not None for listed in answer[1]["offsets"])
    return _all_in(answer[1], step.until)


def _all_in(body: Any, state: str) -> bool:
    """The connector and its tasks (at least one, unless stopped) are all in ``state``."""
    states = {body["connector"]["state"], *(t["state"] for t in body["tasks"])}
    return states == {state} and (bool(body["tasks"]) or state == "STOPPED")


def run(worker: ConnectWorker, steps: list[Step], timeout_s: float = 60) -> list[tuple[int, Any]]:
    """Every step's (status, body); a step with ``until`` is repeated until it holds (or ``timeout_s``)."""
    answers = []
    for step in steps:
        deadline = time.monotonic() + timeout_s
        while True:
            answer = worker.request(step.method, step.path, step.body)
            if _holds(step, answer):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{step.method} {step.path}: never {step.until}: {answer}")
            time.sleep(0.2)
        answers.append(answer)
    return answers


def shape(value: Any) -> Any:
    """A JSON value's shape: object keys and value types (a list by its first element)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def same_shape(mine: Any, theirs: Any) -> bool:
    """Shapes agree; an empty list agrees with any list (Kafka Connect lists a new connector's tasks later)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return mine.keys() == theirs.keys() and all(same_shape(mine[k], theirs[k]) for k in mine)
    if isinstance(mine, list) and isinstance(theirs, list):
        return not mine or not theirs or same_shape(mine[0], theirs[0])
    return mine == theirs


def _without(directory: Path, answers: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """The answers with the scenario's directory (its files' paths) written as {dir}."""
    return [(status, json.loads(json.dumps(body).replace(str(directory), "{dir}"))) for status, body in answers]


def differences(steps: list[Step], mine: list[tuple[int, Any]], theirs: list[tuple[int, Any]],
                directories: tuple[Path, Path]) -> list[str]:
    """Where onceflow's answers differ from Kafka Connect's, as the steps compare them (each system's files are
    in a directory of its own, ``directories``: onceflow's, Kafka Connect's)."""
    found = []
    mine, theirs = _without(directories[0], mine), _without(directories[1], theirs)
    for step, (status, body), (peer_status, peer_body) in zip(steps, mine, theirs, strict=True):
        where = f"{step.method} {step.path} {step.body!r:.60}"
        if status != peer_status:
            found.append(f"{where}: status {status}, Kafka Connect {peer_status} ({body} / {peer_body})")
        elif step.compare == EXACT and body != peer_body:
            found.append(f"{where}: {body} != Kafka Connect's {peer_body}")
        elif step.compare == PREFIX and body["message"][:step.prefix] != peer_body["message"][:step.prefix]:
            found.append(f"{where}: message {body['message']!r} vs Kafka Connect's {peer_body['message']!r}")
        elif not same_shape(shape(body), shape(peer_body)):
            found.append(f"{where}: shape {shape(body)} != Kafka Connect's {shape(peer_body)}")
    return found
