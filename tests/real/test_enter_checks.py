"""An enter's knowable failures are found by ``plan`` before any leave, and blockers are scoped to their slots
(docs/design.md, "Knowable failures of an enter" and safety rule 6): on the real engine, with real fake-vllm lanes
listening on real ports, through the real command line and loop; the pure parses on captured text (those of
/proc/net/tcp in tests/real/test_net_parse.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from e2e_helpers import LoopProcess, Root, free_port, set_flag

from reconciler.observe.containers import gpu_runtime_of, published_ports_of
from reconciler.plan.enter_checks import command_tensor_parallel_size

A, B = "dark-compute-a", "dark-compute-b"

# This engine's /info (Docker 20.10 from Debian, no NVIDIA toolkit), cut to what is read; and one after
# `nvidia-ctk runtime configure --runtime=docker`.
INFO_NO_TOOLKIT = {
    "Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}},
    "DefaultRuntime": "runc",
}
INFO_TOOLKIT = {"Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}}
INFO_CDI = {"Runtimes": {"runc": {}}, "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}


# ---------------------------------------------------------------- the pure parses


def test_the_engine_info_tells_whether_gpus_can_be_requested() -> None:
    state, detail = gpu_runtime_of(INFO_NO_TOOLKIT, engine="docker")
    assert state == "absent" and "runtimes: io.containerd.runc.v2, runc" in detail
    assert gpu_runtime_of(INFO_TOOLKIT, engine="docker")[0] == "present"
    assert gpu_runtime_of(INFO_CDI, engine="docker")[0] == "present"
    assert gpu_runtime_of(INFO_NO_TOOLKIT, engine="docker", hook_installed=True)[0] == "present"
    assert gpu_runtime_of(INFO_NO_TOOLKIT, engine="podman")[0] == "unknown", "Podman's CDI specs are not in /info"


def test_the_command_line_tensor_parallel_size_is_read_in_both_spellings() -> None:
    assert command_tensor_parallel_size(["vllm", "serve", "m", "--tensor-parallel-size", "2"]) == 2
    assert command_tensor_parallel_size(["vllm", "serve", "m", "--tensor-parallel-size=4"]) == 4
    assert command_tensor_parallel_size(["vllm", "serve", "m", "-tp", "1"]) == 1
    assert command_tensor_parallel_size(["vllm", "serve", "m"]) is None
    assert command_tensor_parallel_size(["vllm", "--tensor-parallel-size", "1", "--tensor-parallel-size", "2"]) == 2
    assert published_ports_of({"Ports": [{"PrivatePort": 8000, "PublicPort": 18000, "Type": "tcp"}, {}]}) == (18000,)


# ---------------------------------------------------------------- on the real engine


def _cid(root: Root, name: str) -> str:
    return str(root.running()[name]["Id"])


def _serve(root: Root) -> tuple[str, str]:
    """omni on dark-compute-b, converged; returns its recipe and container names."""
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    res = root.apply()
    assert res.rc == 0 and res.data["result"] == "converged", str(res)
    return omni, root.cname(omni, B)


def _blocked_and_untouched(root: Root, name: str, *needles: str) -> None:
    before = _cid(root, name)
    snapshot = root.snapshot()
    plan = root.cli("plan", "--json")
    assert plan.rc == 3 and plan.data["blocked"] is True, str(plan)
    assert [a for a in plan.data["actions"] if a["kind"] == "leave"] == [], "no leave for a blocked enter"
    reasons = " | ".join(b["reason"] for b in plan.data["blockers"])
    for needle in needles:
        assert needle in reasons, f"{needle!r} not in {reasons}"
    text = root.cli("plan")
    assert text.rc == 3 and needles[0] in text.stdout, str(text)
    res = root.apply()
    assert res.rc == 3 and res.data["result"] == "blocked", str(res)
    assert res.data["actions"] == []
    assert _cid(root, name) == before, "the running lane was left untouched"
    assert root.snapshot() == snapshot


def _refused_and_untouched(root: Root, name: str, needle: str) -> None:
    """An edit the loader refuses: plan and apply exit 1 naming it, and the running lane is left as it was."""
    before = _cid(root, name)
    snapshot = root.snapshot()
    plan = root.cli("plan", "--json")
    assert plan.rc == 1 and plan.data["error"]["code"] == "config_invalid", str(plan)
    assert needle in " | ".join(p["message"] for p in plan.data["error"]["problems"]), str(plan)
    res = root.apply()
    assert res.rc == 1, str(res)
    assert _cid(root, name) == before, "the running lane was left untouched"
    assert root.snapshot() == snapshot


@pytest.mark.docker
@pytest.mark.root
def test_a_recipe_edited_to_a_missing_image_is_blocked_by_plan_and_the_lane_keeps_serving(root: Root) -> None:
    omni, name = _serve(root)
    data = root.recipe_data(omni)
    data["container"]["image"] = f"myorg/vllm-openai:v0.99-{root.tag}"
    root.write_recipe(omni, data)
    _blocked_and_untouched(
        root, name, f"image myorg/vllm-openai:v0.99-{root.tag} is not present on this host: pull or build it"
    )


@pytest.mark.docker
@pytest.mark.root
def test_a_recipe_with_a_mismatched_tensor_parallel_size_is_blocked_and_the_lane_keeps_serving(root: Root) -> None:
    omni, name = _serve(root)
    data = root.recipe_data(omni)
    data["container"]["command"] = [*data["container"]["command"], "--tensor-parallel-size", "2"]
    root.write_recipe(omni, data)
    # The loader already refuses the edit (a broken edit changes nothing); the planner's own check stays behind it.
    _refused_and_untouched(root, name, "the server is told --tensor-parallel-size 2")


@pytest.mark.docker
@pytest.mark.root
def test_a_recipe_moved_onto_another_lanes_port_is_blocked_and_both_lanes_keep_serving(root: Root) -> None:
    omni = root.recipe("omni")
    data = root.recipe_data(omni)
    coder = f"coder-{root.tag}"
    port = free_port()
    data["container"]["command"] = set_flag(data["container"]["command"], "--port", str(port))
    data["health"]["url"] = f"http://127.0.0.1:{port}/health"
    data["model"]["id"] = data["container"]["command"][2] = f"e2e/{coder}"
    root.write_recipe(coder, data)
    root.manifest((omni, [B]), (coder, [A]))
    res = root.apply()
    assert res.rc == 0, str(res)
    omni_name, coder_name = root.cname(omni, B), root.cname(coder, A)
    omni_id = _cid(root, omni_name)
    # The coder recipe moved onto omni's port.
    taken = root.port_of(omni)
    data["container"]["command"] = set_flag(data["container"]["command"], "--port", str(taken))
    data["health"]["url"] = f"http://127.0.0.1:{taken}/health"
    root.write_recipe(coder, data)
    # Two host-network lanes of one manifest on one port: the loader refuses the edit, and nothing is touched.
    _refused_and_untouched(root, coder_name, f"both listen on port {taken}")
    assert _cid(root, omni_name) == omni_id


@pytest.mark.docker
@pytest.mark.root
def test_gpu_requests_on_an_engine_without_the_nvidia_runtime_block_naming_the_toolkit(
    root: Root, docker_api: Any
) -> None:
    """The engine's own /info says whether it has NVIDIA's runtime; the plan must say the same."""
    state, _ = gpu_runtime_of(docker_api.info(), engine="docker")
    path = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["docker"]["gpu_requests"] = True
    path.write_text(yaml.safe_dump(doc))
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    plan = root.cli("plan", "--json")
    reasons = " | ".join(b["reason"] for b in plan.data["blockers"])
    if state == "absent":
        assert plan.rc == 3, str(plan)
        assert "install the NVIDIA container toolkit" in reasons and "docker.gpu_requests: false" in reasons
        res = root.apply()
        assert res.rc == 3 and res.data["actions"] == [], str(res)
        assert root.containers() == [], "nothing is created"
    else:
        assert "NVIDIA container toolkit" not in reasons, str(plan)


@pytest.mark.docker
@pytest.mark.root
def test_a_squatter_on_one_slot_and_a_free_other_slot_apply_starts_the_free_lane_and_exits_3(
    root: Root, image: str
) -> None:
    omni = root.recipe("omni")
    data = root.recipe_data(omni)
    other = f"other-{root.tag}"
    port = free_port()
    data["container"]["command"] = set_flag(data["container"]["command"], "--port", str(port))
    data["health"]["url"] = f"http://127.0.0.1:{port}/health"
    data["model"]["id"] = data["container"]["command"][2] = f"e2e/{other}"
    root.write_recipe(other, data)
    a_index = root.slot_index[A]
    squatter = root.run_unmanaged(
        "squatter", "-e", f"NVIDIA_VISIBLE_DEVICES={a_index}", "-v", "/usr:/usr:ro", image, "sleep", "300"
    )
    root.manifest((other, [A]), (omni, [B]))
    plan = root.cli("plan", "--json")
    assert plan.rc == 3 and plan.data["blocked"] is True, str(plan)
    assert [(a["kind"], a["recipe"]) for a in plan.data["actions"]] == [("enter", omni)]
    text = root.cli("plan")
    assert "apply runs the 1 action(s) above and leaves the blocked slots as they are" in text.stdout, str(text)
    res = root.apply()
    assert res.rc == 3 and res.data["result"] == "blocked", str(res)
    assert [(a["kind"], a["recipe"], a["result"]) for a in res.data["actions"]] == [("enter", omni, "ok")]
    assert squatter in res.data["message"]
    assert set(root.running()) == {root.cname(omni, B)}


@pytest.mark.docker
@pytest.mark.root
def test_under_run_a_missing_image_for_the_tp2_lane_stops_nothing_pass_after_pass(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    _, name = _serve(root)
    before = _cid(root, name)
    lane = root.recipe("deepseek-256k-offload", offload_mib=16)
    data = root.recipe_data(lane)
    data["container"]["image"] = f"reconciler/missing:{root.tag}"
    root.write_recipe(lane, data)
    root.manifest((lane, [A, B]))
    lp = start_loop("--resync", "1", "--backoff-base", "1").started()
    passes = lp.wait("pass", timeout=30, count=4, result="blocked")
    assert all("is not present on this host" in p["message"] for p in passes), lp.log()
    time.sleep(0.5)
    assert _cid(root, name) == before, "the serving lane was never stopped"
    assert not lp.find("action"), lp.log()
    assert [c["Names"][0].lstrip("/") for c in root.containers()] == [name], "nothing created"
    assert lp.stop() == 0


@pytest.mark.docker
@pytest.mark.root
def test_a_recipe_without_health_enters_once_running_for_settle_s(root: Root) -> None:
    """[health] is optional: without a URL a lane is serving once it runs, not restarted, for settle_s."""
    omni = root.recipe("omni")
    data = root.recipe_data(omni)
    data.pop("probes", None)
    data["health"] = {"settle_s": 1, "start_timeout_s": 20}
    root.write_recipe(omni, data)
    root.manifest((omni, [B]))
    data["health"]["settle_s"] = 3
    root.write_recipe(omni, data)
    t0 = time.monotonic()
    res = root.cli("apply", "--yes")
    assert res.rc == 0 and "converged" in res.stdout, str(res)
    assert time.monotonic() - t0 < 15, "the enter waited for a health URL it does not have"
    assert "waiting for its health URL" not in res.stderr, str(res)
    assert "no health URL" in res.stderr, str(res)
    assert root.cname(omni, B) in root.running()
    assert root.cli("plan", "--json").rc == 0


# ---------------------------------------------------------------- kept failed containers


def _fail_once(root: Root) -> tuple[str, str]:
    """A lane on dark-compute-a whose start crashes at once: its container is kept for its logs. Returns the recipe
    and the kept container's name."""
    crashy = root.recipe("omni", mode="crash-after=0")
    root.manifest((crashy, [A]))
    res = root.apply()
    assert res.rc == 1 and res.data["result"] == "failed", str(res)
    kept = [c["Names"][0].lstrip("/") for c in root.containers() if "-failed-" in c["Names"][0]]
    assert len(kept) == 1, root.containers()
    return crashy, kept[0]


@pytest.mark.docker
@pytest.mark.root
def test_kept_failed_containers_are_pruned_by_the_plan_once_their_assignment_is_gone(root: Root) -> None:
    _, kept = _fail_once(root)
    plan = root.cli("plan", "--json")
    assert "prune" not in [a["kind"] for a in plan.data["actions"]], "kept while its assignment stays"
    root.manifest()
    plan = root.cli("plan", "--json")
    assert plan.rc == 2, str(plan)
    assert [(a["kind"], a["container"]) for a in plan.data["actions"]] == [("prune", kept)], str(plan)
    assert "no longer in the manifest" in plan.data["actions"][0]["reason"]
    assert f"x prune   {kept}" in root.cli("plan").stdout
    res = root.apply()
    assert res.rc == 0 and [(a["kind"], a["result"]) for a in res.data["actions"]] == [("prune", "ok")], str(res)
    assert root.containers() == []
    assert root.cli("plan", "--json").rc == 0


@pytest.mark.docker
@pytest.mark.root
def test_reconciler_prune_shows_the_kept_failed_containers_and_removes_them_only_with_confirm(
    root: Root, image: str
) -> None:
    _, kept = _fail_once(root)
    foreign = root.run_unmanaged("stopped-foreign", "-v", "/usr:/usr:ro", image, "true")
    dry = root.cli("prune")
    assert dry.rc == 0 and kept in dry.stdout and "prune --confirm" in dry.stdout, str(dry)
    assert kept in {c["Names"][0].lstrip("/") for c in root.containers()}
    data = root.cli("prune", "--json").data
    assert data["confirmed"] is False and [c["name"] for c in data["kept_failed"]] == [kept]
    done = root.cli("prune", "--confirm", "--json")
    assert done.rc == 0 and done.data["removed"] == [kept], str(done)
    assert root.containers() == []
    assert [c["Names"][0].lstrip("/") for c in root.unmanaged()] == [foreign], "what is not ours stays"
    assert "no failed containers kept" in root.cli("prune").stdout
