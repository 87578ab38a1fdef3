"""``reconciler init --no-gpu`` (reconciler/load/init_stand_in.py): a root whose recipes run on the stand-in vLLM image,
so a newcomer can write and apply recipes of their own on a machine without a GPU. Written by the command line into
a temporary directory, applied on the real engine, and found converged, its lanes answering their probes."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from reconciler.load.init_stand_in import STAND_IN_RECIPES, STAND_IN_SLOTS
from reconciler.observe.machine import Card, Engine, Machine
from reconciler.service.init_root import init_root

REPO = Path(__file__).resolve().parents[2]
ENGINE = Engine("unix:///var/run/docker.sock", "Docker Engine", "27.0.1", "the default socket")
H200 = Card(0, "GPU-c0b62778-fa04-78c1-0cfd-cea75364fc73", "NVIDIA H200", 150754820096, 612 << 20)


def _cli(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _empty_root(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o755)
    return tmp_path / "try"


def _demo_ports() -> set[int]:
    ports = set()
    for f in [
        *(REPO / "examples/demo/configs/recipes").glob("*.toml"),
        *(REPO / "examples/demo/sleeping").glob("*.toml"),
    ]:
        cmd = tomllib.loads(f.read_text())["container"]["command"]
        ports.add(int(cmd[cmd.index("--port") + 1]))
    return ports


def test_a_gpu_host_given_no_gpu_gets_the_stand_in_root_clear_of_the_demo(tmp_path: Path) -> None:
    """Even where NVML lists a card, --no-gpu writes stand-in slots under gpu_telemetry none, recipes of the stand-in
    image with what it needs (the host's /usr, a short settle, a port each), none of the demo's slots or ports."""
    root = _empty_root(tmp_path)
    result = init_root(root, machine=Machine(cards=(H200,), driver="570.86", engines=(ENGINE,)), no_gpu=True)
    assert result.host == "try" and result.to_json()["gpu_telemetry"] == "none"
    host = yaml.safe_load((root / "configs/host.yaml").read_text())
    assert host["gpu_telemetry"] == "none" and host["docker"]["gpu_requests"] is False
    assert {s: g["index"] for s, g in host["gpus"].items()} == STAND_IN_SLOTS
    assert not {g["index"] for g in host["gpus"].values()} & {0, 1}, "the demo's slots are indexes 0 and 1"
    ports = []
    for name in STAND_IN_RECIPES:
        recipe = tomllib.loads((root / f"configs/recipes/{name}.toml").read_text())
        c = recipe["container"]
        assert c["image"] == "reconciler/fake-vllm:latest" and "/usr:/usr:ro" in c["volumes"]
        assert recipe["health"]["settle_s"] <= 1 and c["network"] == "host"
        port = int(c["command"][c["command"].index("--port") + 1])
        assert recipe["health"]["url"] == f"http://127.0.0.1:{port}/health"
        ports.append(port)
    assert len(set(ports)) == len(ports) and not set(ports) & _demo_ports(), ports
    assert (root / "configs/recipes/TEMPLATE.toml.example").exists()
    done = _cli(root, "validate")
    assert done.returncode == 0 and "valid: host try, 2 recipe(s), 2 assignment(s)" in done.stdout, done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _own(root: Path, docker_api) -> tuple[str, dict[str, int]]:  # type: ignore[no-untyped-def]
    """Give the root written by init identifiers of this test's own, as tests/e2e_helpers.py's make_root does for the
    demo's: its host name, recipe names (container names are engine-wide), GPU indexes and ports. Nothing else of
    what init wrote is changed. Returns the host and recipe -> port."""
    tag = uuid.uuid4().hex[:6]
    host = f"e2e-no-gpu-{tag}"
    claimed: set[str] = set()
    for c in docker_api.containers():
        claimed.update(((c.get("Labels") or {}).get("io.reconciler.gpus") or "").split(","))
    base = 64 + 2 * random.randrange(480)
    while str(base) in claimed or str(base + 1) in claimed:
        base = 64 + 2 * random.randrange(480)
    host_file = root / "configs/host.yaml"
    text = host_file.read_text().replace("name: try\n", f"name: {host}\n")
    for n, index in enumerate(STAND_IN_SLOTS.values()):
        text = text.replace(f"{{index: {index}}}", f"{{index: {base + n}}}")
    host_file.write_text(text)
    manifest = (root / "manifests/try.yaml").read_text().replace("host: try\n", f"host: {host}\n")
    ports = {}
    for name, (_slot, port) in STAND_IN_RECIPES.items():
        mine = f"{name}-{tag}"
        ports[mine] = _free_port()
        recipe = root / f"configs/recipes/{name}.toml"
        (root / f"configs/recipes/{mine}.toml").write_text(recipe.read_text().replace(str(port), str(ports[mine])))
        recipe.unlink()
        manifest = manifest.replace(f"recipe: {name}\n", f"recipe: {mine}\n")
    (root / "manifests/try.yaml").unlink()
    (root / f"manifests/{host}.yaml").write_text(manifest)
    return host, ports


@pytest.fixture
def tried(tmp_path: Path, docker_api, image: str) -> Iterator[tuple[Path, str, dict[str, int], dict[str, str]]]:  # type: ignore[no-untyped-def]
    root = _empty_root(tmp_path)
    env = {
        **os.environ,
        "RECONCILER_STATE_DIR": str(tmp_path / "state"),
        "RECONCILER_LOCK_DIR": str(tmp_path / "lock"),
        "NO_COLOR": "1",
    }
    env.pop("RECONCILER_ROOT", None)
    url = os.environ.get("RECONCILER_TEST_DOCKER_URL")
    if url:
        env["DOCKER_HOST"] = url
    written = _cli(root, "init", "--no-gpu", env=env)
    assert written.returncode == 0, written.stdout + written.stderr
    assert "wrote in" in written.stdout and "(host try)" in written.stdout and "apply" in written.stdout
    host, ports = _own(root, docker_api)
    try:
        yield root, host, ports, env
    finally:
        for c in docker_api.containers(all=True, filters={"label": f"io.reconciler.host={host}"}):
            with contextlib.suppress(Exception):
                docker_api.remove_container(c["Id"], force=True, v=True)


def test_the_stand_in_root_applies_and_converges_on_the_real_engine(tried) -> None:  # type: ignore[no-untyped-def]
    root, host, ports, env = tried
    applied = _cli(root, "apply", "--yes", "--json", env=env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert json.loads(applied.stdout)["result"] == "converged", applied.stdout
    plan = _cli(root, "plan", env=env)
    assert plan.returncode == 0 and "No changes: the host matches the manifest." in plan.stdout, plan.stdout
    status = json.loads(_cli(root, "status", "--json", env=env).stdout)
    running = {c["recipe"] for c in status["containers"] if c.get("state") == "running"}
    assert running == set(ports), status["containers"]
    for recipe, port in ports.items():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            served = [m["id"] for m in json.load(r)["data"]]
        assert served == [f"try/{recipe.rsplit('-', 1)[0]}"], served
        probe = _cli(root, "probe", recipe, env=env)
        assert probe.returncode == 0 and "2/2 probe(s) passed" in probe.stdout, probe.stdout + probe.stderr
    # And back: an empty manifest leaves them, as the tutorial does.
    (root / f"manifests/{host}.yaml").write_text(f"host: {host}\nassignments: []\n")
    left = _cli(root, "apply", "--yes", env=env)
    assert left.returncode == 0, left.stdout + left.stderr
    assert _cli(root, "plan", env=env).returncode == 0
