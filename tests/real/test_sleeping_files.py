"""The files of sleeping lanes (docs/design.md, sleeping lanes): a recipe's ``[sleep]`` and what it needs (rules 4
and 7), the manifest's ``standby:`` and what it needs (a [sleep] on every lane that sleeps, ports and offload room
for the lanes that are on the host together), each refused by ``validate`` with its file, line and fix."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from e2e_helpers import dump_recipe

from real.test_topologies import manifest, problems
from real.test_topologies import root as root
from reconciler.load.desired import load_desired
from reconciler.model import Recipe

STANDBY = """\
host: demo
topology: split
standby: [split, exclusive]
topologies:
  split:
    - recipe: omni
      gpus: [dark-compute-b]
  exclusive:
    - recipe: big
      gpus: [dark-compute-a, dark-compute-b]
"""


def recipe(root: Path, name: str, *, base: str = "omni", sleep: dict | None = None, **changes: object) -> None:
    data = tomllib.loads((root / "configs" / "recipes" / f"{base}.toml").read_text())
    data.update(changes)
    if sleep is not None:
        data["sleep"] = sleep
    (root / "configs" / "recipes" / f"{name}.toml").write_text(dump_recipe(data))


def sleep_ready(root: Path, name: str, *, port: int, tp: int = 1, **sleep: object) -> None:
    """A copy of the demo's omni as ``name``: its own port, TP, and [sleep] with what it needs."""
    data = tomllib.loads((root / "configs" / "recipes" / "omni.toml").read_text())
    cmd = [a if a != "8001" else str(port) for a in data["container"]["command"]]
    cmd[cmd.index("--tensor-parallel-size") + 1] = str(tp)
    data["tensor_parallel_size"] = tp
    data["container"]["command"] = [*cmd, "--enable-sleep-mode"]
    data["container"]["env"] = {"VLLM_SERVER_DEV_MODE": "1"}
    data["health"]["url"] = f"http://127.0.0.1:{port}/health"
    data["sleep"] = {"level": 1, **sleep}
    (root / "configs" / "recipes" / f"{name}.toml").write_text(dump_recipe(data))


def test_standby_lanes_load_beside_the_running_topology(root: Path) -> None:
    sleep_ready(root, "omni", port=8001)
    sleep_ready(root, "big", port=8003, tp=2)
    manifest(root, STANDBY)
    d = load_desired(root)
    assert d.standby_topologies == ("split", "exclusive")
    assert [(a.recipe, a.slots) for a in d.standby] == [("big", ("dark-compute-a", "dark-compute-b"))]
    assert d.recipes["big"].sleep is not None and d.recipes["big"].sleep.level == 1


def test_sleep_does_not_change_a_recipes_hash(root: Path) -> None:
    """[sleep] says how the lane is managed, not what runs: adding it never recreates a running lane."""
    sleep_ready(root, "omni", port=8001)
    before = load_desired(root).recipes["omni"].content_hash()
    data = tomllib.loads((root / "configs" / "recipes" / "omni.toml").read_text())
    data["sleep"] = {"level": 2, "timeout_s": 30}
    (root / "configs" / "recipes" / "omni.toml").write_text(dump_recipe(data))
    assert load_desired(root).recipes["omni"].content_hash() == before


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"drop_flag": True}, "[sleep] needs the server started with --enable-sleep-mode"),
        ({"drop_env": True}, '[sleep] needs VLLM_SERVER_DEV_MODE = "1" in [container.env]'),
        ({"offload": True}, "vLLM issue #45268"),
        ({"level": 3}, "sleep.level"),
    ],
)
def test_a_sleep_without_what_it_needs_is_refused(root: Path, change: dict, said: str) -> None:
    sleep_ready(root, "omni", port=8001)
    path = root / "configs" / "recipes" / "omni.toml"
    data = tomllib.loads(path.read_text())
    if change.get("drop_flag"):
        data["container"]["command"].remove("--enable-sleep-mode")
    if change.get("drop_env"):
        data["container"]["env"] = {}
    if change.get("offload"):
        data["offload"] = {"enabled": True, "capacity_gib": 0.01}
    if "level" in change:
        data["sleep"]["level"] = change["level"]
    path.write_text(dump_recipe(data))
    found = problems(root)
    assert any(said in p and "configs/recipes/omni.toml" in p for p in found), found
    # Each at the line of [sleep] (or of the key), never "(top level)" without a line (issue 44, item 8).
    sleep_at = path.read_text().splitlines().index("[sleep]") + 1
    (said_it,) = [p for p in found if said in p]
    assert "(top level)" not in said_it, said_it
    if said.startswith("[sleep]"):
        assert said_it.startswith(f"configs/recipes/omni.toml:{sleep_at}: [sleep] needs"), said_it


def test_sleep_with_offload_is_allowed_once_requalified(root: Path) -> None:
    sleep_ready(root, "omni", port=8001)
    data = tomllib.loads((root / "configs" / "recipes" / "omni.toml").read_text())
    data["offload"] = {"enabled": True, "capacity_gib": 0.01}
    with pytest.raises(ValueError, match="45268"):
        Recipe.model_validate(data)
    data["sleep"]["allow_with_offload"] = True
    assert Recipe.model_validate(data).offload.enabled


def test_a_standby_lane_without_sleep_is_refused_at_its_line(root: Path) -> None:
    sleep_ready(root, "omni", port=8001)
    sleep_ready(root, "big", port=8003, tp=2)
    data = tomllib.loads((root / "configs" / "recipes" / "big.toml").read_text())
    del data["sleep"]
    (root / "configs" / "recipes" / "big.toml").write_text(dump_recipe(data))
    manifest(root, STANDBY)
    found = problems(root)
    assert any(
        "manifests/demo.yaml:9" in p and "topologies.exclusive[0].recipe" in p and "has no [sleep]" in p for p in found
    ), found


def test_standby_lanes_asked_at_one_port_are_refused(root: Path) -> None:
    sleep_ready(root, "omni", port=8001)
    sleep_ready(root, "big", port=8001, tp=2)
    manifest(root, STANDBY)
    found = problems(root)
    assert any("standby:" in p and "port 8001" in p and "one of them asleep" in p for p in found), found


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (STANDBY.replace("[split, exclusive]", "[split, nowhere]"), "standby: 'nowhere' is not under topologies:"),
        (STANDBY.replace("[split, exclusive]", "[split, split]"), "standby: names a topology twice"),
        (
            "host: demo\nstandby: [split]\nassignments:\n  - recipe: omni\n    gpus: [dark-compute-b]\n",
            "standby: names topologies, but there is no topologies:",
        ),
    ],
)
def test_a_standby_that_names_no_topology_is_refused(root: Path, text: str, said: str) -> None:
    sleep_ready(root, "omni", port=8001)
    sleep_ready(root, "big", port=8003, tp=2)
    manifest(root, text)
    found = problems(root)
    assert any(said in p for p in found), found
