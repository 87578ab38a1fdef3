"""Approvals like terraform's, through the real command line and the real engine: `apply` without a terminal
needs --yes or a saved plan; --json never prompts; `plan --out FILE` + `apply FILE` runs exactly the plan that was
saved, and a stale one is refused with what changed; after approval only the shown plan's steps run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import SLEEP, Root

from reconciler.apply.groups import within
from reconciler.plan.actions import Action, ActionKind, Plan

pytestmark = [pytest.mark.docker, pytest.mark.root]


def test_apply_without_a_terminal_or_yes_refuses_and_changes_nothing(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    r = root.cli("apply")  # stdin is not a terminal here (subprocess.run without input: /dev/null-like)
    assert r.rc == 1, r
    assert "nothing was changed" in r.stderr and "--yes" in r.stderr and "plan --out" in r.stderr
    assert "+ enter" in r.stdout  # the plan is still shown
    assert root.running() == {}
    j = root.cli("apply", "--json")
    assert j.rc == 1 and "--json never prompts" in j.stderr, j
    # stdout is JSON that says why, machine-readably, with the plan that was not run
    assert j.data["result"] == "error" and j.data["error"]["code"] == "approval_required", j
    assert "--yes" in j.data["error"]["message"] and [a["kind"] for a in j.data["plan"]["actions"]] == ["enter"], j
    assert root.running() == {}


def test_json_on_a_terminal_never_prompts(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    rc, text, asked = root.on_a_terminal("apply", "--json")
    assert rc == 1 and not asked, text
    assert "[y/N]" not in text and "--json never prompts" in text
    assert root.running() == {}


def test_saved_plan_applies_exactly_and_a_stale_one_is_refused(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    saved = tmp_path / "plan.json"
    p = root.cli("plan", "--out", str(saved))
    assert p.rc == 2, p
    doc = json.loads(saved.read_text())
    assert doc["format"] == "reconciler-plan/1" and doc["host"] == root.host
    assert [a["kind"] for a in doc["plan"]["actions"]] == ["enter"]
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    # Nothing is running, and that is a fact of the fingerprint too: a container started since makes it stale.
    # A container with no GPU, no offload and none of our labels cannot change the plan: it is not in the
    # fingerprint, so a busy engine does not make every saved plan stale.
    bystander = root.run_unmanaged("bystander", *SLEEP)
    assert root.cli("plan", "--out", str(tmp_path / "still.json")).rc == 2
    again = json.loads((tmp_path / "still.json").read_text())
    assert not any(bystander in line for line in again["fingerprint"]["parts"]["containers"])
    root.api.remove_container(bystander, force=True)
    gpu = f"NVIDIA_VISIBLE_DEVICES={root.slot_index['dark-compute-a']}"
    squatter = root.run_unmanaged("squatter", "-e", gpu, *SLEEP)
    r = root.cli("apply", str(saved))
    assert r.rc == 1, r
    assert "stale" in r.stderr and "containers: now " + squatter in r.stderr, r.stderr
    assert root.running() == {}
    root.api.remove_container(squatter, force=True)

    # An edited file makes it stale as well, and says which file.
    saved2 = tmp_path / "plan2.json"
    assert root.cli("plan", "--out", str(saved2)).rc == 2
    root.write_manifest_text(root.manifest_path.read_text() + "# edited\n")
    r = root.cli("apply", str(saved2), "--json")
    assert r.rc == 1 and r.data["result"] == "stale", r
    assert "manifests/demo.yaml edited" in r.data["changes"]

    # A fresh saved plan runs without --yes and without a terminal: it was approved by being saved.
    saved3 = tmp_path / "plan3.json"
    assert root.cli("plan", "--out", str(saved3)).rc == 2
    r = root.cli("apply", str(saved3), "--json")
    assert r.rc == 0 and r.data["result"] == "converged", r
    assert set(root.running()) == {root.cname(omni, "dark-compute-b")}


def test_a_plan_file_of_another_host_or_garbage_is_a_clear_error(root: Root, tmp_path: Path) -> None:
    bad = tmp_path / "junk.json"
    bad.write_text("{not json")
    r = root.cli("apply", str(bad))
    assert r.rc == 1 and "not a saved plan" in r.stderr and "Traceback" not in r.stderr, r
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({"format": "reconciler-plan/1", "host": "elsewhere", "fingerprint": {"files": {}, "parts": {}}})
    )
    r = root.cli("apply", str(other))
    assert r.rc == 1 and "a plan for host 'elsewhere'" in r.stderr, r
    r = root.cli("apply", str(tmp_path / "missing.json"))
    assert r.rc == 1 and "no such plan file" in r.stderr, r


def test_only_the_approved_steps_run() -> None:
    leave = Action(ActionKind.LEAVE, "not in the manifest", recipe="a", gpus=("x",), container="c", container_id="id1")
    enter = Action(ActionKind.ENTER, "wanted", recipe="b", gpus=("x",), recipe_hash="h1")
    reclaim = Action(ActionKind.RECLAIM, "orphans", paths=("/s/vllm_offload_1.mmap", "/s/vllm_offload_2.mmap"))
    approved = Plan(host="h", actions=(leave, reclaim, enter))
    assert within(approved, leave) is leave and within(approved, enter) is enter
    # Another container, another recipe hash, or a file the operator never saw: not approved.
    assert within(approved, Action(ActionKind.LEAVE, "x", container_id="id2")) is None
    assert within(approved, Action(ActionKind.ENTER, "x", recipe="b", gpus=("x",), recipe_hash="h2")) is None
    later = Action(ActionKind.RECLAIM, "orphans", paths=("/s/vllm_offload_2.mmap", "/s/vllm_offload_3.mmap"))
    assert within(approved, later).paths == ("/s/vllm_offload_2.mmap",)
    assert within(approved, Action(ActionKind.RECLAIM, "o", paths=("/s/vllm_offload_9.mmap",))) is None


def test_a_saved_plan_is_printed_before_the_progress_of_its_apply(root: Root, tmp_path: Path) -> None:
    """`apply FILE` shows the plan it runs first, as `apply --yes` does, and only once it holds: its steps' progress
    (stderr) follows it in one stream, and a stale plan prints no plan of its own (the refusal shows the plan now)."""
    import subprocess

    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    saved = tmp_path / "plan.json"
    assert root.cli("plan", "--out", str(saved)).rc == 2
    proc = subprocess.run(
        root.cli_args("apply", str(saved)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        env=root.env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    out = proc.stdout
    plan_at, step_at = out.find("Plan: 1 to enter"), out.find(f"enter {omni} on dark-compute-b: ok")
    assert 0 <= plan_at < step_at, out
