"""A card given to a container other than by a GPU request holds its slot, against the real engine: a device node
mapped in (``docker run --device``), known by its device number whatever it is called, and ``--privileged``.
docs/design.md, safety rule 11."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from e2e_helpers import SLEEP, TEST_LABEL, Root, docker_cli

from reconciler.load.desired import load_desired
from reconciler.observe.containers import NVIDIA_MAJOR, PRIVILEGED, EngineObserver

pytestmark = [pytest.mark.docker, pytest.mark.root]


def _card_node(tmp_path: Path, minor: int) -> Path:
    """A character device node numbered as NVIDIA's card ``minor`` is (195:minor), under a name that is no card's:
    the engine maps any node, and only its number says which card it is (no driver is needed for that)."""
    node = tmp_path / "gpu-node"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, minor))
    return node


def test_a_device_node_squatter_blocks_the_enter_on_its_card(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    minor = root.slot_index["dark-compute-b"] % 254  # a card's minor number is below 254
    node = _card_node(tmp_path, minor)
    # No GPU request, no NVIDIA_VISIBLE_DEVICES: the card is mapped in as a device under another name.
    squatter = root.run_unmanaged("squatter", "--device", f"{node}:/dev/accel0", *SLEEP)
    try:
        p = root.cli("plan", "--json")
        assert p.rc == 3, p
        (blocker,) = p.data["blockers"]
        assert blocker["holder"] == squatter and blocker["cause"] == "held", blocker
        # gpu_telemetry none: no minor number is known, so the node may be any slot's card.
        assert f"the device node /dev/nvidia{minor}" in blocker["reason"], blocker
        assert "set gpu_telemetry: nvml" in blocker["reason"], blocker
        res = root.apply()
        assert res.rc == 3 and res.data["actions"] == [], res
        assert root.running() == {}
        assert squatter in {c["Names"][0].lstrip("/") for c in root.unmanaged()}
    finally:
        docker_cli("rm", "-f", squatter, check=False)
    assert root.cli("plan").rc == 2


def test_the_observer_reads_privileged_and_device_nodes_from_the_engine(root: Root, tmp_path: Path) -> None:
    """What the engine answers for ``docker create --privileged`` and ``--device NODE:/dev/accel0`` reaches the
    container's GPU ids through the observer's own inspect (a privileged container cannot start on this kind of
    machine, a container inside a container: created is enough to read what it is given)."""
    node = _card_node(tmp_path, 3)
    names = [f"privileged-{root.tag}", f"renamed-node-{root.tag}"]
    label = ("--label", f"{TEST_LABEL}={root.host}")
    docker_cli("create", "--name", names[0], *label, "--privileged", *SLEEP)
    docker_cli("create", "--name", names[1], *label, "--device", f"{node}:/dev/accel0", *SLEEP)
    try:
        containers, source = EngineObserver.for_host(load_desired(root.path).host).observe()
        assert source.ok, source
        got = {c.name: c.gpu_devices for c in containers if c.name in names}
        assert got == {names[0]: (PRIVILEGED,), names[1]: ("/dev/nvidia3",)}, got
    finally:
        docker_cli("rm", "-f", *names, check=False)
