"""A process is attributed to its container through /proc/PID/cgroup, confirmed against a real Docker engine.

A busybox container is started, its host pid taken from the engine, and ``container_of_pid`` must name the
same container id from /proc and the engine's container list, whatever cgroup driver and version the engine
uses, and whether or not the engine itself runs in a container (then the path also names the outer container,
which this engine does not list). A second test nests a cgroup inside a real container, as an engine running in
it does, and checks that the engine's own container is the owner. Marked ``docker``: needs a running engine
(CI starts one; see the ``docker_api`` fixture).
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe.containers import EngineObserver
from reconciler.observe.procfs import container_of_pid, parse_cgroup_container_ids, read_cgroup

pytestmark = pytest.mark.docker

IMAGE = "reconciler-test-busybox:cgroup"
DOCKER_URL = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock")


def _busybox_tar() -> bytes:
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("no busybox binary to build the test image from (apt-get install busybox-static)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for name in ("sh", "sleep"):
            link = tarfile.TarInfo(f"bin/{name}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return buf.getvalue()


def _run_busybox(docker_api: Any, cmd: list[str]) -> str:
    if not any(IMAGE in (img.get("RepoTags") or []) for img in docker_api.images()):
        repo, tag = IMAGE.split(":")
        docker_api.import_image_from_data(_busybox_tar(), repository=repo, tag=tag)
    cid: str = docker_api.create_container(IMAGE, cmd, labels={"io.reconciler.test": "cgroup"})["Id"]
    try:
        docker_api.start(cid)
    except Exception:
        docker_api.remove_container(cid, force=True)
        raise
    return cid


@pytest.fixture(scope="module")
def container(docker_api: Any) -> Iterator[dict[str, Any]]:
    """A running busybox container (the image is imported from the host's busybox): its inspect."""
    cid = _run_busybox(docker_api, ["sleep", "120"])
    try:
        yield docker_api.inspect_container(cid)
    finally:
        docker_api.remove_container(cid, force=True)


def test_a_container_pid_is_attributed_to_its_container(container: dict[str, Any]) -> None:
    pid = int(container["State"]["Pid"])
    assert pid > 0
    text = read_cgroup(pid)
    assert text, f"/proc/{pid}/cgroup unreadable"
    candidates = parse_cgroup_container_ids(text)
    # Innermost first: the container itself, then (where this engine runs in a container) the outer one.
    assert candidates[0] == container["Id"], text
    known = EngineObserver(DOCKER_URL).container_ids()
    assert container["Id"] in known
    assert container_of_pid(pid, known) == container["Id"], text
    # Any outer id on the path is not this engine's and never the answer.
    assert not set(candidates[1:]) & known
    assert container_of_pid(pid, frozenset()) is None


def _cgroup_mounts() -> dict[str, tuple[str, str]]:
    """Controllers as /proc/PID/cgroup names them ("" for v2) -> (mount point, mount root) of this namespace."""
    out: dict[str, tuple[str, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if rfields[0] == "cgroup2":
            out.setdefault("", (fields[4], fields[3]))
        elif rfields[0] == "cgroup":
            opts = set(rfields[2].split(","))
            names = sorted(o for o in opts if o not in ("rw", "ro") and not o.startswith(("none", "release_agent")))
            out.setdefault(",".join(names), (fields[4], fields[3]))
    return out


def _nest(pid: int, cid: str, inner: str) -> list[Path]:
    """Move ``pid`` into a child cgroup docker/<inner> of its container's cgroup in every hierarchy that has one,
    as an engine running inside that container does for its own containers. The directories made, innermost
    first; skips when this namespace cannot do it."""
    if os.geteuid() != 0:
        pytest.skip("moving a process between cgroups needs root")
    mounts = _cgroup_mounts()
    made: list[Path] = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        key = ",".join(sorted(controllers.split(","))) if controllers else ""
        if cid not in path or key not in mounts or mounts[key][1] != "/":
            continue
        child = Path(mounts[key][0] + path) / "docker" / inner
        try:
            child.mkdir(parents=True)
            made.insert(0, child)
            for name in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset cgroup starts empty and takes no task
                if (child / name).exists() and not (child / name).read_text().strip():
                    (child.parent / name).write_text((child.parent.parent / name).read_text())
                    (child / name).write_text((child.parent / name).read_text())
            (child / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            _unnest(made)
            pytest.skip(f"cannot nest a cgroup in the container here: {exc}")
    if not made:
        pytest.skip(f"no cgroup of the container is reachable in this namespace: {read_cgroup(pid)}")
    return made


def _unnest(made: list[Path]) -> None:
    for d in made:
        for _ in range(50):  # the killed process leaves its cgroup shortly after
            try:
                d.rmdir()
                if d.parent.name == "docker":
                    d.parent.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_a_process_of_a_nested_engine_belongs_to_the_container_this_engine_knows(docker_api: Any) -> None:
    """The nested case with the real engine: a process in docker/<inner> below one of this engine's containers
    (what Docker in Docker makes; tests/data/cgroup holds a real capture) is that container's, and the inner
    id, which this engine does not list, is never presented as a container."""
    cid = _run_busybox(docker_api, ["sh", "-c", "sleep 120 & wait"])
    inner = "e" * 64
    made: list[Path] = []
    child = 0
    try:
        main = int(docker_api.inspect_container(cid)["State"]["Pid"])
        for _ in range(100):
            children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
            if children:
                break
            time.sleep(0.02)
        child = int(children[0])
        made = _nest(child, cid, inner)
        text = read_cgroup(child)
        assert text and f"{cid}/docker/{inner}" in text, text
        candidates = parse_cgroup_container_ids(text)
        assert candidates[:2] == (inner, cid), text
        known = EngineObserver(DOCKER_URL).container_ids()
        assert inner not in known and container_of_pid(child, known) == cid
        # An engine that knows the inner id (the nested one) gets the inner container, not ours.
        assert container_of_pid(child, {inner}) == inner
    finally:
        if made:
            os.kill(child, 9)  # its nested cgroups go first, then the engine removes the container's own
            _unnest(made)
        docker_api.remove_container(cid, force=True)
