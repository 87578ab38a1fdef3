"""A new engine is one module and its conformance run: a toy engine kept in a dict, written here and nowhere else,
passes every engine-independent behaviour of the conformance suite (tests/real/test_engine_conformance.py) that
Docker's, Podman's and the simulation's engines pass, and the observer reads containers through it."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import pytest
from real.test_engine_conformance import BEHAVIOURS, Subject, conforms

from reconciler.host.engine.protocol import EngineDown, EngineError, NotFound

LIVE = "running"


class ToyEngine:
    """Containers in a dict. A process "ignores SIGTERM" when its command says ``stubborn``: a stop kills it."""

    kind = "toy"

    def __init__(self, *, answers: bool = True):
        self.url = "toy://"
        self.answers = answers
        self.images = {"toy:1": {"Id": "sha256:toy", "Config": {"Labels": {}}}}
        self.boxes: dict[str, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []
        self._ids = (f"{n:064x}" for n in itertools.count(1))

    def _up(self) -> None:
        if not self.answers:
            raise EngineDown("the toy engine does not answer")

    def _box(self, ref: str) -> dict[str, Any]:
        self._up()
        for box in self.boxes.values():
            if ref in (box["Id"], box["Name"]):
                return box
        raise NotFound(404, f"No such container: {ref}")

    def _event(self, box: dict[str, Any], action: str) -> None:
        self.log.append({"Action": action, "status": action, "id": box["Id"]})

    def ping(self) -> None:
        self._up()

    def version(self) -> dict[str, Any]:
        self._up()
        return {"Version": "0", "Components": [{"Name": "Toy"}]}

    def info(self) -> dict[str, Any]:
        self._up()
        return {"Runtimes": {}}

    def containers(self, *, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        self._up()
        return [
            {"Id": b["Id"], "Names": ["/" + b["Name"]], "State": b["State"], "Labels": dict(b["Labels"])}
            for b in self.boxes.values()
            if all(b["Labels"].get(k) == v for k, v in (labels or {}).items())
        ]

    def inspect_container(self, cid: str) -> dict[str, Any]:
        b = self._box(cid)
        requests = [{"Driver": "nvidia", "DeviceIDs": b["Gpus"], "Capabilities": [["gpu"]]}] if b["Gpus"] else None
        return {
            "Id": b["Id"],
            "Name": "/" + b["Name"],
            "State": {"Status": b["State"], "ExitCode": b["Exit"]},
            "Config": {"Labels": dict(b["Labels"]), "Env": b["Env"], "Cmd": b["Cmd"]},
            "HostConfig": {"Binds": b["Binds"], "DeviceRequests": requests},
        }

    def inspect_image(self, ref: str) -> dict[str, Any]:
        self._up()
        if ref not in self.images:
            raise NotFound(404, f"No such image: {ref}")
        return self.images[ref]

    def create(self, spec: Mapping[str, Any]) -> str:
        self.inspect_image(spec["image"])
        if any(b["Name"] == spec["name"] for b in self.boxes.values()):
            raise EngineError(409, f"name {spec['name']} in use")
        hc = spec["host_config"]
        box = {
            "Id": next(self._ids),
            "Name": spec["name"],
            "State": "created",
            "Exit": 0,
            "Labels": dict(spec.get("labels") or {}),
            "Env": [f"{k}={v}" for k, v in (spec.get("environment") or {}).items()],
            "Cmd": list(spec.get("command") or []),
            "Binds": list(hc.get("binds") or []),
            "Gpus": [g for r in hc.get("device_requests") or [] for g in r.get("DeviceIDs") or []],
        }
        self.boxes[box["Id"]] = box
        return str(box["Id"])

    def start(self, cid: str) -> None:
        b = self._box(cid)
        b["State"] = LIVE
        self._event(b, "start")

    def stop(self, cid: str, *, timeout_s: int) -> None:
        b = self._box(cid)
        if b["State"] == LIVE:
            b["State"], b["Exit"] = "exited", 137 if "stubborn" in b["Cmd"] else 143
            self._event(b, "die")

    def kill(self, cid: str) -> None:
        b = self._box(cid)
        if b["State"] != LIVE:
            raise EngineError(409, "not running")
        b["State"], b["Exit"] = "exited", 137
        self._event(b, "die")

    def remove(self, cid: str) -> None:
        b = self._box(cid)
        if b["State"] == LIVE:
            raise EngineError(409, "running")
        del self.boxes[b["Id"]]
        self._event(b, "destroy")

    def rename(self, cid: str, name: str) -> None:
        b = self._box(cid)
        if any(x["Name"] == name for x in self.boxes.values()):
            raise EngineError(409, f"name {name} in use")
        b["Name"] = name

    def logs(self, cid: str, *, tail: int) -> str:
        self._box(cid)
        return ""

    def events(self, *, actions: Collection[str]) -> Iterator[dict[str, Any]]:
        """Every event logged from this call on, read as the stream is iterated; it ends where the log does."""
        self._up()
        start = len(self.log)

        def stream() -> Iterator[dict[str, Any]]:
            i = start
            while i < len(self.log):
                ev, i = self.log[i], i + 1
                if ev["Action"] in actions:
                    yield ev

        return stream()


def _stubborn(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "command": ["stubborn"]}


@pytest.fixture
def toy() -> Subject:
    return Subject(ToyEngine(), "toy:1", lambda: ToyEngine(answers=False), _stubborn, ("GPU-toy-0",))


@pytest.mark.parametrize("behaviour", BEHAVIOURS, ids=lambda b: b.__name__)
def test_a_toy_engine_passes_the_conformance_suite(toy: Subject, behaviour: Any) -> None:
    conforms(toy.engine)
    behaviour(toy)


def test_the_observer_reads_through_any_engine() -> None:
    from reconciler.observe.containers import EngineObserver

    engine = ToyEngine()
    cid = engine.create(
        {"image": "toy:1", "name": "lane", "labels": {"io.reconciler.host": "h"}, "host_config": {"binds": []}}
    )
    engine.start(cid)
    containers, source = EngineObserver(engine.url, engine=engine).observe()
    assert source.ok and [(c.id, c.name, c.state, c.labels) for c in containers] == [
        (cid, "lane", "running", {"io.reconciler.host": "h"})
    ]
    _, down = EngineObserver(engine.url, engine=ToyEngine(answers=False)).observe()
    assert not down.ok and down.cause == "down", down
