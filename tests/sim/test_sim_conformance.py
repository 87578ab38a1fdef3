"""The simulation kept honest: one scenario run on the real engine, a real tmpfs and the real /proc (the fake vLLM
image, the command line) and on the simulated host, step by step, and the plans compared. A simulated engine that
drifted from the real one (an action it would not take, a file it would not list, a blocker it would not see) fails
here, not in a soak that no longer proves anything."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest
from e2e_helpers import SLEEP, Root, docker_cli
from real.test_e2e_apply import wait_for_no_offload_container

from reconciler.observe.containers import NVIDIA_MAJOR
from sim.machine import HostMachine
from sim.world import GIB

MIB = 1 << 20

pytestmark = [pytest.mark.docker, pytest.mark.root]


def _shape(plan: dict[str, Any], roles: dict[str, str]) -> dict[str, Any]:
    """What must agree: each action's kind, recipe (by role), slots and the number of files it removes; whether it
    is blocked and by what kind of cause."""
    return {
        "actions": [
            (a["kind"], roles.get(a["recipe"], a["recipe"]), tuple(a["gpus"]), len(a["paths"])) for a in plan["actions"]
        ],
        "blocked": plan["blocked"],
        "causes": sorted(b["cause"] for b in plan.get("blockers", [])),
    }


def _named(text: str, roles: dict[str, str]) -> str:
    """The real host's names (a recipe's name carries its test's tag) as the simulation's roles."""
    for real, role in sorted(roles.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(real, role)
    return text


class Sim:
    def __init__(self) -> None:
        self.m = HostMachine()
        self.m.setup(seed=3, shape="index", gpu_requests=False, wsl2=False, tmpfs_gib=20.0)
        self.m._write_host("index", gpu_requests=False, telemetry="none")

    def plan(self) -> dict[str, Any]:
        return self.m.plan_json()


def test_the_simulation_plans_as_the_real_host_does(root: Root, image: str) -> None:
    wait_for_no_offload_container(root.api)  # another root's offload lane would keep every orphan here
    real_omni = root.recipe("omni")
    real_big = root.recipe("deepseek-256k-offload", offload_mib=16)
    roles = {real_omni: "omni", real_big: "big"}
    sim = Sim()
    try:
        steps: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

        def compare(what: str) -> None:
            real = root.cli("plan", "--json")
            assert real.rc in (0, 2, 3), str(real)
            steps.append((what, _shape(real.data, roles), _shape(sim.plan(), {})))
            assert steps[-1][1] == steps[-1][2], (
                f"{what}: real {steps[-1][1]} != simulated {steps[-1][2]}\n{real.stdout}\n{root.shm_status()}"
            )

        def both_apply() -> None:
            res = root.apply()
            assert res.data["result"] in ("converged", "blocked"), res.data["message"]
            sim.m.cli_apply()
            sim.m.no_violation()

        # 1: an empty host, the split topology asked for.
        root.manifest((real_omni, ["dark-compute-b"]))
        sim.m.edit_manifest("split")
        compare("split from nothing")
        both_apply()
        compare("split converged")
        # 2: the switch to the exclusive TP=2 offload lane.
        root.manifest((real_big, ["dark-compute-a", "dark-compute-b"]))
        sim.m.edit_manifest("exclusive")
        compare("split to exclusive")
        both_apply()
        compare("exclusive converged")
        # 3: an orphan appears while the offload lane runs: the lane is settled and seen holding its own file, so
        # the orphan is no file it could own, and a reclaim lists it (safety rule 2).
        with open(root.shm / "vllm_offload_crashed.mmap", "wb") as fh:
            fh.write(b"\0" * MIB)
        sim.m.world.add_file(GIB)
        compare("an orphan beside a running offload lane")
        assert ("reclaim", None, (), 1) in steps[-1][1]["actions"], steps[-1]
        # 4: back to split: the reclaim lists the orphan, the leave its own file.
        root.manifest((real_omni, ["dark-compute-b"]))
        sim.m.edit_manifest("split")
        compare("exclusive to split")
        both_apply()
        compare("split again")
        assert root.shm_files() == [] and not sim.m.world.files
        # 5: a squatter (not ours) claims dark-compute-a; the manifest gives it a lane: blocked, naming it.
        index = root.slot_index["dark-compute-a"]
        root.run_unmanaged(
            "squatter", "-e", f"NVIDIA_VISIBLE_DEVICES={index}", "-v", "/usr:/usr:ro", image, "sleep", "300"
        )
        sim.m.world.foreign("squatter", env={"NVIDIA_VISIBLE_DEVICES": "0"})
        root.manifest((real_omni, ["dark-compute-a"]))
        sim.m.edit_manifest("swapped-omni-a")
        compare("a squatter on the wanted slot")
        # 6: an orphan with no offload lane running: reclaimed first.
        docker_cli("rm", "-f", f"squatter-{root.tag}")
        sim.m.operator_removes_foreign(0)
        with open(root.shm / "vllm_offload_late.mmap", "wb") as fh:
            fh.write(b"\0" * MIB)
        sim.m.world.add_file(GIB)
        compare("an orphan while nothing offloads")
        # 7: a plan saved now (its reclaim and enter), then another orphan: applied later, it is stale on both hosts
        # and changes nothing; the plan both make then lists both orphans.
        saved = root.path.parent / "saved-plan.json"
        assert root.cli("plan", "--out", str(saved)).rc == 2
        sim.m.plan_saved()
        before, sim_writes = root.snapshot(), len(sim.m.world.writes)
        with open(root.shm / "vllm_offload_later.mmap", "wb") as fh:
            fh.write(b"\0" * MIB)
        sim.m.world.add_file(GIB)
        real = root.cli("apply", str(saved), "--json")
        assert real.rc == 1 and real.data["result"] == "stale", str(real)
        sim.m.saved_plan_applied(len(sim.m.saved) - 1)
        sim.m.no_violation()
        assert root.snapshot() == before and len(root.shm_files()) == 2, "the stale plan changed nothing"
        assert sim.m.world.writes[sim_writes:] == [] and len(sim.m.world.files) == 2
        compare("a saved plan gone stale")
        # 8: a device-node squatter: a container given a card's node (--device; made with mknod, numbered 195:N, under
        # a name that is no card's), no GPU request, nothing running on the card. Without telemetry no minor number
        # is known: it may be any slot's card, and the enter is blocked.
        node = root.path / "gpu-node"
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, index % 254))
        root.run_unmanaged(
            "node-squatter", "--device", f"{node}:/dev/accel0", "-v", "/usr:/usr:ro", image, "sleep", "300"
        )
        sim.m.world.foreign("node-squatter", devices=[f"/dev/nvidia{sim.m.world.cards[0].minor}"], idle=True)
        compare("a device-node squatter")
        assert steps[-1][1]["blocked"] and steps[-1][1]["causes"] == ["held"], steps[-1]
        docker_cli("rm", "-f", f"node-squatter-{root.tag}")
    finally:
        sim.m.teardown()


def test_a_switch_whose_wake_is_blocked_is_planned_alike(root: Root) -> None:
    """Sleeping lanes rule 8 on both hosts: the split serves with the exclusive lane asleep, a container this tool
    did not start takes card A, and the manifest switches to the exclusive topology. Both plans keep both split lanes
    serving (no sleep, no leave), name the same lanes in ``kept_serving`` and the same blocker."""
    from real.test_sleeping_lanes import standby_manifest

    a, b = root.sleeping_recipe("small-a"), root.sleeping_recipe("small-b")
    big = root.sleeping_recipe("big", tp=2, level=2)
    roles = {a: "sleepa", b: "sleepb", big: "sleepbig"}
    sim = Sim()
    try:

        def plans(what: str) -> tuple[dict[str, Any], dict[str, Any]]:
            real = root.cli("plan", "--json")
            assert real.rc in (0, 2, 3), str(real)
            pair = real.data, sim.plan()
            assert _shape(pair[0], roles) == _shape(pair[1], {}), f"{what}: {_shape(pair[0], roles)} != {pair[1]}"
            return pair

        standby_manifest(root, a, b, big)
        sim.m.edit_manifest_named("standby", "split")
        plans("the split with the exclusive lane on standby")
        assert root.apply().rc == 0
        sim.m.cli_apply()
        sim.m.no_violation()
        plans("converged")
        root.run_unmanaged("jupyter", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index['dark-compute-a']}", *SLEEP)
        sim.m.world.foreign("jupyter", env={"NVIDIA_VISIBLE_DEVICES": "0"})
        assert root.cli("switch", "exclusive").rc == 0
        sim.m.operator_switches("exclusive")
        real, simulated = plans("the switch to the exclusive lane, its wake blocked by a foreign container")
        assert real["actions"] == [] and real["blocked"], real
        kept = sorted(_named(n, roles) for n in real["kept_serving"])
        assert kept == sorted(simulated["kept_serving"]), (real["kept_serving"], simulated["kept_serving"])
        assert kept == ["reconciler-sleepa-dark-compute-a", "reconciler-sleepb-dark-compute-b"], kept
        blockers = (
            [(_named(x["recipe"], roles), tuple(x["gpus"]), x["cause"]) for x in real["blockers"]],
            [(x["recipe"], tuple(x["gpus"]), x["cause"]) for x in simulated["blockers"]],
        )
        assert blockers[0] == blockers[1], blockers
        assert all(x["holder"].startswith("jupyter") for x in [*real["blockers"], *simulated["blockers"]]), blockers
        # Applied, both keep the split serving: nothing is put to sleep.
        assert root.apply().rc == 3
        sim.m.cli_apply()
        sim.m.no_violation()
        plans("after the apply")
    finally:
        sim.m.teardown()


def test_a_saved_plan_whose_probe_changed_is_stale_in_the_same_words(root: Root, tmp_path: Any) -> None:
    """Safety rule 13 on both hosts: a plan saved, then the desired state changed in one recipe's probe only (no
    part of its hash): ``apply FILE`` refuses it as stale on both, naming the file and the probe in the same words,
    and changes nothing."""
    import tomllib

    from e2e_helpers import dump_recipe

    omni = root.recipe("omni")
    roles = {omni: "omni"}
    path = root.path / "configs" / "recipes" / f"{omni}.toml"
    data = tomllib.loads(path.read_text())
    data["probes"] = [p for p in data.get("probes", []) if p["name"] != "smoke"] + [
        {"name": "smoke", "suite": "regression", "prompt": "Reply with the single word: ready (0)"}
    ]
    path.write_text(dump_recipe(data))
    sim = Sim()
    try:
        root.manifest((omni, ["dark-compute-b"]))
        sim.m.edit_manifest("split")
        saved = tmp_path / "saved.json"
        assert root.cli("plan", "--out", str(saved)).rc == 2
        sim.m.plan_saved()
        data["probes"][-1]["prompt"] = "Reply with the single word: ready (1)"
        path.write_text(dump_recipe(data))
        sim.m.probes["omni"] += 1
        sim.m._write_recipe("omni")
        before, writes = root.snapshot(), len(sim.m.world.writes)
        real = root.cli("apply", str(saved), "--json")
        assert real.rc == 1 and real.data["result"] == "stale", str(real)
        sim.m.saved_plan_applied(len(sim.m.saved) - 1)
        sim.m.no_violation()
        assert root.snapshot() == before and sim.m.world.writes[writes:] == [], "the stale plan changed nothing"

        def words(changes: list[str]) -> list[str]:
            return sorted(w for c in changes if (w := _named(c, roles)).startswith(("recipe ", "configs/")))

        assert words(real.data["changes"]) == words(sim.m.stale_words), (real.data["changes"], sim.m.stale_words)
        assert words(sim.m.stale_words) == ["configs/recipes/omni.toml edited", "recipe omni's probe smoke changed"]
    finally:
        sim.m.teardown()
