"""The tool as an image (Containerfile): built here from a local base (the stock Debian 12 root of tests/fresh, whose
python3 has no pip) with no network in the build, the wheel and its dependencies' wheels in its context, and run as
the ``docker run`` line of docs/how-to/image.md says (--pid=host, the engine's socket, the shm dir, the root at /etc/reconciler,
the host's lock and state directories). A small root converges through the image, and the image's ``shm status``,
``plan`` and ``status`` give the verdicts the host-side command gives: the same files with the same states, held by
the same pids of the same containers (a lane's worker attributed to its container, a host process to none), read
from the host's /proc by a process in a container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import MIB, Root, docker_cli, make_file

REPO = Path(__file__).resolve().parents[2]
TAG = "reconciler/reconciler-test:local"
_SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


def _base() -> str:
    """The stock Debian 12 image of tests/fresh (built there with debootstrap, cached by its label)."""
    script = f". {REPO}/tests/fresh/lib.sh; ensure_image bookworm"
    done = subprocess.run(
        [
            "bash",
            "-c",
            f"set -euo pipefail; here={REPO}/tests/fresh out=/tmp/reconciler-fresh rebuild=no; "
            f'die() {{ echo "$*" >&2; exit 2; }}; {script}',
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tool_image(docker_api: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    ctx = tmp_path_factory.mktemp("image")
    src = ctx / "src"
    shutil.copytree(REPO, src, ignore=_SKIP, symlinks=True)
    dist = ctx / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    base = _base()
    version = docker_cli("run", "--rm", base, "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
    py = version.stdout.strip()
    # The dependencies as wheels for the base's Python, and pip itself (the base has none): the build is offline.
    wheel = next(dist.glob("reconciler-*.whl"))
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(dist),
            "--only-binary=:all:",
            "--python-version",
            py,
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "linux_x86_64",
            str(wheel),
            "pip",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    shutil.copy(REPO / ".dockerignore", ctx / ".dockerignore")
    done = subprocess.run(
        [
            "docker",
            "build",
            "-q",
            "-f",
            str(REPO / "Containerfile"),
            "--build-arg",
            f"BASE={base}",
            "--build-arg",
            "PIP_OPTIONS=--no-index",
            "--network",
            "none",
            "-t",
            TAG,
            str(ctx),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return TAG


def in_image(image: str, root: Root, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``docker run`` line of docs/how-to/image.md for the image, on this root (the test's lock and state directories and its
    tmpfs stand for /run/reconciler, /var/lib/reconciler and /dev/shm, at their own paths)."""
    lock, state = root.env["RECONCILER_LOCK_DIR"], root.env["RECONCILER_STATE_DIR"]
    for d in (lock, state):
        os.makedirs(d, mode=0o700, exist_ok=True)
    return subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--pid=host",
            "--cgroupns=host",
            "--network=host",
            "--cap-add",
            "SYS_PTRACE",
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
            "-v",
            f"{root.shm}:{root.shm}",
            "-v",
            f"{root.path}:/etc/reconciler:ro",
            "-v",
            f"{lock}:{lock}",
            "-v",
            f"{state}:{state}",
            "-e",
            f"RECONCILER_LOCK_DIR={lock}",
            "-e",
            f"RECONCILER_STATE_DIR={state}",
            "-e",
            "NO_COLOR=1",
            image,
            "--root",
            "/etc/reconciler",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def host_holder(root: Root) -> Iterator[tuple[int, Path]]:
    """A plain host process (no container) that maps a pattern file of the tmpfs."""
    path = root.shm / "vllm_offload_hostheld.mmap"
    make_file(path, 2 * MIB)
    code = (
        "import mmap, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
        "m = mmap.mmap(fd, 0)\nos.close(fd)\nprint('ready', flush=True)\ntime.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield proc.pid, path
    finally:
        proc.kill()
        proc.wait()


def verdicts(shm: dict[str, Any], tag: str) -> dict[str, Any]:
    """What shm status decides about this root's tmpfs. Of the offload containers that block a reclaim (any on the
    engine), only this root's (named with its tag): another test's may start or stop between the two reads."""
    return {
        "sources": shm["sources"],
        "blocking": sorted(c for c in shm["blocking_containers"] if tag in c),
        "files": sorted(
            (f["path"], f["state"], sorted((o["pid"], o["container"], o["via"]) for o in f["owners"]))
            for f in shm["files"]
        ),
    }


@pytest.mark.docker
@pytest.mark.root
def test_the_image_converges_a_root_and_reads_shm_as_the_host_side_command(
    root: Root, tool_image: str, host_holder: tuple[int, Path]
) -> None:
    holder_pid, held = host_holder
    lane = root.recipe("deepseek-256k-offload", offload_mib=8)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))

    # Converge through the image: its apply enters the lane.
    applied = in_image(tool_image, root, "apply", "--yes", "--json")
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    assert json.loads(applied.stdout)["result"] in {"changed", "converged"}, applied.stdout
    name = root.cname(lane, "dark-compute-a", "dark-compute-b")
    assert root.running().keys() == {name}
    # The host-side command agrees the host matches (the same install id: the container is this install's).
    here = root.cli("plan", "--json")
    assert here.rc == 0, here
    there = in_image(tool_image, root, "plan", "--json")
    assert there.returncode == 0, there.stdout + there.stderr
    assert json.loads(there.stdout)["actions"] == here.data["actions"] == []

    # A file nothing holds, made now (the enter's reclaim would have removed one made before it).
    orphan = root.shm / "vllm_offload_orphan.mmap"
    make_file(orphan, MIB)
    mine = in_image(tool_image, root, "shm", "status", "--json")
    assert mine.returncode == 0, mine.stdout[-2000:] + mine.stderr[-2000:]
    image_view = verdicts(json.loads(mine.stdout), root.tag)
    host_view = verdicts(root.shm_status(), root.tag)
    assert image_view == host_view
    files = {path: (state, owners) for path, state, owners in host_view["files"]}
    # The lane's file is held by its workers, each attributed to the lane's container; the host's holder to none.
    lane_files = [p for p in files if p not in {str(held), str(orphan)}]
    assert len(lane_files) == 1, files
    state, owners = files[lane_files[0]]
    assert state == "owned" and owners and {c for _, c, _ in owners} == {name}, owners
    state, owners = files[str(held)]  # (Python's mmap keeps a descriptor of its own: via map and fd)
    assert state == "owned" and {(p, c) for p, c, _ in owners} == {(holder_pid, None)}, owners
    assert files[str(orphan)][0] in {"orphan", "blocked"} and files[str(orphan)][1] == []

    st_host = root.status()
    st_image = in_image(tool_image, root, "status", "--json")
    assert st_image.returncode == 0, st_image.stderr
    there_st = json.loads(st_image.stdout)
    # The same verdict (the orphan made above may leave it unconverged: both say so alike).
    assert there_st["converged"] == st_host["converged"]
    assert [(a["kind"], a["paths"]) for a in there_st["plan"]["actions"]] == [
        (a["kind"], a["paths"]) for a in st_host["plan"]["actions"]
    ]
    assert [(c["name"], c["owner"], c["healthy"]) for c in there_st["containers"]] == [
        (c["name"], c["owner"], c["healthy"]) for c in st_host["containers"]
    ]
