"""The engines people run: the lifecycle against Podman's Docker-compatible API service and through HAProxy in front of
dockerd, with the same assertions as on the bare Docker socket; a slow engine told apart from a dead one.

``engine`` is parametrised: ``podman`` points ``docker.url`` at Podman's API service (``podman system service``,
started by .ci/setup-host at RECONCILER_TEST_PODMAN_URL, default unix:///run/podman-test/podman.sock; the fake vLLM
image is copied into it from Docker with ``docker save | POST /images/load``); ``haproxy`` runs Debian's haproxy with
the shipped examples/haproxy/haproxy.cfg (its socket paths and the engine's socket replaced) and points
``docker.url`` at its apply socket. The set is focused on what differs between engines: enter, leave, the TP=2
offload lane with its file's owners and its GPU processes attributed to the container through /proc, a reclaim,
and a squatter that blocks. The whole suite runs on Docker's socket in tests/real/test_e2e_apply.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import DOCKER_URL, _require_docker
from e2e_helpers import IMAGE, TEST_LABEL, LoopProcess, Root, http_status, make_root, stop_process, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "examples" / "haproxy" / "haproxy.cfg"
PODMAN_URL = os.environ.get("RECONCILER_TEST_PODMAN_URL", "unix:///run/podman-test/podman.sock")
MIB = 1 << 20
A, B = "dark-compute-a", "dark-compute-b"


def _missing(what: str) -> None:
    if _require_docker():
        pytest.fail(f"{what} (.ci/setup-host installs and starts it)")
    pytest.skip(what)


# ---------------------------------------------------------------- the engines


class Engine:
    """An engine as the tool reaches it (``url``) and as the test drives it (``api``: a docker.APIClient)."""

    def __init__(self, kind: str, url: str, api: Any, read_url: str = ""):
        self.kind = kind
        self.url = url
        self.api = api
        self.read_url = read_url


def _podman_api() -> Any:
    import docker

    try:
        api = docker.APIClient(base_url=PODMAN_URL, version="auto", timeout=60)
        components = [c.get("Name", "") for c in api.version().get("Components") or []]
    except Exception as exc:  # noqa: BLE001
        _missing(f"Podman's API service does not answer at {PODMAN_URL}: {exc}")
    if "Podman Engine" not in components:
        pytest.fail(f"{PODMAN_URL} is not Podman's API service: {components}")
    return api


def _load_image(docker_api: Any, podman: Any, image: str) -> None:
    """Copy the locally built image from Docker into Podman (no registry): docker save | POST /images/load."""
    want = (docker_api.inspect_image(image).get("Config") or {}).get("Labels") or {}
    with contextlib.suppress(Exception):
        have = (podman.inspect_image(image).get("Config") or {}).get("Labels") or {}
        if have == want:
            return
    podman.load_image(b"".join(docker_api.get_image(image)))


@contextlib.contextmanager
def _haproxy(workdir: Path, upstream: str) -> Iterator[tuple[Path, Path]]:
    """Debian's haproxy running examples/haproxy/haproxy.cfg with its sockets under ``workdir``: (read, apply)."""
    exe = shutil.which("haproxy")
    if exe is None:
        _missing("haproxy is not installed")
    cfg = HAPROXY_CFG.read_text().replace("/run/reconciler-proxy/", f"{workdir}/")
    cfg = cfg.replace("server engine /var/run/docker.sock", f"server engine {upstream}")
    (workdir / "haproxy.cfg").write_text(cfg)
    proc = subprocess.Popen(
        [exe, "-f", str(workdir / "haproxy.cfg"), "-db"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    read, apply = workdir / "read.sock", workdir / "apply.sock"
    try:
        wait_until(
            lambda: (read.exists() and apply.exists()) or proc.poll() is not None, timeout=10, what="haproxy's sockets"
        )
        assert proc.poll() is None, f"haproxy exited: {proc.stdout.read() if proc.stdout else ''}"
        yield read, apply
    finally:
        stop_process(proc)


@pytest.fixture(scope="module", params=["podman", "haproxy"])
def engine(request: pytest.FixtureRequest, docker_api: Any, image: str, tmp_path_factory: Any) -> Iterator[Engine]:
    if request.param == "podman":
        api = _podman_api()
        _load_image(docker_api, api, image)
        yield Engine("podman", PODMAN_URL, api)
        return
    workdir = tmp_path_factory.mktemp("haproxy")
    with _haproxy(workdir, DOCKER_URL.removeprefix("unix://")) as (read, apply):
        yield Engine("haproxy", f"unix://{apply}", docker_api, read_url=f"unix://{read}")


def _set_host(root: Root, **docker: Any) -> None:
    path = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["docker"].update(docker)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def root(tmp_path: Path, tmpfs_dir: Path, engine: Engine, request: pytest.FixtureRequest) -> Iterator[Root]:
    r = make_root(tmp_path, shm=tmpfs_dir, api=engine.api, name=request.node.name)
    _set_host(r, url=engine.url)
    try:
        yield r
    finally:
        r.cleanup()


def run_unmanaged(r: Root, name: str, *, env: dict[str, str], cmd: list[str]) -> str:
    """A container started outside the tool on the test's engine (through its API, as the docker CLI would), labelled
    for the cleanup only; its id."""
    hc = r.api.create_host_config(binds=["/usr:/usr:ro"], network_mode="host", ipc_mode="host")
    cid = r.api.create_container(
        IMAGE, cmd, name=f"{name}-{r.tag}", environment=env, host_config=hc, labels={TEST_LABEL: r.host}
    )["Id"]
    r.api.start(cid)
    return cid


def apply_ok(r: Root) -> dict[str, Any]:
    res = r.apply()
    assert res.rc == 0 and res.data["result"] == "converged", str(res)
    return res.data


def outcomes(data: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    return [(a["kind"], a["recipe"], a["result"]) for a in data["actions"]]


def holders(status: dict[str, Any], slot: str) -> list[str]:
    return [c["name"] for c in status["slots"][slot]["containers"]]


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


# ---------------------------------------------------------------- the lifecycle on each engine


def test_enter_status_and_leave(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    plan = root.cli("plan", "--json")
    assert plan.rc == 2 and [(a["kind"], a["recipe"]) for a in plan.data["actions"]] == [("enter", omni)], str(plan)

    assert outcomes(apply_ok(root)) == [("enter", omni, "ok")]
    name = root.cname(omni, B)
    assert set(root.running()) == {name}
    assert http_status(f"http://127.0.0.1:{root.port_of(omni)}/health") == 200
    st = root.status()
    assert st["converged"] is True and st["sources"]["docker"] == "ok", st["sources"]
    assert holders(st, B) == [name] and st["slots"][A]["free"] is True
    assert root.cli("plan", "--json").rc == 0

    root.manifest()
    assert outcomes(apply_ok(root)) == [("leave", omni, "ok")]
    assert root.containers() == [], "left: its container is removed"
    assert root.status()["slots"][B]["free"] is True


def test_tp2_offload_lane_its_owners_and_gpu_processes_are_its_container_and_orphans_are_reclaimed(
    root: Root, engine: Engine
) -> None:
    from real.test_e2e_apply import wait_for_no_offload_container
    from reconciler.load.desired import load_desired
    from reconciler.observe.gpu import engine_container_of, observe_gpus

    wait_for_no_offload_container(root.api)
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    root.manifest((lane, [A, B]))
    # Orphans of a crashed start, every page allocated: the enter reclaims them first.
    for i in range(2):
        (root.shm / f"vllm_offload_crashed{i}.mmap").write_bytes(b"\0" * (24 * MIB))
    orphans = set(root.shm_files())
    data = apply_ok(root)
    assert [k for k, _, _ in outcomes(data)] == ["reclaim", "enter"], str(data)
    assert sum(a.get("reclaimed_bytes") or 0 for a in data["actions"]) >= 48 * MIB, str(data)
    assert not orphans & set(root.shm_files())
    name = root.cname(lane, A, B)
    cid = root.running()[name]["Id"]

    # The offload file is mapped by both TP workers, and each is attributed to the lane through its cgroup.
    shm = root.shm_status()
    assert shm["sources"]["proc"] == "ok" and shm["sources"]["docker"] == "ok", shm["sources"]
    files = shm["files"]
    assert len(files) == 1 and files[0]["state"] == "owned", shm["files"]
    mappers = {o["pid"]: o["container"] for o in files[0]["owners"] if o["via"] == "map"}
    assert len(mappers) == 2 and set(mappers.values()) <= {name, cid, cid[:12]}, files[0]["owners"]
    # Safety rule 2 as narrowed: a running offload lane keeps unowned files from reclaim until this install has
    # recorded it healthy and sees it holding its own file; then it blocks nothing.
    from reconciler.store import state

    before = os.environ.get("RECONCILER_STATE_DIR")
    os.environ["RECONCILER_STATE_DIR"] = root.env["RECONCILER_STATE_DIR"]
    try:
        settled = cid in state.read_ownership(root.host).healthy
    finally:
        if before is None:
            del os.environ["RECONCILER_STATE_DIR"]
        else:
            os.environ["RECONCILER_STATE_DIR"] = before
    assert (name in shm["blocking_containers"]) is not settled, (settled, shm["blocking_containers"])

    # GPU processes go through the same attribution (NVML lists host pids): the workers are the lane's when an NVML
    # read lists them on two cards; a host process on a card is no container's.
    from unit.test_gpu_parse import TWO_GPUS

    from reconciler.model import HostConfig

    desired_host = load_desired(root.path).host
    container_of = engine_container_of(desired_host)
    assert {container_of(pid) for pid in mappers} == {cid}
    assert container_of(os.getpid()) is None
    workers = sorted(mappers)
    nvml = {
        **TWO_GPUS,
        "devices": [
            {**d, "processes": [{"pid": pid, "used_gpu_memory": 1 << 30}]}
            for d, pid in zip(TWO_GPUS["devices"], workers, strict=True)
        ],
    }
    nvml["devices"][1]["processes"].append({"pid": os.getpid(), "used_gpu_memory": 1 << 20})
    gpu_host = HostConfig(
        name=root.host, gpus={A: {"index": 0}, B: {"index": 1}}, gpu_telemetry="nvml", docker=desired_host.docker
    )
    view = observe_gpus(gpu_host, read=lambda _h: nvml)
    assert view.reading.ok, view.reading
    assert [(p.pid, p.container_id) for p in view.slots[A].processes] == [(workers[0], cid)]
    assert {(p.pid, p.container_id) for p in view.slots[B].processes} == {(workers[1], cid), (os.getpid(), None)}

    # Leave: the lane's own file goes with it, nothing is left on the tmpfs.
    root.manifest()
    assert next(k for k, _, _ in outcomes(apply_ok(root))) == "leave"
    assert root.shm_files() == [] and root.containers() == []


def test_an_unmanaged_container_on_a_slot_blocks_and_nothing_is_touched(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    squatter = run_unmanaged(
        root, "squatter", env={"NVIDIA_VISIBLE_DEVICES": str(root.slot_index[B])}, cmd=["sleep", "300"]
    )
    before = root.snapshot()
    plan = root.cli("plan", "--json")
    assert plan.rc == 3 and plan.data["blocked"] is True, str(plan)
    assert f"squatter-{root.tag}" in json.dumps(plan.data), str(plan)
    res = root.apply()
    assert res.rc == 3, str(res)
    no_traceback(res.stderr)
    assert root.snapshot() == before, "nothing was created, stopped or removed"
    assert root.api.inspect_container(squatter)["State"]["Running"] is True


def test_a_squatter_podman_is_stopping_still_blocks_its_slot(root: Root, engine: Engine) -> None:
    """Podman's API says "stopping" while a stop's grace period runs; the processes still hold the card then. Under
    gpu_telemetry none the engine's word is all there is: the slot is held until the container has exited."""
    if engine.kind != "podman":
        pytest.skip("the state only Podman reports")
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    squatter = run_unmanaged(
        root,
        "slow-stop",
        env={"NVIDIA_VISIBLE_DEVICES": str(root.slot_index[B])},
        cmd=["sh", "-c", 'trap "sleep 6; exit 0" TERM; sleep 300 & wait'],
    )
    stopper = threading.Thread(target=lambda: root.api.stop(squatter, timeout=30), daemon=True)
    stopper.start()
    wait_until(
        lambda: root.api.inspect_container(squatter)["State"]["Status"] == "stopping", timeout=10, what="stopping"
    )
    plan = root.cli("plan", "--json")
    assert plan.rc == 3 and plan.data["blocked"] is True, str(plan)
    assert f"slow-stop-{root.tag}" in json.dumps(plan.data) and "stopping" in json.dumps(plan.data), str(plan)
    stopper.join(timeout=30)
    assert root.api.inspect_container(squatter)["State"]["Status"] in ("exited", "stopped")
    plan = root.cli("plan", "--json")
    assert plan.rc == 2 and plan.data["blocked"] is False, str(plan)


# ---------------------------------------------------------------- Podman only


@pytest.fixture
def cdi_gpus(engine: Engine) -> Iterator[list[str]]:
    """Two GPUs by UUID in a CDI spec of their own (kind nvidia.com/gpu): each only sets an env var, so Podman's
    real CDI resolution can be watched without a GPU."""
    if engine.kind != "podman":
        pytest.skip("CDI device names are how Podman is given GPUs")
    gpus = [f"GPU-{uuid.uuid4()}" for _ in range(2)]
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": g, "containerEdits": {"env": [f"RECONCILER_TEST_CDI_GPU_{i}={g}"]}} for i, g in enumerate(gpus)
        ],
    }
    path = Path("/var/run/cdi") / f"reconciler-test-{gpus[0][4:12]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    try:
        yield gpus
    finally:
        path.unlink()


def test_podman_is_given_gpus_by_cdi_name(root: Root, cdi_gpus: list[str]) -> None:
    doc = yaml.safe_load((root.path / "configs" / "host.yaml").read_text())
    doc["gpus"] = {A: {"uuid": cdi_gpus[0]}, B: {"uuid": cdi_gpus[1]}}
    doc["docker"]["gpu_requests"] = True
    (root.path / "configs" / "host.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    assert outcomes(apply_ok(root)) == [("enter", omni, "ok")]
    info = root.api.inspect_container(root.cname(omni, B))
    env = info["Config"]["Env"]
    assert f"RECONCILER_TEST_CDI_GPU_1={cdi_gpus[1]}" in env, env  # Podman resolved nvidia.com/gpu=<UUID>
    assert not any(e.startswith("RECONCILER_TEST_CDI_GPU_0=") for e in env), "only its own card"
    st = root.status()
    assert holders(st, B) == [root.cname(omni, B)] and st["slots"][A]["free"] is True
    assert root.cli("plan", "--json").rc == 0, "the container Podman made is the one the recipe asks for"


def test_podman_events_the_loop_follows(engine: Engine, image: str) -> None:
    """The loop's event filter on Podman: a start, a die and a remove (Podman's word for Docker's destroy)."""
    from reconciler.host.engine.protocol import EVENT_ACTIONS, GONE_ACTIONS
    from reconciler.plan.observed import ENDED_STATES

    if engine.kind != "podman":
        pytest.skip("Podman's events")
    api = engine.api
    since = int(time.time()) - 1
    # Host networking, as the other containers here: Podman 5's default network needs nft (netavark's nftables
    # backend), which its set-up without recommends does not bring; the events do not depend on the network.
    hc = api.create_host_config(binds=["/usr:/usr:ro"], network_mode="host")
    cid = api.create_container(IMAGE, ["true"], host_config=hc, labels={TEST_LABEL: "events"})["Id"]
    try:
        api.start(cid)
        # "stopped" is Podman's word for a container whose process ended before its clean-up ran (nested in another
        # container, the clean-up can lag or fail): ended, as ContainerView reads it.
        wait_until(lambda: api.inspect_container(cid)["State"]["Status"] in ENDED_STATES, timeout=20, what="exit")
    finally:
        api.remove_container(cid, force=True)

    def seen() -> list[str]:
        return [
            ev.get("status") or ev.get("Action")
            for ev in api.events(
                since=since,
                until=int(time.time()) + 1,
                decode=True,
                filters={"type": "container", "event": list(EVENT_ACTIONS)},
            )
            if ev.get("id") == cid
        ]

    # Podman writes its event log after the fact: on a loaded machine the last events come a moment later.
    got = wait_until(
        lambda: s if "start" in (s := seen()) and "die" in s and set(s) & GONE_ACTIONS else None,
        timeout=20,
        what="Podman's start, die and remove events",
        every=0.5,
    )
    assert got, got


# ---------------------------------------------------------------- a proxy's allow-list


def test_a_denied_endpoint_is_a_clear_error_naming_it(root: Root, engine: Engine) -> None:
    """Through the read-only socket of the shipped config: the reads work, apply's first write is refused, and the
    error names the refused call (no traceback, no hang)."""
    if engine.kind != "haproxy":
        pytest.skip("the proxy's allow-list")
    _set_host(root, url=engine.read_url)
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    plan = root.cli("plan", "--json")
    assert plan.rc == 2, str(plan)
    assert root.status()["sources"]["docker"] == "ok"
    t0 = time.monotonic()
    res = root.cli("apply", "--yes")
    assert time.monotonic() - t0 < 60
    assert res.rc == 1, str(res)
    no_traceback(res.stdout + res.stderr)
    assert "refused POST /containers/create (403)" in res.stdout + res.stderr, str(res)
    assert root.containers() == [], "nothing was created"


# ---------------------------------------------------------------- slow is not down


def _silent_engine(path: Path) -> socket.socket:
    """A unix socket that accepts and reads, and never answers: an engine too busy to answer in time."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.fixture
def bare_root(tmp_path: Path, tmpfs_dir: Path, docker_api: Any, request: pytest.FixtureRequest) -> Iterator[Root]:
    r = make_root(tmp_path, shm=tmpfs_dir, api=docker_api, name=request.node.name)
    try:
        yield r
    finally:
        r.cleanup()


def test_a_slow_engine_and_a_dead_one_read_differently_everywhere(bare_root: Root, tmp_path: Path) -> None:
    r = bare_root
    omni = r.recipe("omni")
    r.manifest((omni, [B]))
    srv = _silent_engine(tmp_path / "slow.sock")
    dead = tmp_path / "dead.sock"
    try:
        for url, words, state in (
            (f"unix://{tmp_path / 'slow.sock'}", "answered too slowly (1 s", "slow"),
            (f"unix://{dead}", "does not answer", "down"),
        ):
            _set_host(r, url=url, timeout_s=1)
            st = r.cli("status", "--json")
            assert words in st.data["sources"]["docker"], st
            res = r.cli("apply", "--yes")
            assert res.rc == 1 and words in res.stderr, str(res)
            no_traceback(res.stderr)
            if state == "slow":
                assert "docker.timeout_s" in res.stderr, res.stderr
            else:
                assert "Start the Docker engine, or fix docker.url" in res.stderr, res.stderr

            lp = LoopProcess(r)
            try:
                down = lp.wait("source-down", source="docker", timeout=30)[0]
                assert words in down["detail"], down
                wait_until(
                    lambda lp=lp, state=state: lp.metric("reconciler_source_state", source="docker", state=state) == 1,
                    timeout=10,
                    what=f"source_state {state}",
                )
                assert lp.metric("reconciler_source_up", source="docker") == 0
                others = {"slow", "down", "ok"} - {state}
                assert all(lp.metric("reconciler_source_state", source="docker", state=s) == 0 for s in others)
                code, health = lp.healthz()
                # /healthz answers without a token: the short cause, never the engine's words.
                assert code == 503 and health["unavailable"] == {"docker": state}, health
            finally:
                lp.signal(signal.SIGTERM)
                assert lp.stop(timeout=30) == 0
    finally:
        srv.close()
