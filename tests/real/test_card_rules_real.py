"""A card held through a device cgroup rule, or by a process that opened its node, is held: against the real engine
and the real /proc. docs/design.md, safety rule 11.

No NVIDIA driver is needed: a node numbered 195:N is made with ``mknod`` (by the test on the host, or by the
container inside itself, which Docker's default device rules and capabilities allow). Without the driver such a node
cannot be opened for reading or writing (ENXIO), so the holder opens it ``O_PATH``: the descriptor still refers to
the node, and the scan judges a descriptor by the device number its stat gives, whatever path it was opened under,
as it must for a process that opened a card for real.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import IMAGE, SLEEP, Root, docker_cli, shm_config, wait_until

from reconciler.observe.holder_scan import scan_holders
from reconciler.observe.procfs import NVIDIA_MAJOR
from reconciler.observe.shm import inspect_shm
from reconciler.plan.observed import NodeHolder, Reading

# A container process that makes a card's node inside itself and holds it open, then sleeps.
_MKNOD_AND_HOLD = (
    "import os, time; os.mknod('/dev/nvidia1', 0o20600, os.makedev(195, 1)); "
    "fd = os.open('/dev/nvidia1', os.O_PATH); time.sleep(300)"
)


def _node(tmp_path: Path, name: str, minor: int) -> Path:
    node = tmp_path / name
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, minor))
    return node


def _holder(node: Path) -> subprocess.Popen[bytes]:
    """A child that holds ``node`` open (O_PATH: see the module's docstring) and says so once it does."""
    code = f"import os, sys, time; fd = os.open({str(node)!r}, os.O_PATH); print('held', flush=True); time.sleep(300)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"held\n"
    return child


def test_a_process_holding_a_card_node_open_is_named_by_pid(tmp_path: Path) -> None:
    """A child that opened a node 195:3 (made under a name that is no card's) is read by the /proc scan of every
    pass as holding card 3, with one worker or several; one holding nvidiactl's number (195:255) holds no card."""
    card = _holder(_node(tmp_path, "accel", 3))
    ctl = _holder(_node(tmp_path, "ctl", 255))
    try:
        dev = os.stat(tmp_path).st_dev
        for workers in (1, 3):
            scan = scan_holders(dev, workers=workers)
            assert scan.cards.get(card.pid) == {3}, (workers, scan.cards)
            assert ctl.pid not in scan.cards, scan.cards
        # Through the shm inspection every pass makes: named by pid and command, in no container.
        found: list[tuple[NodeHolder, ...]] = []
        shm = tmp_path / "shm"
        shm.mkdir()
        inspect_shm(shm_config(shm), containers=(), docker=Reading("docker", True), on_cards=found.append)
        (holders,) = found
        mine = [h for h in holders if h.pid == card.pid]
        assert [(h.minor, h.container_id) for h in mine] == [(3, None)], holders
        assert "os.O_PATH" in mine[0].command
        assert not [h for h in holders if h.pid == ctl.pid]
    finally:
        for child in (card, ctl):
            child.kill()
            child.wait()


@pytest.mark.docker
@pytest.mark.root
def test_a_device_cgroup_rule_with_mknod_blocks_the_enter(root: Root) -> None:
    """``docker run --device-cgroup-rule 'c 195:* rmw'`` and a node made inside by mknod (CAP_MKNOD is in Docker's
    default set): the container asks for no GPU and maps no device, yet it can open any card; plan is blocked
    naming it, and apply enters nothing."""
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    assert root.cli("plan").rc == 2  # free: the enter is planned
    squatter = root.run_unmanaged(
        "rule-squatter",
        "--device-cgroup-rule",
        "c 195:* rmw",
        "-v",
        "/usr:/usr:ro",
        IMAGE,
        "python3",
        "-c",
        _MKNOD_AND_HOLD,
    )
    try:
        p = root.cli("plan", "--json")
        assert p.rc == 3, p
        (blocker,) = p.data["blockers"]
        assert blocker["holder"] == squatter and blocker["cause"] == "held", blocker
        assert "a device cgroup rule lets it open every card's node" in blocker["reason"], blocker
        res = root.apply()
        assert res.rc == 3 and res.data["actions"] == [], res
        assert root.running() == {}
    finally:
        docker_cli("rm", "-f", squatter, check=False)
    assert root.cli("plan").rc == 2


@pytest.mark.docker
@pytest.mark.root
def test_a_device_cgroup_rule_with_a_node_bound_in_blocks_and_alone_does_not(root: Root, tmp_path: Path) -> None:
    """The rule with a card's node bound in (``-v NODE:/dev/nvidia1``, CAP_MKNOD dropped) holds that card, named by
    its node; the same rule with no node and no CAP_MKNOD opens nothing and holds nothing."""
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    node = _node(tmp_path, "gpu-node", 1)
    rule = ("--device-cgroup-rule", "c 195:* rmw", "--cap-drop", "MKNOD")
    bound = root.run_unmanaged("rule-bound", *rule, "-v", f"{node}:/dev/nvidia1", *SLEEP)
    alone = root.run_unmanaged("rule-alone", *rule, *SLEEP)
    try:
        p = root.cli("plan", "--json")
        assert p.rc == 3, p
        (blocker,) = p.data["blockers"]
        assert blocker["holder"] == bound, blocker
        # gpu_telemetry none: no minor number is known, so the node may be any slot's card.
        assert "the device node /dev/nvidia1" in blocker["reason"], blocker
    finally:
        docker_cli("rm", "-f", bound, check=False)
    try:
        assert root.cli("plan").rc == 2  # the rule alone: no card
    finally:
        docker_cli("rm", "-f", alone, check=False)


@pytest.mark.docker
@pytest.mark.root
def test_a_container_process_holding_a_card_node_blocks_whatever_its_configuration(root: Root) -> None:
    """A container with no GPU request, no device and no cgroup rule makes a card's node (Docker's default device
    rules let any container make one) and holds it open: its configuration gives it no card, the /proc scan finds
    the descriptor, and plan is blocked naming the pid and the container."""
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    holder = root.run_unmanaged("node-holder", "-v", "/usr:/usr:ro", IMAGE, "python3", "-c", _MKNOD_AND_HOLD)
    try:
        pid = int(docker_cli("inspect", "-f", "{{.State.Pid}}", holder).stdout.strip())

        def opened() -> bool:
            fds = Path(f"/proc/{pid}/fd")
            return any(os.major(os.stat(f).st_rdev) == NVIDIA_MAJOR for f in fds.iterdir() if f.exists())

        wait_until(opened, timeout=30, what="the container's process to hold the node open")
        p = root.cli("plan", "--json")
        assert p.rc == 3, p
        (blocker,) = p.data["blockers"]
        assert blocker["holder"] == f"pid {pid}", blocker
        assert f"in container {holder}" in blocker["reason"], blocker
        assert "holds /dev/nvidia1 open" in blocker["reason"], blocker
        st = root.cli("status", "--json")
        assert st.data["converged"] is False, st
        shown = st.data["slots"]["dark-compute-b"]
        assert [(n["pid"], n["container"]) for n in shown["node_holders"]] == [(pid, holder)], shown
        assert shown["free"] is False, shown
        assert f"pid {pid} holds /dev/nvidia1 open" in root.cli("status").stdout
    finally:
        docker_cli("rm", "-f", holder, check=False)
    assert root.cli("plan").rc == 2
