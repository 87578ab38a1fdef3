"""Shared fixtures for the real-engine and real-tmpfs tests.

Tests that need Docker take the ``docker_api`` fixture: where no engine answers they are skipped on a developer's
box, but with RECONCILER_REQUIRE_DOCKER=1 (``make test``, CI) a missing engine is a failure, never a skip.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

DOCKER_URL = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock")


def _require_docker() -> bool:
    return os.environ.get("RECONCILER_REQUIRE_DOCKER") == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="session")
def docker_api():  # type: ignore[no-untyped-def]
    import docker

    try:
        api = docker.APIClient(base_url=DOCKER_URL, version="auto", timeout=30)
        api.ping()
    except Exception as exc:  # noqa: BLE001
        if _require_docker():
            pytest.fail(f"a Docker engine is required here and did not answer at {DOCKER_URL}: {exc}")
        pytest.skip(f"no Docker engine at {DOCKER_URL} (make test starts one)")
    return api


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A fresh 64 MiB tmpfs mounted on a temporary directory (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        if _require_docker():
            pytest.fail("tmpfs tests need root (mount -t tmpfs)")
        pytest.skip("tmpfs tests need root")
    yield from _mounted_tmpfs("reconciler-tmpfs-", "64m")


def _mounted_tmpfs(prefix: str, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on a new temporary directory for as long as the generator runs."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


@pytest.fixture(scope="session")
def shared_tmpfs() -> Iterator[Path]:
    """One tmpfs for a whole session's roots that are only validated, never applied (shm.dir must be a tmpfs
    mount point): a fresh 1 GiB one as root (nothing is written to it), else /dev/shm where that is a tmpfs."""
    from reconciler.load.tmpfs import shm_dir_mount_problem

    if os.geteuid() != 0:
        if shm_dir_mount_problem("/dev/shm") is None:
            yield Path("/dev/shm")
            return
        pytest.skip("needs root (mount -t tmpfs) or a tmpfs on /dev/shm")
    yield from _mounted_tmpfs("reconciler-validate-tmpfs-", "1g")


@pytest.fixture(scope="session")
def image(docker_api):  # type: ignore[no-untyped-def]
    """The locally built fake vLLM image (built once, rebuilt only when its sources change)."""
    from e2e_helpers import build_image

    return build_image()


@pytest.fixture
def root(tmp_path: Path, tmpfs_dir: Path, docker_api, image: str, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A root of this test's own (tests/e2e_helpers.py make_root) on a fresh tmpfs; every container of its host and
    every unmanaged one it started are removed afterwards."""
    from e2e_helpers import make_root

    r = make_root(tmp_path, shm=tmpfs_dir, api=docker_api, name=request.node.name)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
def start_loop(root):  # type: ignore[no-untyped-def]
    """Start ``reconciler run`` (tests/e2e_helpers.py LoopProcess) on the test's root, or on ``r``; every loop
    started is SIGTERMed, and killed if it has not exited within 30 s, before the root is cleaned."""
    import signal

    from e2e_helpers import LoopProcess

    loops = []

    def start(*extra: str, r=None):  # type: ignore[no-untyped-def]
        lp = LoopProcess(r or root, *extra)
        loops.append(lp)
        return lp

    try:
        yield start
    finally:
        for lp in loops:
            if lp.proc.poll() is None:
                lp.proc.send_signal(signal.SIGTERM)
        for lp in loops:
            try:
                lp.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                lp.proc.kill()
                lp.proc.wait()


# ---------------------------------------------------------------- markers from the fixtures a test uses

# A test is marked by what it takes, so `-m "not docker"` leaves out every real-engine test, whichever file it is
# in: a fixture that reaches the engine (directly or through another fixture) marks it ``docker``; one that mounts a
# tmpfs marks it ``root``. A module may still mark itself (pytestmark) for what it does without a fixture.
DOCKER_FIXTURES = frozenset({"docker_api", "image", "root", "start_loop"})
ROOT_FIXTURES = frozenset({"tmpfs_dir", "shared_tmpfs", "root"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & DOCKER_FIXTURES:
            item.add_marker(pytest.mark.docker)
        if used & ROOT_FIXTURES:
            item.add_marker(pytest.mark.root)
