"""The cards a container's device cgroup rules give it, with the card nodes it can reach: the pure parse of
``HostConfig.DeviceCgroupRules``, the binds and mounts, ``CapAdd``/``CapDrop``, and /proc/devices. docs/design.md,
safety rule 11."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.observe.containers import gpu_devices_of
from reconciler.observe.device_rules import (
    DEVICE_RULE,
    bind_pairs,
    can_mknod,
    nvidia_majors,
    parse_proc_devices,
    rule_cards,
    rule_reach,
    rules_reach,
)

DATA = Path(__file__).resolve().parents[1] / "data"
PROC_DEVICES = (DATA / "proc" / "devices-nvidia.txt").read_text()


def inspect(rules: list[str], *, binds: list[str] | None = None, drop: list[str] | None = None, **more: Any) -> Any:
    host_config = {"DeviceCgroupRules": rules, "Binds": binds, "CapDrop": drop, **more.pop("host_config", {})}
    return {"Name": "/x", "Config": {"Env": []}, "HostConfig": host_config, **more}


def test_proc_devices_names_the_card_major_and_nvidia_uvm() -> None:
    devices = parse_proc_devices(PROC_DEVICES)
    assert devices["nvidia"] == 195 and devices["nvidia-uvm"] == 508 and devices["mem"] == 1
    assert "loop" not in devices  # a block device: no character node has its number
    assert nvidia_majors(PROC_DEVICES) == (frozenset({195}), 508)
    # An older driver names the card's major nvidia-frontend; without the driver, 195 stays the card's.
    assert nvidia_majors("Character devices:\n195 nvidia-frontend\n") == (frozenset({195}), None)
    assert nvidia_majors("") == (frozenset({195}), None)


@pytest.mark.parametrize(
    ("rule", "reach"),
    [
        ("c 195:* rmw", None),
        ("c 195:1 rw", frozenset({1})),
        ("c 195:3 r", frozenset({3})),
        ("a", None),
        ("a *:* rwm", None),
        ("c *:* rwm", None),
        ("c *:1 w", frozenset({1})),
        ("c 195:255 rw", frozenset()),  # nvidiactl: no card
        ("c 195:254 rw", frozenset()),  # nvidia-modeset: no card
        ("c 195:* m", frozenset()),  # make the node, never open it
        ("b 195:* rwm", frozenset()),  # a block device of that number is no card
        ("c 508:* rwm", frozenset()),  # nvidia-uvm alone: no card's node opens
        ("c 1:3 rwm", frozenset()),
        ("nonsense", None),  # unreadable: may be any (fail closed)
    ],
)
def test_what_one_rule_reaches(rule: str, reach: frozenset[int] | None) -> None:
    majors, _uvm = nvidia_majors(PROC_DEVICES)
    assert rule_reach(rule, majors) == reach


def test_rules_reach_together() -> None:
    assert rules_reach(["c 195:1 rw", "c 195:2 rw", "c 508:* rwm"]) == frozenset({1, 2})
    assert rules_reach(["c 195:1 rw", "c 195:* rwm"]) is None
    assert rules_reach([]) == frozenset()


def test_capabilities() -> None:
    assert can_mknod({})  # Docker's default set has CAP_MKNOD
    assert not can_mknod({"CapDrop": ["CAP_MKNOD"]})  # as Docker 20.10 writes it
    assert not can_mknod({"CapDrop": ["MKNOD"]})
    assert not can_mknod({"CapDrop": ["ALL"]})
    assert can_mknod({"CapDrop": ["ALL"], "CapAdd": ["CAP_MKNOD"]})
    assert can_mknod({"CapDrop": ["NET_RAW"]})
    # The engine's own list decides where it gives one (Podman's EffectiveCaps; its default set has no MKNOD).
    assert not can_mknod({}, ["CAP_CHOWN", "CAP_KILL"])
    assert can_mknod({"CapDrop": ["MKNOD"]}, ["CAP_MKNOD"])


def test_binds_and_mounts_are_read() -> None:
    got = bind_pairs(
        {
            "HostConfig": {
                "Binds": ["/dev/nvidia1:/dev/nvidia1", "/srv/m:/models:ro"],
                "Mounts": [{"Type": "bind", "Source": "/a", "Target": "/b"}, {"Type": "volume", "Source": "v"}],
            },
            "Mounts": [{"Type": "bind", "Source": "/c", "Destination": "/d"}, {"Type": "tmpfs", "Destination": "/t"}],
        }
    )
    assert got == [("/dev/nvidia1", "/dev/nvidia1"), ("/srv/m", "/models"), ("/a", "/b"), ("/c", "/d")]


def test_a_rule_with_a_card_node_bound_in_gives_that_card() -> None:
    no_mknod = ["CAP_MKNOD"]
    assert rule_cards(inspect(["c 195:* rmw"], binds=["/dev/nvidia1:/dev/nvidia1"], drop=no_mknod)) == ["/dev/nvidia1"]
    # Known by the name in the container too, and by the node's number the observer read on the host.
    assert rule_cards(inspect(["c 195:* rmw"], binds=["/srv/n:/dev/nvidia2"], drop=no_mknod)) == ["/dev/nvidia2"]
    assert rule_cards(
        inspect(["c 195:* rmw"], binds=["/srv/n:/opt/x"], drop=no_mknod, BoundNodes=["/dev/nvidia3"])
    ) == ["/dev/nvidia3"]
    # The rule reaches card 1 only: a node of card 2 bound in opens nothing.
    assert rule_cards(inspect(["c 195:1 rw"], binds=["/dev/nvidia2:/dev/nvidia2"], drop=no_mknod)) == []
    assert rule_cards(inspect(["c 195:1 rw"], binds=["/dev/nvidia1:/dev/nvidia1"], drop=no_mknod)) == ["/dev/nvidia1"]


def test_a_rule_without_a_node_gives_no_card() -> None:
    assert rule_cards(inspect(["c 195:* rmw"], drop=["ALL"])) == []
    assert rule_cards(inspect(["c 195:* rmw"], binds=["/srv/models:/models"], drop=["MKNOD"])) == []
    # A node bound in without a rule that opens it: nothing either (--device gives its own rule, read elsewhere).
    assert rule_cards(inspect([], binds=["/dev/nvidia1:/dev/nvidia1"])) == []
    assert rule_cards(inspect(["c 508:* rwm"], binds=["/dev:/dev"])) == []  # nvidia-uvm's major alone


def test_dev_bound_in_or_mknod_gives_every_card_the_rule_reaches() -> None:
    assert rule_cards(inspect(["c 195:* rmw"], binds=["/dev:/dev"], drop=["ALL"])) is None
    assert rule_cards(inspect(["c *:* rwm"], binds=["/:/host"], drop=["ALL"])) is None
    assert rule_cards(inspect(["a"], binds=["/dev/:/dev"], drop=["ALL"])) is None
    # CAP_MKNOD (Docker's default): any node can be made inside.
    assert rule_cards(inspect(["c 195:* rmw"])) is None
    # Where the rule names the card, that card alone, resolved like a --device node.
    assert rule_cards(inspect(["c 195:1 rw"], binds=["/dev:/dev"])) == ["/dev/nvidia1"]
    assert rule_cards(inspect(["c 195:1 rw", "c 195:4 r"])) == ["/dev/nvidia1", "/dev/nvidia4"]


@pytest.mark.parametrize(
    ("name", "devices"),
    [
        ("cgroup-rule-node-bound.json", ("/dev/nvidia1",)),
        ("cgroup-rule-dev-bound.json", (DEVICE_RULE,)),
        ("cgroup-rule-mounted-node.json", ("/dev/nvidia1",)),
    ],
)
def test_captured_engine_answers(name: str, devices: tuple[str, ...]) -> None:
    """Inspects captured from Docker 20.10 (tests/data/docker/README.md) reach the container's GPU ids."""
    assert gpu_devices_of(json.loads((DATA / "docker" / name).read_text())) == devices
