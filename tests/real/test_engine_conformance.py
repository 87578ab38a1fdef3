"""One conformance suite for every container engine (``reconciler.host.engine.protocol.Engine``): the same behaviours
run against Docker's engine (the real one at RECONCILER_TEST_DOCKER_URL), Podman's Docker-compatible API service
(started by .ci/setup-host, as tests/real/test_engines.py reaches it) and the simulation's (tests/sim/seams.py).

``BEHAVIOURS`` are engine-independent: each takes a ``Subject`` (an engine, the image it has, how it is given a
process that ignores SIGTERM, an engine of its kind that does not answer) and nothing else, so a new engine passes
them with a subject of its own (tests/unit/test_toy_engine.py: a dict-backed engine, no file outside its test).
What the tool reads back is read through its own pure parse (``gpu_devices_of``, ``bind_pairs``), as the observer
reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reconciler.host.engine.protocol import (
    EVENT_ACTIONS,
    GONE_ACTIONS,
    Engine,
    EngineDown,
    EngineError,
    EngineSlow,
    NotFound,
)
from reconciler.observe.containers import gpu_devices_of
from reconciler.observe.device_rules import bind_pairs

ENDED = ("exited", "stopped")
MISSING_IMAGE = "reconciler-test/absent:never"


@dataclass
class Subject:
    """An engine under test and what the suite needs to know of it.

    ``image``: one the engine has, whose ``sleep`` and ``sh`` run; ``stubborn``: the create spec of a container
    whose process ignores SIGTERM (each engine is given one its own way); ``unanswering``: an engine of the same
    kind at an address where nothing answers; ``gpus``: the GPU ids a create may request (by UUID)."""

    engine: Engine
    image: str
    unanswering: Callable[[], Engine]
    stubborn: Callable[[dict[str, Any]], dict[str, Any]]
    gpus: tuple[str, ...] = ()
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    made: list[str] = field(default_factory=list)

    def spec(
        self,
        what: str,
        *,
        labels: dict[str, str] | None = None,
        gpus: tuple[str, ...] = (),
        binds: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """A create spec in the shape ``reconciler.apply.engine_ops.create_spec`` gives (``plan.spec.render``'s)."""
        # The image's programs (sleep, sh) are the host's: /usr is bound in read-only, as tests/real/test_engines.py does
        host_config: dict[str, Any] = {
            "binds": ["/usr:/usr:ro", *binds],
            "restart_policy": {"Name": "no"},
            "network_mode": "none",
        }
        if gpus:
            host_config["device_requests"] = [{"Driver": "nvidia", "DeviceIDs": list(gpus), "Capabilities": [["gpu"]]}]
        return {
            "image": self.image,
            "command": ["sleep", "300"],
            "entrypoint": None,
            # As plan.spec.render sets it: the observer reads the GPUs back from it where an engine's inspect shows
            # no trace of the request (Podman 4.3 applies a CDI device at the start, and its inspect has none).
            "environment": {"NVIDIA_VISIBLE_DEVICES": ",".join(gpus) or "void"},
            "user": None,
            "host_config": host_config,
            "name": f"conformance-{what}-{self.tag}",
            "labels": {"io.reconciler-conformance.run": self.tag, **(labels or {})},
        }

    def create(self, spec: dict[str, Any]) -> str:
        cid = self.engine.create(spec)
        self.made.append(cid)
        return cid

    def cleanup(self) -> None:
        for cid in self.made:
            with contextlib.suppress(Exception):
                self.engine.kill(cid)
            with contextlib.suppress(Exception):
                self.engine.remove(cid)


def _state(s: Subject, cid: str) -> dict[str, Any]:
    return s.engine.inspect_container(cid).get("State") or {}


# ---------------------------------------------------------------- the behaviours, engine-independent


def creates_with_labels_gpu_requests_and_mounts(s: Subject) -> None:
    src = "/etc"  # a path every host has, bound read-only
    cid = s.create(
        s.spec("made", labels={"io.reconciler.host": "conformance"}, gpus=s.gpus[:1], binds=(f"{src}:/x:ro",))
    )
    inspect = s.engine.inspect_container(cid)
    assert inspect["Id"] == cid
    assert inspect["Name"].lstrip("/") == f"conformance-made-{s.tag}"
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    assert labels.get("io.reconciler.host") == "conformance" and labels.get("io.reconciler-conformance.run") == s.tag
    assert (src, "/x") in bind_pairs(inspect), bind_pairs(inspect)
    if s.gpus:
        assert s.gpus[0] in gpu_devices_of(inspect), gpu_devices_of(inspect)
    assert _state(s, cid).get("Status") == "created"
    assert s.engine.inspect_container(f"conformance-made-{s.tag}")["Id"] == cid, "inspected by name too"


def lists_by_label(s: Subject) -> None:
    mine = s.create(s.spec("listed", labels={"io.reconciler-conformance.pick": "yes"}))
    other = s.create(s.spec("other", labels={"io.reconciler-conformance.pick": "no"}))
    picked = s.engine.containers(
        labels={"io.reconciler-conformance.run": s.tag, "io.reconciler-conformance.pick": "yes"}
    )
    assert [c["Id"] for c in picked] == [mine], picked
    (summary,) = picked
    assert summary["State"] == "created" and summary["Names"][0].lstrip("/") == f"conformance-listed-{s.tag}"
    assert summary["Labels"]["io.reconciler-conformance.pick"] == "yes"
    every = {c["Id"] for c in s.engine.containers()}
    assert {mine, other} <= every, "without labels: every container, running or not"


def starts_stops_and_removes(s: Subject) -> None:
    cid = s.create(s.spec("plain"))
    s.engine.start(cid)
    assert _state(s, cid).get("Status") == "running"
    s.engine.stop(cid, timeout_s=10)
    assert _state(s, cid).get("Status") in ENDED
    s.engine.remove(cid)
    with pytest.raises(NotFound):
        s.engine.inspect_container(cid)
    assert cid not in {c["Id"] for c in s.engine.containers()}
    for gone in (lambda: s.engine.stop(cid, timeout_s=1), lambda: s.engine.remove(cid), lambda: s.engine.start(cid)):
        with pytest.raises(NotFound):
            gone()


def stop_kills_a_process_that_ignores_sigterm(s: Subject) -> None:
    cid = s.create(s.stubborn(s.spec("stubborn")))
    s.engine.start(cid)
    assert _state(s, cid).get("Status") == "running"
    s.engine.stop(cid, timeout_s=1)
    state = _state(s, cid)
    assert state.get("Status") in ENDED and state.get("ExitCode") == 137, state  # SIGKILL: 128 + 9


def renames_and_refuses_a_name_in_use(s: Subject) -> None:
    cid = s.create(s.spec("named"))
    s.create(s.spec("taken"))
    with pytest.raises(EngineError) as refused:
        s.engine.rename(cid, f"conformance-taken-{s.tag}")
    assert refused.value.status == 409 and not isinstance(refused.value, NotFound)
    s.engine.rename(cid, f"conformance-renamed-{s.tag}")
    assert s.engine.inspect_container(cid)["Name"].lstrip("/") == f"conformance-renamed-{s.tag}"
    assert isinstance(s.engine.logs(cid, tail=5), str)


def reports_events_of_start_die_and_remove(s: Subject) -> None:
    stream = s.engine.events(actions=EVENT_ACTIONS)
    seen: list[str] = []
    cid = s.create(s.spec("evented"))
    done = threading.Event()

    def read() -> None:
        for ev in stream:
            if (ev.get("id") or (ev.get("Actor") or {}).get("ID")) != cid:
                continue
            seen.append(str(ev.get("status") or ev.get("Action")))
            if any(a in GONE_ACTIONS for a in seen):
                break
        done.set()

    s.engine.start(cid)
    s.engine.stop(cid, timeout_s=10)
    s.engine.remove(cid)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert done.wait(30), f"no remove event within 30 s: {seen}"
    assert seen[0] == "start" and "die" in seen and seen[-1] in GONE_ACTIONS, seen


def a_missing_image_is_not_found(s: Subject) -> None:
    with pytest.raises(NotFound):
        s.engine.inspect_image(MISSING_IMAGE)
    spec = {**s.spec("imageless"), "image": MISSING_IMAGE}
    with pytest.raises(NotFound):
        s.create(spec)
    assert s.engine.inspect_image(s.image).get("Id")


def an_engine_that_does_not_answer_says_so(s: Subject) -> None:
    down = s.unanswering()
    for call in (down.ping, down.containers, lambda: down.inspect_container("abc"), lambda: down.start("abc")):
        with pytest.raises((EngineDown, EngineSlow)):
            call()


BEHAVIOURS: tuple[Callable[[Subject], None], ...] = (
    creates_with_labels_gpu_requests_and_mounts,
    lists_by_label,
    starts_stops_and_removes,
    stop_kills_a_process_that_ignores_sigterm,
    renames_and_refuses_a_name_in_use,
    reports_events_of_start_die_and_remove,
    a_missing_image_is_not_found,
    an_engine_that_does_not_answer_says_so,
)


def conforms(engine: Engine) -> None:
    """The protocol's methods are there (a runtime check of ``Engine``)."""
    assert isinstance(engine, Engine), f"{type(engine).__name__} lacks a method of the engine protocol"


# ---------------------------------------------------------------- the engines: Docker, Podman, the simulation


def _real_stubborn(spec: dict[str, Any]) -> dict[str, Any]:
    # PID 1 of a container gets no default action for SIGTERM, and the trap ignores it outright.
    return {**spec, "command": ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]}


def _dead_url(tmp: Path) -> str:
    return f"unix://{tmp / 'nothing-answers.sock'}"


@contextlib.contextmanager
def _cdi_spec(gpu: str) -> Iterator[None]:
    """A CDI spec of one GPU by UUID (only an env var), so Podman resolves nvidia.com/gpu=<UUID> without a GPU."""
    edits = {"env": ["RECONCILER_CONFORMANCE_GPU=1"]}
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": gpu, "containerEdits": edits}]}
    path = Path("/var/run/cdi") / f"reconciler-conformance-{gpu[4:12]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    try:
        yield
    finally:
        path.unlink()


def _docker(tmp: Path, request: pytest.FixtureRequest) -> Iterator[Subject]:
    from conftest import DOCKER_URL

    from reconciler.host.engine.connect import connect
    from reconciler.host.engine.docker import DockerEngine

    request.getfixturevalue("docker_api")
    image = request.getfixturevalue("image")
    engine = connect(DockerEngine(DOCKER_URL, timeout=30))
    assert engine.kind == "docker", engine
    gpu = f"GPU-{uuid.uuid4()}"
    yield Subject(engine, image, lambda: DockerEngine(_dead_url(tmp), timeout=5), _real_stubborn, (gpu,))


def _podman(tmp: Path, request: pytest.FixtureRequest) -> Iterator[Subject]:
    from real.test_engines import PODMAN_URL, _load_image, _podman_api
    from reconciler.host.engine.connect import connect
    from reconciler.host.engine.docker import DockerEngine

    docker_api = request.getfixturevalue("docker_api")
    image = request.getfixturevalue("image")
    _load_image(docker_api, _podman_api(), image)
    engine = connect(DockerEngine(PODMAN_URL, timeout=30))
    assert engine.kind == "podman", engine
    gpu = f"GPU-{uuid.uuid4()}"
    with _cdi_spec(gpu):
        yield Subject(engine, image, lambda: DockerEngine(_dead_url(tmp), timeout=5), _real_stubborn, (gpu,))


def _sim(tmp: Path, request: pytest.FixtureRequest) -> Iterator[Subject]:
    from sim.seams import SimEngine
    from sim.world import World

    def world() -> World:
        w = World(seed=7)
        w.slow_stop.add("stubborn")  # a recipe whose process ignores SIGTERM (the world's stop waits, then kills)
        return w

    def stubborn(spec: dict[str, Any]) -> dict[str, Any]:
        return {**spec, "labels": {**spec["labels"], "io.reconciler.recipe": "stubborn"}}

    def unanswering() -> SimEngine:
        w = world()
        w.engine_down = True
        return SimEngine(w)

    yield Subject(SimEngine(world()), "sim-vllm:1", unanswering, stubborn, (f"GPU-{uuid.uuid4()}",))


SUBJECTS = {"docker": _docker, "podman": _podman, "sim": _sim}
REAL = [pytest.mark.docker, pytest.mark.root]


@pytest.fixture(params=[pytest.param("docker", marks=REAL), pytest.param("podman", marks=REAL), "sim"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param != "sim" and os.geteuid() != 0:
        pytest.skip("the real engines' sockets need root")
    made = SUBJECTS[request.param](tmp_path, request)
    s = next(made)
    try:
        yield s
    finally:
        s.cleanup()
        with contextlib.suppress(StopIteration):
            next(made)


@pytest.mark.parametrize("behaviour", BEHAVIOURS, ids=lambda b: b.__name__)
def test_every_engine_behaves_alike(subject: Subject, behaviour: Callable[[Subject], None]) -> None:
    conforms(subject.engine)
    t0 = time.monotonic()
    behaviour(subject)
    assert time.monotonic() - t0 < 60
