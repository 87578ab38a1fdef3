"""A plan's words match what apply does, and an apply that did its plan succeeds (docs/design.md, safety rules 3
and 13), through the real command line, the real engine and real fake-vllm lanes.

- With GPU telemetry required and NVML missing, apply refuses every action of the plan (a pass acts only on a whole
  view of the host): ``plan`` says so in its summary, from the very decision the applier takes
  (``Plan.apply_refusal``), rather than "apply runs the 1 action(s) above".
- A leaving lane that ignores SIGTERM is killed at its stop timeout (exit 137) and its leave keeps the container for
  its logs; the plan made after it wants that container pruned. That prune is the pass's own consequence, not a
  change of the host: ``apply --yes`` and ``apply FILE`` finish as planned, exit 0, and say what was kept; the next
  plan prunes it.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import CliResult, Root, build_image, make_root

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"

# The lane's first process after docker's init: it ignores SIGTERM and runs the server in a session of its own, out
# of reach of the init's forwarding, as a wrapper script that does not exec its server does. `docker stop` then
# waits out the recipe's stop timeout and kills the lane: exit 137.
DEAF_TO_SIGTERM = textwrap.dedent(
    """
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(subprocess.Popen(sys.argv[1:], start_new_session=True).wait())
    """
)


@pytest.fixture(scope="module")
def image(docker_api: Any) -> str:
    return build_image()


@pytest.fixture
def root(
    tmp_path: Path, tmpfs_dir: Path, docker_api: Any, image: str, request: pytest.FixtureRequest
) -> Iterator[Root]:
    r = make_root(tmp_path, shm=tmpfs_dir, api=docker_api, name=request.node.name)
    try:
        yield r
    finally:
        r.cleanup()


def _telemetry(root: Root, value: str) -> None:
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["gpu_telemetry"] = value
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))


def _with_proc_read(root: Root, *args: str) -> CliResult:
    """The command, asked again while a busy machine left /proc's scan incomplete (processes kept appearing: safety
    rule 2) before it did anything, so that NVML is the one source missing where the case needs it."""
    deadline = time.monotonic() + 60
    while True:
        res = root.cli(*args)
        text = res.stdout + res.stderr
        acted = args[0] == "apply" and "nothing changed" not in text
        if "processes kept appearing" not in text or acted or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


@pytest.mark.safety_rule(3)
def test_plan_names_what_apply_refuses_while_nvml_is_missing(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    entered = _with_proc_read(root, "apply", "--yes", "--json")
    assert entered.rc == 0, entered
    lane = root.cname(omni, B)
    # NVML required (gpu_telemetry: nvml) where no NVML library answers (the real pynvml, no fake): the lane on B is
    # to leave, and its replacement on A is blocked by the unavailable source.
    _telemetry(root, "nvml")
    root.env.pop("FAKE_NVML_FILE", None)
    root.manifest((omni, [A]))

    plan = _with_proc_read(root, "plan")
    shown = plan.stdout  # the text a person reads
    assert "gpu unavailable" in shown and f"leave   {omni} on {B}" in shown, plan
    assert "apply runs the" not in shown, plan
    assert (
        "Blocked: 1 problem(s); apply refuses all 1 action(s) above and changes nothing: the gpu source is unavailable"
        in shown
    ), plan
    data = _with_proc_read(root, "plan", "--json").data
    assert [a["kind"] for a in data["actions"]] == ["leave"] and data["unavailable"] == ["gpu"], data

    # What the plan said: apply refuses, changes nothing, and the lane keeps serving.
    applied = _with_proc_read(root, "apply", "--yes")
    assert applied.rc == 1 and "source unavailable: gpu (NVML" in applied.stderr, applied
    assert "nothing changed" in applied.stderr
    assert "Traceback" not in applied.stderr
    assert lane in root.running(), applied

    # A plan with nothing blocked says the same where it has actions.
    root.manifest()
    empty = _with_proc_read(root, "plan")
    assert "Apply refuses all 1 action(s) above and changes nothing: the gpu source is unavailable" in empty.stdout
    assert "Plan: 0 to enter, 1 to leave" not in empty.stdout, empty


def _deaf_lane(root: Root) -> str:
    """omni, its first process deaf to SIGTERM, with a stop timeout of 2 s; returns its recipe name."""
    omni = root.recipe("omni")
    data = root.recipe_data(omni)
    data["container"]["entrypoint"] = ["python3", "-c", DEAF_TO_SIGTERM]
    data["stop"]["timeout_s"] = 2
    root.write_recipe(omni, data)
    return omni


@pytest.mark.safety_rule(13)
@pytest.mark.parametrize("how", ["--yes", "saved plan"])
def test_an_apply_whose_leave_kept_its_lane_for_its_logs_finishes_as_planned(root: Root, how: str) -> None:
    omni = _deaf_lane(root)
    root.manifest((omni, [B]))
    entered = _with_proc_read(root, "apply", "--yes", "--json")
    assert entered.rc == 0, entered
    lane = root.cname(omni, B)
    lane_id = root.running()[lane]["Id"]

    root.manifest()  # the lane leaves; it ignores SIGTERM and is killed at its stop timeout
    if how == "--yes":
        done = _with_proc_read(root, "apply", "--yes", "--json")
    else:
        saved = root.path.parent / "plan.json"
        for _ in range(10):  # a container another test starts on this engine meanwhile makes the saved plan stale
            made = _with_proc_read(root, "plan", "--out", str(saved))
            assert made.rc == 2, made
            done = _with_proc_read(root, "apply", str(saved), "--json")
            if done.data["result"] != "stale":
                break
    out = done.data
    assert [(a["kind"], a["result"]) for a in out["actions"]] == [("leave", "ok")], done
    assert "exited with code 137" in out["actions"][0]["detail"], done
    assert done.rc == 0 and out["result"] == "converged", done
    [kept] = [c for c in root.containers() if c["Id"] == lane_id]
    kept_name = kept["Names"][0].lstrip("/")
    assert kept["State"] == "exited" and kept_name != lane, kept
    assert f"kept {kept_name} for its logs" in out["message"] and "the next plan prunes it" in out["message"], out

    # The prune is the next plan's, shown and done as any other step.
    after = _with_proc_read(root, "plan", "--json").data
    assert [(a["kind"], a["container"]) for a in after["actions"]] == [("prune", kept_name)], after
    pruned = _with_proc_read(root, "apply", "--yes", "--json")
    assert pruned.rc == 0 and [(a["kind"], a["result"]) for a in pruned.data["actions"]] == [("prune", "ok")], pruned
    assert not [c for c in root.containers() if c["Id"] == lane_id]


@pytest.mark.safety_rule(13)
def test_the_words_of_a_kept_lane_on_a_terminals_plain_output(root: Root) -> None:
    omni = _deaf_lane(root)
    root.manifest((omni, [B]))
    assert _with_proc_read(root, "apply", "--yes", "--json").rc == 0
    root.manifest()
    done = _with_proc_read(root, "apply", "--yes")
    assert done.rc == 0 and "Traceback" not in done.stderr, done
    assert "converged in" in done.stdout and "for its logs (stopped by this pass's leave" in done.stdout, done
    assert "the host changed after the plan was shown" not in done.stdout + done.stderr, done
