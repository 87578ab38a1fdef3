"""End to end: the field report's lifecycle through the real command line, the real Docker engine, real fake-vllm
containers and a real tmpfs (issue 4, scenarios 1-7).

Each test builds its own root in ``tmp_path`` with tests/e2e_helpers.py's ``make_root``, from the demo's configs
(examples/demo/), adjusted so it cannot disturb anything else on the machine: a host name of its own, GPU slots on
indexes no other test uses (with ``gpu_telemetry: none`` a slot is only an id, so two tests never contend for one),
a 64 MiB tmpfs of its own as ``shm.dir`` (bind-mounted into the containers at the same path, since ``ipc = "host"``
only shares /dev/shm), free host ports, recipe names with a per-test tag (container names are engine-wide), a short
``confirm_interval_s`` and small timeouts. Every command runs as ``python -m reconciler --root ROOT ...`` in a
subprocess, with its lock dir under ``tmp_path``. A finalizer removes every container labelled with the test's
host, kept failed ones included, and every unmanaged container the test started.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    LABEL_HOST,
    CliResult,
    Root,
    build_image,
    docker_cli,
    http_status,
    make_root,
    set_flag,
    wait_until,
)

MIB = 1 << 20
PRESERVED_RE = re.compile(r"-failed-\d{8}-\d{6}$")

pytestmark = [pytest.mark.docker, pytest.mark.root]


def _engine(root: Root) -> Any:
    """Docker's engine (``reconciler.host.engine``) through the test's own SDK client."""
    from conftest import DOCKER_URL

    from reconciler.host.engine.docker import DockerEngine

    return DockerEngine(DOCKER_URL, sdk=root.api)


def docker_logs(name: str) -> str:
    proc = docker_cli("logs", name)
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def image(docker_api: Any) -> str:
    return build_image()


def offload_containers(api: Any) -> list[str]:
    """Running containers with vLLM offload flags or our offload label, of any host: while one runs, the shm guard
    refuses every reclaim on this engine (docs/design.md, safety rule 2)."""
    found = []
    for c in api.containers(filters={"status": "running"}):
        labels = c.get("Labels") or {}
        if labels.get("io.reconciler.offload") == "true" or "--kv-offloading" in (c.get("Command") or ""):
            found.append(c["Names"][0].lstrip("/"))
    return found


def wait_for_no_offload_container(api: Any, *, timeout: float = 90) -> None:
    """The scenarios that reclaim need an engine where no other offload container runs (another test's, the
    demo's): wait for them to end, then fail saying which ones are in the way."""
    deadline = time.monotonic() + timeout
    while busy := offload_containers(api):
        if time.monotonic() > deadline:
            pytest.fail(
                f"native-offload container(s) {', '.join(busy)} run on this engine, and the shm guard refuses every "
                "reclaim while one runs. Stop them (the demo: reconciler apply with an empty manifest) and rerun"
            )
        time.sleep(0.5)


@pytest.fixture
def root(
    tmp_path: Path, tmpfs_dir: Path, docker_api: Any, image: str, request: pytest.FixtureRequest
) -> Iterator[Root]:
    r = make_root(tmp_path, shm=tmpfs_dir, api=docker_api, name=request.node.name)
    try:
        yield r
    finally:
        r.cleanup()


def outcomes(result: CliResult) -> list[tuple[str, str | None, str]]:
    """(kind, recipe, result) of each action an apply ran."""
    return [(a["kind"], a["recipe"], a["result"]) for a in result.data["actions"]]


def slot_holders(status: dict[str, Any], slot: str) -> list[str]:
    return [c["name"] for c in status["slots"][slot]["containers"]]


def split(r: Root) -> str:
    """Scenario 1's manifest: omni on dark-compute-b, dark-compute-a free. Returns omni's recipe name."""
    omni = r.recipes.get("omni") or r.recipe("omni")
    r.manifest((omni, ["dark-compute-b"]))
    return omni


def exclusive(r: Root, *, offload_mib: int = 16) -> str:
    """The exclusive lane: the TP=2 offload recipe on both slots. Returns its recipe name."""
    lane = r.recipes.get("deepseek-256k-offload") or r.recipe("deepseek-256k-offload", offload_mib=offload_mib)
    r.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    return lane


def apply_ok(r: Root) -> CliResult:
    res = r.apply()
    assert res.rc == 0, str(res)
    assert res.data["result"] == "converged", str(res)
    return res


# ---------------------------------------------------------------- 1-3: split -> exclusive -> split


def test_1_split_topology_from_nothing(root: Root) -> None:
    omni = split(root)
    before = root.cli("plan", "--json")
    assert before.rc == 2, str(before)
    assert [(a["kind"], a["recipe"], a["gpus"]) for a in before.data["actions"]] == [
        ("enter", omni, ["dark-compute-b"])
    ]

    res = apply_ok(root)
    assert outcomes(res) == [("enter", omni, "ok")]
    name = root.cname(omni, "dark-compute-b")
    assert set(root.running()) == {name}
    assert http_status(f"http://127.0.0.1:{root.port_of(omni)}/health") == 200
    labels = root.running()[name]["Labels"]
    assert labels["io.reconciler.managed"] == "true"
    assert labels["io.reconciler.slots"] == "dark-compute-b"
    assert labels["io.reconciler.recipe"] == omni

    st = root.status()
    assert st["converged"] is True
    assert slot_holders(st, "dark-compute-b") == [name]
    assert st["slots"]["dark-compute-a"]["free"] is True and slot_holders(st, "dark-compute-a") == []
    assert root.cli("plan", "--json").rc == 0
    assert root.shm_files() == []


def _to_exclusive(root: Root) -> tuple[str, str, str]:
    omni = split(root)
    apply_ok(root)
    omni_name = root.cname(omni, "dark-compute-b")
    omni_id = root.running()[omni_name]["Id"]
    lane = exclusive(root)
    res = apply_ok(root)
    assert outcomes(res) == [("leave", omni, "ok"), ("enter", lane, "ok")], str(res)
    assert not [c for c in root.containers() if c["Id"] == omni_id], "omni left: its container is removed"
    return omni, lane, root.cname(lane, "dark-compute-a", "dark-compute-b")


def test_2_switch_to_the_exclusive_tp2_offload_lane(root: Root) -> None:
    wait_for_no_offload_container(root.api)
    _omni, _lane, lane_name = _to_exclusive(root)
    assert set(root.running()) == {lane_name}
    st = root.status()
    assert st["converged"] is True
    for slot in ("dark-compute-a", "dark-compute-b"):
        assert slot_holders(st, slot) == [lane_name]

    # Its offload file is mapped by both TP workers, seen through /proc by device and inode.
    shm = root.shm_status()
    assert shm["sources"]["proc"] == "ok" and shm["sources"]["docker"] == "ok", shm["sources"]
    assert len(shm["files"]) == 1, shm["files"]
    f = shm["files"][0]
    assert f["state"] == "owned" and re.fullmatch(r".*/vllm_offload_.+\.mmap", f["path"]), f
    assert f["allocated_bytes"] >= 16 * MIB, "both workers prefaulted the whole buffer"
    mappers = {o["pid"] for o in f["owners"] if o["via"] == "map"}
    assert len(mappers) == 2, f["owners"]
    lane_id = root.running()[lane_name]["Id"]
    assert {o["container"] for o in f["owners"]} <= {lane_name, lane_id, lane_id[:12]}, f["owners"]
    # Settled (recorded healthy) and seen holding its file: the lane could own no unowned file (safety rule 2).
    assert shm["blocking_containers"] == [], shm["blocking_containers"]

    # The guard will not touch it while the lane runs: nothing to do (exit 0), the file kept, still mapped.
    rec = root.cli("shm", "reclaim", "--confirm", "--json")
    assert rec.rc == 0, str(rec)
    assert rec.data["confirmed"] is True
    assert rec.data["reclaimed"] == [] and rec.data["reclaimed_bytes"] == 0, str(rec)
    kept = {k["path"]: k["reason"] for k in rec.data["kept"]}
    assert f["path"] in kept and kept[f["path"]], str(rec)
    assert os.path.exists(f["path"])

    # A file nobody maps (another lane's orphan, a crashed worker's) goes while the settled lane serves: its own
    # file is the one it maps, which stays.
    stray = root.shm / "vllm_offload_stray.mmap"
    stray.write_bytes(b"\0" * MIB)
    rec = root.cli("shm", "reclaim", "--confirm", "--json")
    assert rec.rc == 0, str(rec)
    assert [r["path"] for r in rec.data["reclaimed"]] == [str(stray)] and rec.data["refused"] is None, str(rec)
    assert not stray.exists() and os.path.exists(f["path"])
    assert http_status(f"http://127.0.0.1:{root.port_of(root.recipes['deepseek-256k-offload'])}/health") == 200


def test_3_back_to_split_leaves_nothing_behind(root: Root) -> None:
    omni, lane, lane_name = _to_exclusive(root)
    offload_file = root.shm_files()
    assert len(offload_file) == 1
    split(root)
    res = apply_ok(root)
    assert outcomes(res) == [("leave", lane, "ok"), ("enter", omni, "ok")], str(res)
    assert not [c for c in root.containers() if c["Names"][0].lstrip("/").startswith(lane_name)], "lane removed"
    assert root.shm_files() == [], "the lane's offload file is gone and nothing else is left"
    st = root.status()
    assert st["converged"] is True
    assert slot_holders(st, "dark-compute-b") == [root.cname(omni, "dark-compute-b")]
    assert st["slots"]["dark-compute-a"]["free"] is True
    assert st["shm"]["files"]["orphan"]["count"] == 0 and st["shm"]["files"]["owned"]["count"] == 0
    assert root.shm_status()["files"] == []


# ---------------------------------------------------------------- 4: the report's failure


def test_4_orphans_fill_the_tmpfs_errno_14_without_reclaim_and_apply_reclaims_then_enters(root: Root) -> None:
    wait_for_no_offload_container(root.api)
    lane = root.recipe("deepseek-256k-offload", offload_mib=24)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    # Two crashed starts' worth of buffers nobody maps any more: 48 of the 64 MiB, every page allocated.
    for i in range(2):
        with open(root.shm / f"vllm_offload_crashed{i}.mmap", "wb") as fh:
            fh.write(b"\0" * (24 * MIB))
    orphans = set(root.shm_files())
    shm = root.shm_status()
    assert {f["state"] for f in shm["files"]} == {"orphan"} and len(shm["files"]) == 2
    assert shm["tmpfs"]["free_bytes"] < 24 * MIB

    # Without a reclaim, the very same start fails as in the report: Errno 14 at the prefault.
    spec = root.recipe_data(lane)["container"]
    vols = [a for v in spec["volumes"] for a in ("-v", v)]
    direct = root.run_unmanaged(
        "direct", "--init", "--ipc", "host", "--network", "host", *vols, spec["image"], *spec["command"]
    )
    code = docker_cli("wait", direct, timeout=30).stdout.strip()
    logs = docker_logs(direct)
    assert code == "1", logs
    assert "OSError: [Errno 14] Bad address" in logs
    docker_cli("rm", direct)
    leftovers = set(root.shm_files()) - orphans
    assert len(leftovers) == 1, "the failed start left its partly prefaulted buffer, as in the report"

    plan = root.cli("plan", "--json")
    assert plan.rc == 2, str(plan)
    kinds = [a["kind"] for a in plan.data["actions"]]
    assert kinds.index("reclaim") < kinds.index("enter"), kinds

    res = apply_ok(root)
    freed = sum(a["reclaimed_bytes"] for a in res.data["actions"] if a["result"] == "ok")
    assert freed >= 48 * MIB, str(res)
    assert [a for a in outcomes(res) if a[0] == "enter"] == [("enter", lane, "ok")], str(res)
    files = root.shm_files()
    assert len(files) == 1 and files[0] not in orphans | leftovers, files
    shm = root.shm_status()
    assert [f["state"] for f in shm["files"]] == ["owned"]
    assert len({o["pid"] for o in shm["files"][0]["owners"] if o["via"] == "map"}) == 2
    assert http_status(f"http://127.0.0.1:{root.port_of(lane)}/health") == 200


def test_4b_orphans_that_appear_after_the_plan_are_left_to_the_next_plan(root: Root) -> None:
    """Orphans that appear after the plan was made (a crash between plan and act) are not removed by the enter: the
    plan it runs listed no such file. The enter is refused for want of room before it creates anything, and the next
    plan lists the reclaim of exactly those files (docs/design.md, safety rule 13: only the shown plan runs)."""
    from reconciler.apply.applier import Applier
    from reconciler.apply.errors import ActionRefused
    from reconciler.load.desired import load_desired
    from reconciler.plan.actions import ActionKind

    wait_for_no_offload_container(root.api)
    lane = root.recipe("deepseek-256k-offload", offload_mib=24)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    applier = Applier(load_desired(root.path))
    _, plan = applier.plan_now()
    assert [a.kind for a in plan.actions] == [ActionKind.ENTER], plan
    for i in range(2):
        with open(root.shm / f"vllm_offload_late{i}.mmap", "wb") as fh:
            fh.write(b"\0" * (24 * MIB))
    orphans = set(root.shm_files())
    observed = applier.observe()
    assert observed.shm.tmpfs.free_bytes < 24 * MIB and len(observed.shm.by_state("orphan")) == 2

    with pytest.raises(ActionRefused) as refused:
        applier.enter(plan.actions[0], observed)
    assert refused.value.reason == "tmpfs_room", refused.value
    assert set(root.shm_files()) == orphans
    assert not [c for c in root.api.containers(all=True) if c["Names"][0].lstrip("/").startswith(f"reconciler-{lane}")]
    _, after = applier.plan_now()
    assert [a.kind for a in after.actions] == [ActionKind.RECLAIM, ActionKind.ENTER], after
    assert {p.rsplit("/", 1)[1] for p in after.actions[0].paths} == {p.rsplit("/", 1)[-1] for p in map(str, orphans)}


def test_4c_an_enter_without_tmpfs_room_is_refused_and_creates_nothing(root: Root) -> None:
    """Room taken by a file a live process holds cannot be reclaimed: the enter is refused before any create."""
    from reconciler.apply.applier import Applier
    from reconciler.load.desired import load_desired

    wait_for_no_offload_container(root.api)
    lane = root.recipe("deepseek-256k-offload", offload_mib=24)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    applier = Applier(load_desired(root.path))
    _, plan = applier.plan_now()
    (enter,) = plan.actions
    with open(root.shm / "vllm_offload_held.mmap", "wb") as held:  # this test process holds it open: owned
        held.write(b"\0" * (48 * MIB))
        held.flush()
        outcome = applier._execute(enter, applier.observe())
        assert outcome.result == "refused" and outcome.refusal == "tmpfs_room", outcome
        assert "needs 24.00 MiB for its offload file" in outcome.detail
        assert root.containers() == [] and root.shm_files() == ["vllm_offload_held.mmap"]


# ---------------------------------------------------------------- 5: a recipe that crashes on start


def test_5_crash_on_start_keeps_the_container_reclaims_its_shm_frees_the_slot(root: Root) -> None:
    wait_for_no_offload_container(root.api)
    omni = root.recipe("omni")
    crashy = root.recipe("deepseek-256k-offload", offload_mib=16, mode="crash-after=0")
    # TP=2 recipe on one slot is refused by the loader; make the crashing lane single-slot.
    data = root.recipe_data(crashy)
    data["tensor_parallel_size"] = 1
    data["container"]["command"] = set_flag(data["container"]["command"], "--tensor-parallel-size", "1")
    root.write_recipe(crashy, data)
    root.manifest((crashy, ["dark-compute-a"]), (omni, ["dark-compute-b"]))

    res = root.apply()
    assert res.rc == 1, str(res)
    assert res.data["result"] == "failed", str(res)
    assert sorted(outcomes(res)) == sorted([("enter", crashy, "failed"), ("enter", omni, "ok")]), str(res)
    failed = next(a for a in res.data["actions"] if a["result"] == "failed")
    # The cause is named from the container's own log, and where its logs are kept.
    assert "fake crash" in res.data["message"] and "fake crash" in failed["detail"], str(res)
    kept = [c for c in root.containers() if PRESERVED_RE.search(c["Names"][0])]
    assert len(kept) == 1, root.containers()
    kept_name = kept[0]["Names"][0].lstrip("/")
    assert kept_name.startswith(root.cname(crashy, "dark-compute-a") + "-failed-")
    assert kept_name in failed["detail"]
    assert kept[0]["State"] == "exited"
    assert "fake crash" in docker_logs(kept_name)
    # Its offload file (left by the crash, as in the report) is no file its container was seen holding (it crashed
    # at once), so the failed enter leaves it (safety rule 13: it may be another program's); nothing holds it and no
    # offload container runs, so it is an orphan, and the next plan reclaims it before the enter.
    files = root.shm_files()
    assert len(files) == 1, files
    assert [f["state"] for f in root.shm_status()["files"]] == ["orphan"]

    st = root.status()
    assert st["slots"]["dark-compute-a"]["free"] is True, st["slots"]
    assert slot_holders(st, "dark-compute-b") == [root.cname(omni, "dark-compute-b")]
    assert [c["name"] for c in st["containers"] if c["preserved"]] == [kept_name]
    # No double booking: the kept container holds nothing; the next pass would simply try the enter again.
    plan = root.cli("plan", "--json")
    assert plan.rc == 2 and plan.data["blockers"] == [], str(plan)
    assert [(a["kind"], a["recipe"], a["gpus"], a["paths"]) for a in plan.data["actions"]] == [
        ("reclaim", None, [], [str(root.shm / files[0])]),
        ("enter", crashy, ["dark-compute-a"], []),
    ]


def test_5b_failures_within_one_second_are_all_kept_under_distinct_names(root: Root, image: str) -> None:
    """Two quick applies of a recipe that fails at once fail within the same second; each keeps its container."""
    from reconciler.apply.engine_ops import EngineOps

    ops = EngineOps(_engine(root))
    base = root.cname(f"quick-{root.tag}", "dark-compute-a")
    ids = [root.api.create_container(image, command=["true"], labels={LABEL_HOST: root.host})["Id"] for _ in range(3)]
    t0 = time.monotonic()
    names = [ops.preserve(cid, base) for cid in ids]
    assert time.monotonic() - t0 < 1.0, "the three renames should fall within about one second"
    assert len(set(names)) == 3, names
    assert all(n.startswith(base + "-failed-") and PRESERVED_RE.search(n) for n in names), names
    assert sorted(root.api.inspect_container(cid)["Name"].lstrip("/") for cid in ids) == sorted(names)


def test_5c_only_the_newest_kept_failures_stay(root: Root, image: str) -> None:
    """A recipe that keeps failing does not pile up stopped containers: the newest keep_failed stay, and nothing
    running, unlabelled, of another host or under another name is touched."""
    from reconciler.apply.engine_ops import EngineOps
    from reconciler.plan.observed import LABEL_INSTALL, LABEL_MANAGED

    ops = EngineOps(_engine(root))
    base = root.cname(f"flaky-{root.tag}", "dark-compute-a")
    mine = {LABEL_HOST: root.host, LABEL_MANAGED: "true", LABEL_INSTALL: root.install_id()}
    ids = [root.api.create_container(image, command=["true"], labels=mine)["Id"] for _ in range(4)]
    names = [ops.preserve(cid, base) for cid in ids]
    other_host = root.api.create_container(
        image, command=["true"], labels={**mine, LABEL_HOST: "elsewhere"}, name=base + "-failed-19990101-000000"
    )["Id"]
    try:
        removed = ops.prune_kept(base, host=root.host, keep=2, install_id=root.install_id())
        assert sorted(removed) == sorted(names)[:2], (removed, names)
        left = {c["Names"][0].lstrip("/") for c in root.api.containers(all=True)}
        assert set(sorted(names)[2:]) <= left and not set(sorted(names)[:2]) & left
        assert base + "-failed-19990101-000000" in left
    finally:
        root.api.remove_container(other_host, force=True)


def test_5d_pruning_kept_failures_leaves_what_this_install_did_not_make(root: Root, image: str) -> None:
    """Pruning removes only kept containers that carry this install's id on themselves: one of another install,
    one from before install ids, and one that has this install's labels only from its image (a commit of one of
    ours) all survive, however old their stamps."""
    from reconciler.apply.engine_ops import EngineOps
    from reconciler.plan.observed import LABEL_INSTALL, LABEL_MANAGED

    ops = EngineOps(_engine(root))
    install = root.install_id()
    base = root.cname(f"flaky-{root.tag}", "dark-compute-a")
    mine = {LABEL_HOST: root.host, LABEL_MANAGED: "true", LABEL_INSTALL: install}
    names = [
        ops.preserve(root.api.create_container(image, command=["true"], labels=mine)["Id"], base) for _ in range(3)
    ]
    # Oldest stamps: a prune by name and host alone removes these first.
    strangers = {
        "another install": {**mine, LABEL_INSTALL: "f" * 32},
        "no install id": {LABEL_HOST: root.host, LABEL_MANAGED: "true"},
    }
    made = []
    for i, labels in enumerate(strangers.values()):
        made.append(
            root.api.create_container(image, command=["true"], labels=labels, name=f"{base}-failed-19990101-00000{i}")[
                "Id"
            ]
        )
    # An image that carries this install's labels (someone committed one of ours): its containers inherit them.
    tag = f"reconciler/e2e-kept-copy:{root.tag}"
    image_id = root.api.commit(names[0], repository=tag.split(":")[0], tag=root.tag)["Id"]
    try:
        made.append(root.api.create_container(image_id, command=["true"], name=f"{base}-failed-19990101-000009")["Id"])
        copy = root.api.inspect_container(made[-1])["Config"]["Labels"]
        assert copy[LABEL_INSTALL] == install and copy[LABEL_HOST] == root.host, copy
        survivors = [f"{base}-failed-19990101-00000{i}" for i in (0, 1, 9)]

        assert ops.prune_kept(base, host=root.host, keep=0) == [], "no install id given: nothing is pruned"
        removed = ops.prune_kept(base, host=root.host, keep=1, install_id=install)
        assert sorted(removed) == sorted(names)[:2], (removed, names)
        left = {c["Names"][0].lstrip("/") for c in root.api.containers(all=True)}
        assert set(survivors) <= left, sorted(left)
        assert sorted(names)[2] in left and not set(sorted(names)[:2]) & left
    finally:
        import docker.errors

        for cid in made:
            with contextlib.suppress(docker.errors.NotFound):  # a prune that took it is the failure reported above
                root.api.remove_container(cid, force=True)
        root.api.remove_image(image_id, force=True)


# ---------------------------------------------------------------- 6: edited recipe; unmanaged holder


def test_6a_recipe_edited_in_place_is_recreated(root: Root) -> None:
    omni = split(root)
    apply_ok(root)
    name = root.cname(omni, "dark-compute-b")
    old = root.running()[name]
    old_hash = old["Labels"]["io.reconciler.recipe-hash"]

    data = root.recipe_data(omni)
    data["container"]["env"] = {**data["container"].get("env", {}), "OMNI_EDIT": "2"}
    root.write_recipe(omni, data)
    new_hash = root.cli("validate", "--json").data["assignments"][0]["recipe_hash"]
    assert new_hash != old_hash

    plan = root.cli("plan", "--json")
    assert plan.rc == 2, str(plan)
    assert [a["kind"] for a in plan.data["actions"]] == ["leave", "enter"]
    assert "changed" in plan.data["actions"][0]["reason"]

    res = apply_ok(root)
    assert outcomes(res) == [("leave", omni, "ok"), ("enter", omni, "ok")]
    new = root.running()[name]
    assert new["Id"] != old["Id"]
    assert new["Labels"]["io.reconciler.recipe-hash"] == new_hash
    assert "OMNI_EDIT=2" in root.api.inspect_container(new["Id"])["Config"]["Env"]
    assert [c["Id"] for c in root.containers()] == [new["Id"]], "the old container is removed, not kept"


def test_6b_unmanaged_container_on_a_slot_blocks_and_nothing_is_touched(root: Root, image: str) -> None:
    omni = split(root)
    apply_ok(root)
    a_index = root.slot_index["dark-compute-a"]
    root.run_unmanaged(
        "unmanaged", "-e", f"NVIDIA_VISIBLE_DEVICES={a_index}", "-v", "/usr:/usr:ro", image, "sleep", "300"
    )
    # The manifest now wants omni gone (a leave that could be done) and the lane on both slots (blocked).
    lane = exclusive(root)
    before = root.snapshot()
    files_before = root.shm_files()

    plan = root.cli("plan", "--json")
    assert plan.rc == 3 and plan.data["blocked"] is True, str(plan)
    res = root.apply()
    assert res.rc == 3, str(res)
    assert res.data["result"] == "blocked" and res.data["actions"] == []
    assert f"unmanaged-{root.tag}" in res.data["message"] and "not managed" in res.data["message"], str(res)
    assert root.snapshot() == before, "apply changed containers while blocked"
    assert root.cname(omni, "dark-compute-b") in root.running()
    assert root.shm_files() == files_before
    assert not [c for c in root.containers() if lane in c["Labels"].get("io.reconciler.recipe", "")]


# ---------------------------------------------------------------- 7: SIGKILL in the middle of an enter


def test_7_apply_killed_mid_enter_then_run_again_finishes_the_same_container(root: Root) -> None:
    lane = root.recipe("deepseek-256k-offload", offload_mib=16, mode="start-delay=3")
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    name = root.cname(lane, "dark-compute-a", "dark-compute-b")
    proc = subprocess.Popen(
        root.cli_args("apply", "--yes", "--json"), env=root.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        # Kill it once its container is up and it is waiting for health (the workers are still "loading").
        wait_until(lambda: name in root.running(), timeout=20, what=f"{name} running")
        assert proc.poll() is None, "apply finished before it could be killed mid-enter"
        assert root.shm_files() == [], "still loading: no offload file yet"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    # Everything it created carries the labels: the container is found as ours.
    survivor = root.running()[name]
    assert survivor["Labels"]["io.reconciler.host"] == root.host

    # It never passed its health check, so it does not count as satisfied: the next pass (the kernel dropped the
    # dead process's lock) finishes the wait on that same container rather than restart its model load, and ends
    # with exactly one container, the first one, healthy.
    plan = root.cli("plan", "--json")
    assert [(a["kind"], a["container_id"]) for a in plan.data["actions"]] == [("enter", survivor["Id"])], plan
    assert "left waiting for its health check" in plan.data["actions"][0]["reason"]
    res = apply_ok(root)
    assert outcomes(res) == [("enter", lane, "ok")], str(res)
    assert http_status(f"http://127.0.0.1:{root.port_of(lane)}/health") == 200
    assert [c["Id"] for c in root.containers()] == [survivor["Id"]], "exactly one container, the first one"
    shm = root.shm_status()
    assert [f["state"] for f in shm["files"]] == ["owned"], shm["files"]
    assert len({o["pid"] for o in shm["files"][0]["owners"] if o["via"] == "map"}) == 2
    assert len(root.shm_files()) == 1
    again = root.cli("plan", "--json")
    assert again.rc == 0, str(again)


def test_7b_killed_between_create_and_start_the_labelled_leftover_is_replaced(root: Root) -> None:
    """The narrowest kill point: the container was created (with its labels, in the create call) but never started.

    A SIGKILL cannot be timed into that gap reliably, so the state it leaves is made with the very calls an enter
    makes (``create_spec``, the create token recorded, ``EngineOps.create``; killed before the id was recorded), and
    the real command line then has to clean it up: the container is known for this install's by its name and token.
    """
    from reconciler.apply.engine_ops import EngineOps, create_spec
    from reconciler.load.desired import load_desired
    from reconciler.plan.observed import LABEL_CREATE_TOKEN
    from reconciler.store import state

    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    slots = ("dark-compute-a", "dark-compute-b")
    create = create_spec(load_desired(root.path), lane, slots, install_id=root.install_id())
    create["labels"][LABEL_CREATE_TOKEN] = "7b" * 16
    os.environ["RECONCILER_STATE_DIR"], before = (
        root.env["RECONCILER_STATE_DIR"],
        os.environ.get("RECONCILER_STATE_DIR"),
    )
    try:
        state.record_pending(root.host, create["name"], "7b" * 16)
    finally:
        if before is None:
            del os.environ["RECONCILER_STATE_DIR"]
        else:
            os.environ["RECONCILER_STATE_DIR"] = before
    leftover = EngineOps(_engine(root)).create(create)
    assert [(c["Id"], c["State"]) for c in root.containers()] == [(leftover, "created")]

    plan = root.cli("plan", "--json")
    assert [(a["kind"], a["container_id"]) for a in plan.data["actions"]] == [
        ("leave", leftover),
        ("enter", None),
    ], str(plan)
    assert "never started" in plan.data["actions"][0]["reason"]

    res = apply_ok(root)
    assert outcomes(res) == [("leave", lane, "ok"), ("enter", lane, "ok")], str(res)
    (only,) = root.containers()
    assert only["Id"] != leftover and only["State"] == "running"
    assert only["Names"][0].lstrip("/") == root.cname(lane, *slots)
    shm = root.shm_status()
    assert [f["state"] for f in shm["files"]] == ["owned"] and len(root.shm_files()) == 1


def test_a_stopped_container_not_ours_with_our_name_blocks_the_enter(root: Root, image: str) -> None:
    """A container the tool did not make already carries the name its container would get (stopped, no GPU): the
    plan is blocked naming it, instead of an enter that the engine would refuse with a 409 at create."""
    omni = split(root)
    name = root.cname(omni, "dark-compute-b")
    docker_cli("create", "--name", name, "--label", f"io.reconciler-e2e.test={root.host}", image, "true")
    plan = root.cli("plan", "--json")
    assert plan.rc == 3, str(plan)
    assert plan.data["actions"] == [], str(plan)
    assert any(name in b["reason"] and "not managed by this tool" in b["reason"] for b in plan.data["blockers"])
    res = root.apply()
    assert res.rc == 3 and res.data["result"] == "blocked", str(res)
    assert [c["Names"][0].lstrip("/") for c in root.api.containers(all=True, filters={"name": name})] == [name]
    docker_cli("rm", name)


def test_a_paused_lane_is_recreated_not_counted_as_serving(root: Root) -> None:
    """A paused container of ours serves nothing: the plan recreates it rather than saying converged."""
    omni = split(root)
    apply_ok(root)
    name = root.cname(omni, "dark-compute-b")
    docker_cli("pause", name)
    plan = root.cli("plan", "--json")
    assert plan.rc == 2, str(plan)
    assert [(a["kind"], a["recipe"]) for a in plan.data["actions"]] == [("leave", omni), ("enter", omni)], str(plan)
    assert "is paused: it serves nothing" in plan.data["actions"][0]["reason"]
    apply_ok(root)
    assert root.running()[name]["State"] == "running"
    assert http_status(f"http://127.0.0.1:{root.port_of(omni)}/health") == 200
