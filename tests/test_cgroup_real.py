"""A GPU process is attributed to its container through /proc/PID/cgroup: checked against a real Docker engine.

A busybox container is started, its host pid taken from the engine, and ``container_of_pid`` must name the
same container id from /proc alone, whatever cgroup driver and version the engine uses. Marked ``docker``:
needs a running engine (CI starts one; see the ``docker_api`` fixture).
"""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from reconciler.observe.procfs import container_of_pid, parse_cgroup_container_id, read_cgroup

pytestmark = pytest.mark.docker

IMAGE = "reconciler-test-busybox:cgroup"


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


@pytest.fixture(scope="module")
def container(docker_api: Any) -> Iterator[dict[str, Any]]:
    """A running busybox container (the image is imported from the host's busybox): its inspect."""
    if not any(IMAGE in (img.get("RepoTags") or []) for img in docker_api.images()):
        repo, tag = IMAGE.split(":")
        docker_api.import_image_from_data(_busybox_tar(), repository=repo, tag=tag)
    cid = docker_api.create_container(IMAGE, ["sleep", "120"], labels={"io.reconciler.test": "cgroup"})["Id"]
    try:
        docker_api.start(cid)
        yield docker_api.inspect_container(cid)
    finally:
        docker_api.remove_container(cid, force=True)


def test_a_container_pid_is_attributed_to_its_container(container: dict[str, Any]) -> None:
    pid = int(container["State"]["Pid"])
    assert pid > 0
    text = read_cgroup(pid)
    assert text, f"/proc/{pid}/cgroup unreadable"
    assert container_of_pid(pid) == container["Id"], text
    assert parse_cgroup_container_id(text) == container["Id"]
