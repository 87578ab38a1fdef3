"""The approved plan is the contract: a saved plan (``plan --out`` + ``apply FILE``, ``GET /v1/plan?save=true`` +
``POST /v1/apply``, MCP ``host_plan`` + ``host_manage apply``) or the plan shown at the prompt is rebuilt, compared
with the plan made now (actions with their paths, container ids and hashes, blockers, held lanes, fallbacks), and any
difference, like any change of an input the fingerprint covers, is stale: refused, nothing changed. A loop-served
apply plans with the loop's view (its backoff and fallback). Real command line, real engine, real loop, real tmpfs;
the GPU view alone is simulated (``tests/data/fake_nvml``: NVML's answers from a file the test edits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from e2e_helpers import LoopProcess, Root, wait_until

from real.test_api import TOKEN, Api, token_file
from real.test_mcp import on_http, structured
from reconciler.plan.actions import Action, ActionKind, Blocker, Fallback, Held, Plan
from reconciler.plan.causes import BlockerCause

A, B = "dark-compute-a", "dark-compute-b"
GIB = 1 << 30
FAKE_NVML = Path(__file__).parent.parent / "data" / "fake_nvml"


# ---------------------------------------------------------------- pure


def _plan(**kw: Any) -> Plan:
    return Plan(host="h", **kw)


def test_any_difference_of_the_plan_is_named_and_reasons_and_clocks_are_not() -> None:
    from reconciler.plan.fingerprint import plan_differences

    leave = Action(ActionKind.LEAVE, "not wanted", recipe="r", gpus=(B,), container="c", container_id="id1")
    enter = Action(ActionKind.ENTER, "wanted", recipe="s", gpus=(B,), recipe_hash="h1", bytes=8)
    fb = Fallback("omni", (B,), "lane", (A, B), next_attempt_s=59.0)
    held = Held("lane", (A, B), "in backoff; next try in 59 s")
    shown = _plan(actions=(leave,), held=(held,), fallbacks=(fb,)).to_json()
    later = _plan(
        actions=(Action(ActionKind.LEAVE, "reworded", recipe="r", gpus=(B,), container="c", container_id="id1"),),
        held=(Held("lane", (A, B), "in backoff; next try in 3 s"),),
        fallbacks=(Fallback("omni", (B,), "lane", (A, B), next_attempt_s=3.0),),
    ).to_json()
    assert plan_differences(shown, later) == []
    # A file the leave now lists, another container id, another hash, a blocker gone, the hold ended: all stale.
    cases = [
        _plan(actions=(replace(leave, paths=("/s/vllm_offload_1.mmap",)),), held=(held,), fallbacks=(fb,)),
        _plan(actions=(replace(leave, container_id="id2"),), held=(held,), fallbacks=(fb,)),
        _plan(actions=(leave, enter), held=(held,), fallbacks=(fb,)),
        _plan(actions=(leave,), held=(held,)),
        _plan(actions=(leave,), fallbacks=(fb,)),
    ]
    for p in cases:
        assert plan_differences(shown, p.to_json()), p
    blocked = _plan(
        blockers=(Blocker("s", (B,), "20 GiB in use, no process listed", "", cause=BlockerCause.MEMORY),)
    ).to_json()
    free = _plan(actions=(enter,)).to_json()
    diff = plan_differences(blocked, free)
    assert any(line.startswith("plan: no longer blocked s@dark-compute-b") for line in diff), diff
    assert "plan: now enter s@dark-compute-b" in diff, diff
    # In words, never the facts' internals (issue 44, item 5).
    assert not [line for line in diff if "id=" in line or "hash=" in line or "bytes=" in line], diff
    edited = plan_differences(
        _plan(actions=(enter,)).to_json(), _plan(actions=(replace(enter, recipe_hash="h2"),)).to_json()
    )
    assert edited == ["plan: enter s@dark-compute-b: its recipe was edited (it would make another container)"], edited
    other = plan_differences(
        shown, _plan(actions=(replace(leave, container_id="id2"),), held=(held,), fallbacks=(fb,)).to_json()
    )
    assert other == ["plan: leave c (r@dark-compute-b): another container (id2, was id1)"], other
    assert plan_differences(_plan(actions=(leave, enter)).to_json(), _plan(actions=(enter, leave)).to_json())


def test_a_plan_rebuilt_from_its_json_is_the_same_plan() -> None:
    from reconciler.plan.actions import plan_from_json

    p = _plan(
        actions=(
            Action(ActionKind.LEAVE, "x", recipe="r", gpus=(B,), container="c", container_id="id1", paths=("/s/f",)),
            Action(ActionKind.ENTER, "y", recipe="s", gpus=(A, B), recipe_hash="h", bytes=3),
        ),
        blockers=(Blocker("t", (A,), "held", "squatter", cause=BlockerCause.HELD),),
        held=(Held("lane", (A, B), "z"),),
        fallbacks=(Fallback("omni", (B,), "lane", (A, B)),),
        satisfied=("reconciler-omni-b",),
        unavailable=("gpu",),
    )
    back = plan_from_json(json.loads(json.dumps(p.to_json())))
    assert back.to_json() == p.to_json()
    with pytest.raises(ValueError, match="not a plan"):
        plan_from_json({"actions": [{"kind": "enter"}]})


def test_a_fingerprint_of_an_earlier_version_reads_as_version_1() -> None:
    from reconciler.plan.fingerprint import Fingerprint

    assert Fingerprint.from_json({"files": {}, "parts": {}}).version == 1
    assert Fingerprint.from_json({"files": {}, "parts": {}, "version": 2}).version == 2


# ---------------------------------------------------------------- helpers


def _nvml(root: Root, tmp_path: Path, used: dict[str, int]) -> Path:
    """Give ``root`` the GPU telemetry ``nvml``, its answers from a file (``used``: slot -> bytes in use that no
    process lists); the environment of every command and loop of the root reads it."""
    f = tmp_path / "nvml.json"
    _set_used(root, f, used)
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["gpu_telemetry"] = "nvml"
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    root.env["FAKE_NVML_FILE"] = str(f)
    root.env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), *filter(None, [os.environ.get("PYTHONPATH")])])
    return f


def _set_used(root: Root, f: Path, used: dict[str, int]) -> None:
    top = max(root.slot_index.values())
    devices = {str(i): {"total": 80 * GIB, "used": 0} for i in range(top + 1)}
    for slot, n in used.items():
        devices[str(root.slot_index[slot])]["used"] = n
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(json.dumps({"devices": devices}))
    tmp.replace(f)


def _ids(root: Root) -> dict[str, str]:
    return {c["Names"][0].lstrip("/"): c["Id"] for c in root.containers() if c["State"] == "running"}


def _apply_on_a_terminal(root: Root, during: Callable[[], None], *, answer: bytes = b"y\n") -> tuple[int, str]:
    """``reconciler apply`` on a real terminal: wait for its prompt, run ``during`` while it waits, then answer."""

    def at_prompt() -> bytes:
        during()
        return answer

    rc, text, asked = root.on_a_terminal("apply", timeout=90, on_prompt=at_prompt)
    assert asked, text
    return rc, text


# ---------------------------------------------------------------- saved plans, stand-alone


@pytest.mark.docker
@pytest.mark.root
def test_a_saved_plan_blocked_by_unlisted_vram_is_stale_once_the_vram_is_freed(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    nvml = _nvml(root, tmp_path, {B: 20 * GIB})
    root.manifest((omni, [B]))
    saved = tmp_path / "blocked.json"
    p = root.cli("plan", "--out", str(saved), "--json")
    assert p.rc == 3 and [b["cause"] for b in p.data["blockers"]] == ["memory"], p
    _set_used(root, nvml, {})
    assert root.cli("plan", "--json").rc == 2  # unblocked now: the plan would enter
    r = root.cli("apply", str(saved), "--json")
    assert r.rc == 1 and r.data["result"] == "stale", r
    assert any("plan: no longer blocked" in c for c in r.data["changes"]), r.data["changes"]
    assert any(c.startswith("gpu_memory: now dark-compute-b") for c in r.data["changes"]), r.data["changes"]
    assert root.containers() == [], "nothing was started"


def _with_secret(root: Root, tmp_path: Path) -> tuple[str, Path]:
    env_file = tmp_path / "secrets.env"
    env_file.write_text("HF_TOKEN=hf_first_0123456789\n")
    env_file.chmod(0o600)
    return root.with_secret(env_file, B), env_file


@pytest.mark.docker
@pytest.mark.root
def test_a_secret_rotated_after_saving_makes_the_saved_plan_stale(root: Root, tmp_path: Path) -> None:
    _omni, env_file = _with_secret(root, tmp_path)
    assert root.apply().rc == 0
    before = _ids(root)
    saved = tmp_path / "nothing.json"
    assert root.cli("plan", "--out", str(saved)).rc == 0
    env_file.write_text("HF_TOKEN=hf_rotated_9876543210\n")
    r = root.cli("apply", str(saved), "--json")
    assert r.rc == 1 and r.data["result"] == "stale", r
    assert any(c.startswith("secrets: now values sha256:") for c in r.data["changes"]), r.data["changes"]
    assert "9876543210" not in r.stdout + r.stderr
    assert _ids(root) == before, "not recreated"


@pytest.mark.docker
@pytest.mark.root
def test_a_saved_plan_of_an_earlier_version_is_refused_as_stale(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    saved = tmp_path / "old.json"
    assert root.cli("plan", "--out", str(saved)).rc == 2
    doc = json.loads(saved.read_text())
    # No version (the first release), and 2: the release before the desired state was held as values.
    for version in (None, 2):
        if version is None:
            del doc["fingerprint"]["version"]
        else:
            doc["fingerprint"]["version"] = version
        saved.write_text(json.dumps(doc))
        r = root.cli("apply", str(saved))
        assert r.rc == 1 and "saved by an earlier version of reconciler" in r.stderr, r
        assert "save it again (`reconciler plan --out FILE`)" in r.stderr, r
    assert root.containers() == []


@pytest.mark.docker
@pytest.mark.root
def test_a_plan_saved_under_one_commit_is_stale_once_the_next_changed_only_a_probe(root: Root, tmp_path: Path) -> None:
    """Desired state from a real git repository: a plan saved under commit A, then commit B, which changes only the
    lane's preflight probe (no part of the recipe's hash), taken by the host before the saved plan is applied. The
    fingerprint holds the desired state as values and the commit in use, and the plan each action's full recipe:
    refused as stale (exit 1), the commits and the probe named in words, nothing started (safety rule 13)."""
    import tomllib

    from e2e_helpers import dump_recipe

    from real.test_git_source import Repo, follow

    omni = root.recipe("omni")
    data = tomllib.loads((root.path / "configs" / "recipes" / f"{omni}.toml").read_text())
    (smoke,) = [p for p in data["probes"] if p["name"] == "smoke"]
    repo = Repo(tmp_path / "repo")
    repo.write(f"configs/recipes/{omni}.toml", dump_recipe(data))
    repo.manifest(root.host, (omni, [B]))
    first = repo.commit("omni on b")
    follow(root, str(repo.path))
    assert root.cli("sync").rc == 0
    saved = tmp_path / "under-a.json"
    p = root.cli("plan", "--out", str(saved), "--json")
    assert p.rc == 2 and [a["kind"] for a in p.data["actions"]] == ["enter"], p
    doc = json.loads(saved.read_text())
    assert doc["fingerprint"]["parts"]["source"] == [f"commit {first}"], doc["fingerprint"]["parts"]["source"]

    smoke["max_latency_s"] = 9  # the preflight probe alone: the recipe's hash leaves probes out
    repo.write(f"configs/recipes/{omni}.toml", dump_recipe(data))
    second = repo.commit("omni: a slower smoke probe")
    r = root.cli("--json", "sync")
    assert r.rc == 0 and r.data["source"]["commit"] == second, r
    assert root.cli("plan", "--json").data["actions"] == p.data["actions"], "the same steps under commit B"

    words = f"the git source moved from {first[:7]} to {second[:7]}: recipe {omni}'s probe smoke changed"
    r = root.cli("apply", str(saved), "--json")
    assert r.rc == 1 and r.data["result"] == "stale", r
    assert words in r.data["changes"], r.data["changes"]
    assert any(c.startswith(f"plan: enter {omni}@") for c in r.data["changes"]), r.data["changes"]
    r = root.cli("apply", str(saved))
    assert r.rc == 1 and "is stale; nothing was changed" in r.stderr and words in r.stderr, r
    assert root.containers() == [], "nothing was started"
    # Saved again under commit B, it runs (saved again while other tests' containers on this engine made it stale).

    def again() -> dict[str, Any]:
        assert root.cli("plan", "--out", str(saved)).rc == 2
        return root.cli("apply", str(saved), "--json").data  # type: ignore[no-any-return]

    assert _unless_the_engine_moved(again)["result"] == "converged"


# ---------------------------------------------------------------- the prompt


HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
os.close(fd)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.read()
"""


@pytest.mark.docker
@pytest.mark.root
def test_a_manifest_edited_at_the_prompt_shows_the_new_plan_in_words(root: Root) -> None:
    """The manifest edited while the prompt waits: the refusal names what changed in words (no ``id=None``,
    ``hash=``, ``bytes=``) and "The plan now:" is the new files' plan, not the one shown before (issue 44, item 5)."""
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    rc, text = _apply_on_a_terminal(root, lambda: root.manifest((omni, [A])))
    assert rc == 1 and "changed while the plan waited for approval" in text, text
    stale, now = text.split("The plan now:", 1)
    assert f"plan: no longer enter {omni}@{B}" in stale and f"plan: now enter {omni}@{A}" in stale, text
    assert not [w for w in ("id=", "hash=", "bytes=", "None") if w in stale.split("What changed:", 1)[1]], text
    assert f"{omni}@{A}" in now or f"{omni} on {A}" in now, text
    assert B not in now.split("\n", 2)[-1], "the old plan was shown as the plan now:\n" + text
    assert root.containers() == [], "nothing was started"


@pytest.mark.docker
@pytest.mark.root
def test_a_reader_letting_go_during_the_prompt_gets_no_file_unlinked(root: Root) -> None:
    lane = root.recipe("deepseek-256k-offload", offload_mib=4)
    root.manifest((lane, [A, B]))
    assert root.apply().rc == 0
    (f,) = [root.shm / n for n in root.shm_files() if n.startswith("vllm_offload_")]
    reader = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(f)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
        root.manifest()
        shown = root.cli("plan", "--json").data
        assert [(a["kind"], a["paths"]) for a in shown["actions"]] == [("leave", [])], shown

        def let_go() -> None:
            reader.kill()
            reader.wait(timeout=10)

        rc, text = _apply_on_a_terminal(root, let_go)
    finally:
        reader.kill()
        reader.wait(timeout=10)
    assert rc == 1 and "changed while the plan waited for approval" in text, text
    assert "holders: " in text, text
    assert f.exists(), "a file the plan on screen did not list was unlinked"
    assert set(root.running()) == {root.cname(lane, A, B)}, "nothing was done"


@pytest.mark.docker
@pytest.mark.root
def test_an_adopt_during_the_prompt_stops_no_container_that_was_not_on_screen(
    root: Root, tmp_path: Path, image: str, start_loop: Callable[..., LoopProcess]
) -> None:
    from reconciler.load.desired import load_desired

    omni = root.recipe("omni")
    labels = {
        "io.reconciler.managed": "true",
        "io.reconciler.host": root.host,
        "io.reconciler.recipe": omni,
        "io.reconciler.recipe-hash": load_desired(root.path).recipes[omni].content_hash(),
        "io.reconciler.slots": A,
    }
    legacy = root.run_unmanaged(
        "legacy",
        *(a for k, v in labels.items() for a in ("--label", f"{k}={v}")),
        "-e",
        f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}",
        "-v",
        "/usr:/usr:ro",
        image,
        "sleep",
        "300",
    )
    root.manifest()
    lp = start_loop().started()
    lp.wait("pass", result="converged", timeout=30)
    # An orphan the loop has not reclaimed yet (nothing woke it): the plan on screen is that reclaim alone.
    orphan = root.shm / "vllm_offload_orphan.mmap"
    orphan.write_bytes(b"\0" * 4096)
    shown = root.cli("plan", "--json").data
    assert [a["kind"] for a in shown["actions"]] == ["reclaim"], shown

    def adopt() -> None:
        r = root.cli("adopt", legacy)
        assert r.rc == 0, r

    rc, text = _apply_on_a_terminal(root, adopt)
    assert rc == 1 and "changed while the plan waited for approval" in text, text
    assert "ownership: now adopted" in text, text
    state = root.api.inspect_container(legacy)["State"]["Status"]
    assert state == "running", "a container that was not on screen was stopped"


@pytest.mark.docker
@pytest.mark.root
def test_a_commit_taken_while_the_prompt_waits_makes_the_approval_stale(
    root: Root, tmp_path: Path, start_loop: Callable[..., LoopProcess]
) -> None:
    """An interactive apply the loop serves, with desired state from git: while its prompt waits, `reconciler sync`
    takes a commit that changes only the lane's preflight probe. The answer finds the desired state loaded again
    and the approval stale, in words; nothing starts (safety rule 13)."""
    import time
    import tomllib

    from e2e_helpers import dump_recipe

    from real.test_git_source import Repo, follow

    omni = root.recipe("omni")
    data = tomllib.loads((root.path / "configs" / "recipes" / f"{omni}.toml").read_text())
    repo = Repo(tmp_path / "repo")
    repo.write(f"configs/recipes/{omni}.toml", dump_recipe(data))
    repo.manifest(root.host)
    repo.commit("nothing yet")
    follow(root, str(repo.path))
    assert root.cli("sync").rc == 0
    lp = start_loop("--debounce", "60").started()
    # A file event: the loop's next pass waits out its 60 s debounce, so it enters nothing meanwhile.
    mark = lp.mark()
    (root.path / "configs" / "touch.txt").write_text(str(time.time()))
    time.sleep(0.3)
    repo.manifest(root.host, (omni, [B]))
    first = repo.commit("omni on b")
    assert root.cli("sync").rc == 0

    def take_a_probe_change() -> None:
        (smoke,) = [p for p in data["probes"] if p["name"] == "smoke"]
        smoke["max_latency_s"] = 9
        repo.write(f"configs/recipes/{omni}.toml", dump_recipe(data))
        nonlocal second
        second = repo.commit("omni: a slower smoke probe")
        assert root.cli("sync").rc == 0

    second = ""
    rc, text = _apply_on_a_terminal(root, take_a_probe_change)
    assert not lp.find("pass", after=mark), "the loop passed within its debounce"
    assert rc == 1 and "changed while the plan waited for approval" in text, text
    words = f"the git source moved from {first[:7]} to {second[:7]}: recipe {omni}'s probe smoke changed"
    assert words in text, text
    assert root.containers() == [], "nothing was started"


# ---------------------------------------------------------------- served by the loop: command line, API, MCP


def _unless_the_engine_moved(call: Callable[[], dict[str, Any]], tries: int = 6) -> dict[str, Any]:
    """Plan and apply again while the plan went stale only for containers of other tests on this shared engine
    (their GPU ids and labels are in every fingerprint: they may hold a slot): the answer of the first try that
    nothing else made stale."""
    for _ in range(tries):
        res = call()
        if res.get("result") != "stale" or any(not c.startswith("containers: ") for c in res.get("changes", ())):
            return res
    return res


def _mcp_apply(api: Api, plan_id: str) -> dict[str, Any]:
    async def call(session: Any) -> dict[str, Any]:
        return structured(await session.call_tool("host_manage", {"action": "apply", "plan_id": plan_id}))

    return anyio.run(on_http, f"{api.base}/mcp", TOKEN, call, backend="asyncio")  # type: ignore[no-any-return]


def _mcp_plan(api: Api) -> dict[str, Any]:
    async def call(session: Any) -> dict[str, Any]:
        return structured(await session.call_tool("host_plan", {}))

    return anyio.run(on_http, f"{api.base}/mcp", TOKEN, call, backend="asyncio")  # type: ignore[no-any-return]


@pytest.mark.docker
@pytest.mark.root
def test_loop_served_saved_plans_blocked_by_vram_are_stale_once_it_is_freed(
    root: Root, tmp_path: Path, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    nvml = _nvml(root, tmp_path, {B: 20 * GIB})
    root.manifest((omni, [B]))
    lp = start_loop("--api-token-file", str(token_file(tmp_path))).started()
    lp.wait("pass", result="blocked", timeout=30)
    api = Api(f"http://{lp.addr}", TOKEN)
    saved = tmp_path / "blocked.json"
    assert root.cli("plan", "--out", str(saved)).rc == 3
    status, _, body = api.get("/v1/plan?save=true")
    assert status == 200 and body["blocked"], body
    mcp_plan = _mcp_plan(api)
    assert mcp_plan["blocked"], mcp_plan
    _set_used(root, nvml, {})  # freed; the loop has not looked again yet (nothing woke it)
    r = root.cli("apply", str(saved), "--json")
    assert r.rc == 1 and r.data["result"] == "stale", r
    status, _, stale = api.post("/v1/apply", {"plan_id": body["plan_id"]})
    assert status == 409 and stale["result"] == "stale", (status, stale)
    assert any("plan: no longer blocked" in c for c in stale["changes"]), stale
    m = _mcp_apply(api, mcp_plan["plan_id"])
    assert m["result"] == "stale", m
    assert root.containers() == [], "nothing was started"


@pytest.mark.docker
@pytest.mark.root
def test_loop_served_saved_plans_of_a_held_lane_keep_its_fallback(
    root: Root, tmp_path: Path, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    fault = root.shm / "lane-fault"
    fault.write_text("fail-start\n")
    lane = root.recipe("deepseek-256k-offload", offload_mib=4, env={"FAKE_VLLM_MODE_FILE": str(fault)})
    lp = start_loop("--backoff-base", "300", "--api-token-file", str(token_file(tmp_path))).started()
    api = Api(f"http://{lp.addr}", TOKEN)
    mark = lp.mark()
    root.manifest((omni, [B]))
    lp.wait("pass", after=mark, result="converged", timeout=60)
    mark = lp.mark()
    root.manifest((lane, [A, B]))
    lp.wait("pass", after=mark, result="failed", timeout=90)
    wait_until(
        lambda: root.cli("plan", "--json").data["fallbacks"],
        timeout=10,
        what="the plan showing the fallback",
        every=0.3,
    )
    serving = _ids(root)
    assert set(serving) == {root.cname(omni, B)}
    saved = tmp_path / "held.json"
    p = root.cli("plan", "--out", str(saved), "--json")
    assert p.data["held"] and p.data["fallbacks"] and p.data["actions"] == [], p.data

    def cli() -> dict[str, Any]:
        assert root.cli("plan", "--out", str(saved)).rc in (2, 3, 4)  # 4: held, nothing else to do
        return root.cli("apply", str(saved), "--json").data  # type: ignore[no-any-return]

    def http() -> dict[str, Any]:
        status, _, body = api.get("/v1/plan?save=true")
        assert status == 200 and body["held"], body
        return api.post("/v1/apply", {"plan_id": body["plan_id"]})[2]  # type: ignore[no-any-return]

    def mcp() -> dict[str, Any]:
        return _mcp_apply(api, _mcp_plan(api)["plan_id"])

    for front in (cli, http, mcp):
        res = _unless_the_engine_moved(front)
        assert res["result"] == "held" and res["actions"] == [], (front.__name__, res)
    assert _ids(root) == serving, "the fallback serving the held lane's slot was not taken down"


@pytest.mark.docker
@pytest.mark.root
def test_loop_served_saved_plans_are_stale_once_a_secret_is_rotated(
    root: Root, tmp_path: Path, start_loop: Callable[..., LoopProcess]
) -> None:
    _omni, env_file = _with_secret(root, tmp_path)
    lp = start_loop("--api-token-file", str(token_file(tmp_path))).started()
    lp.wait("pass", result="converged", timeout=60)
    wait_until(lambda: _ids(root), timeout=30, what="the lane running")
    api = Api(f"http://{lp.addr}", TOKEN)
    before = _ids(root)
    status, _, body = api.get("/v1/plan?save=true")
    assert status == 200 and body["actions"] == [], body
    mcp_plan = _mcp_plan(api)
    env_file.write_text("HF_TOKEN=hf_rotated_9876543210\n")  # outside the root: nothing wakes the loop
    status, _, stale = api.post("/v1/apply", {"plan_id": body["plan_id"]})
    assert status == 409 and stale["result"] == "stale", (status, stale)
    assert any(c.startswith("secrets: now values sha256:") for c in stale["changes"]), stale
    m = _mcp_apply(api, mcp_plan["plan_id"])
    assert m["result"] == "stale", m
    assert "9876543210" not in json.dumps(stale) + json.dumps(m)
    assert _ids(root) == before, "not recreated"


def test_every_input_of_the_planner_is_in_the_fingerprint_and_small_jitter_is_not() -> None:
    from dataclasses import replace as r

    from planner_fixtures import make_desired, make_observed

    from reconciler.plan.fingerprint import input_parts
    from reconciler.plan.observed import Owner, Ownership, ShmFile, Tmpfs

    case = {"recipes": {"omni": {}}, "manifest": [{"omni": [B]}], "telemetry": "nvml", "observed": {}}
    desired = make_desired(case)
    observed = make_observed(case, desired)
    slot = observed.gpus.slots[B]
    base_view: dict[str, Any] = {}
    base = input_parts(desired, observed, base_view)
    f = ShmFile("/s/vllm_offload_1.mmap", 1, 2, 3, 3)
    with_file = r(observed, shm=r(observed.shm, files=(f,)))
    moved = {
        "gpu_memory": r(
            observed,
            gpus=r(
                observed.gpus,
                slots={
                    **observed.gpus.slots,
                    B: r(slot, memory_used_bytes=20 * GIB, memory_free_bytes=60 * GIB, memory_total_bytes=80 * GIB),
                },
            ),
        ),
        "tmpfs": r(observed, shm=r(observed.shm, tmpfs=Tmpfs(80 * GIB, GIB, 79 * GIB))),
        "holders": r(with_file, shm=r(with_file.shm, files=(r(f, owners=(Owner(42, "map"),)),))),
        "ownership": r(observed, ownership=Ownership(install_id="a" * 32, adopted=frozenset({"b" * 64}))),
    }
    for part, obs in moved.items():
        now = input_parts(desired, obs, base_view)
        assert now[part] != (input_parts(desired, with_file, base_view) if part == "holders" else base)[part], part
    rotated = r(desired, secret_digests={"HF_TOKEN": "0" * 64})
    assert input_parts(rotated, observed, base_view)["secrets"] != base["secrets"]
    held = input_parts(desired, observed, {"hold": {f"omni@{B}": "backoff"}, "last_good": [("omni", (B,))]})
    assert held["loop"] != base["loop"] and any("holds omni@" in x for x in held["loop"])
    # A few pages more or less in use, on the card or the tmpfs, move no figure: 256 MiB and 64 MiB steps.
    t = observed.shm.tmpfs
    jitter = r(
        observed, shm=r(observed.shm, tmpfs=Tmpfs(t.size_bytes, t.used_bytes + 8192, max(0, t.free_bytes - 8192)))
    )
    assert input_parts(desired, jitter, base_view)["tmpfs"] == base["tmpfs"]
    # A countdown is no part of the loop's view.
    a = input_parts(desired, observed, {"hold": {"k": "next try in 59 s"}, "next_attempt": {"k": 59.0}})
    b = input_parts(desired, observed, {"hold": {"k": "next try in 3 s"}, "next_attempt": {"k": 3.0}})
    assert a["loop"] == b["loop"]
