"""The per-card free-VRAM reserve and WSL2's GPU telemetry: the host file's keys, the verdict an enter gets, what
status (text and JSON) and the metrics say, on NVML answers captured on an H200 and built in WSL2's shapes
(tests/data/nvml/). Pure: no GPU, no Docker."""

from __future__ import annotations

from typing import Any

import pytest
from planner_fixtures import make_desired, make_observed
from pydantic import ValidationError

from reconciler.apply.applier import Applier
from reconciler.apply.errors import BelowReserve
from reconciler.cli.render import Style, render_status
from reconciler.loop.metrics import Metrics
from reconciler.model import GIB, HostConfig, Recipe, container_name
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.planner import plan
from reconciler.plan.vram import enter_reserve_verdict, unlisted_used_bytes, vram_by_slot
from reconciler.service.status import status_data

EXCLUSIVE: dict[str, Any] = {
    "telemetry": "nvml",
    "nvml": "wsl2-exclusive-below-reserve.json",
    "recipes": {"deepseek": {"tp": 2}},
    "manifest": [{"deepseek": ["dark-compute-a", "dark-compute-b"]}],
    "observed": {
        "containers": [
            {
                "name": "reconciler-deepseek-dark-compute-a-dark-compute-b",
                "managed": True,
                "recipe": "deepseek",
                "slots": ["dark-compute-a", "dark-compute-b"],
            }
        ]
    },
}


def _status(case: dict[str, Any]) -> tuple[dict[str, Any], str]:
    desired = make_desired(case)
    observed = make_observed(case, desired)
    data = status_data(desired, observed, plan(desired, observed))
    return data, render_status(data, Style(color=False))


# ---------------------------------------------------------------- the host file


def test_defaults_and_overrides() -> None:
    host = HostConfig.model_validate(
        {
            "name": "h",
            "gpus": {"a": {"index": 0, "free_gib": 5}, "b": {"index": 1}},
            "gpu_reserve": {"idle_used_gib": 2},
        }
    )
    assert host.gpu_reserve.free_gib == 3.0 and host.gpu_reserve.policy == "report"
    assert host.reserve_bytes("a") == 5 * GIB and host.reserve_bytes("b") == 3 * GIB
    assert host.idle_used_bytes("a") == 2 * GIB
    assert host.page_cache.drop_after_leave is False


@pytest.mark.parametrize(
    "extra",
    [
        {"gpu_reserve": {"policy": "block"}},
        {"gpu_reserve": {"free_gib": -1}},
        {"gpu_reserve": {"free_gb": 3}},
        {"page_cache": {"drop_after_leave": "sometimes"}},
        {"page_cache": {"drop": True}},
    ],
)
def test_bad_keys_are_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        HostConfig.model_validate({"name": "h", "gpus": {"a": {"index": 0}}, **extra})


def test_recipe_policy_overrides_the_host_and_leaves_the_hash_alone() -> None:
    base = {"tensor_parallel_size": 1, "model": {"id": "m"}, "container": {"image": "img", "command": ["x"]}}
    plain = Recipe.model_validate(base)
    strict = Recipe.model_validate({**base, "gpu_reserve": {"policy": "enforce"}})
    # A judgement of the lane, not part of it: changing it must not recreate a container that took minutes to load.
    assert plain.content_hash() == strict.content_hash()
    case = {**EXCLUSIVE, "recipes": {"deepseek": {"tp": 2}}}
    desired = make_desired(case)
    assert desired.reserve_policy("deepseek") == "report"
    desired.recipes["deepseek"] = strict
    assert desired.reserve_policy("deepseek") == "enforce"


# ---------------------------------------------------------------- the verdict an enter gets


def test_below_reserve_verdict_on_wsl2_exclusive_lane() -> None:
    desired = make_desired({**EXCLUSIVE, "host": {"gpu_reserve": {"policy": "enforce"}}})
    observed = make_observed(EXCLUSIVE, desired)
    v = enter_reserve_verdict(desired, "deepseek", observed.gpus, ("dark-compute-a", "dark-compute-b"))
    assert v.failed and v.below == ("dark-compute-a", "dark-compute-b")
    assert "dark-compute-a: 2.10 GiB free of 95.59 GiB, below its 3.00 GiB reserve" in v.message()


def test_check_reserve_is_what_enter_calls_enforce_fails_report_stays() -> None:
    for policy, fails in (("enforce", True), ("report", False)):
        desired = make_desired({**EXCLUSIVE, "host": {"gpu_reserve": {"policy": policy}}})
        observed = make_observed(EXCLUSIVE, desired)
        slots = ("dark-compute-a", "dark-compute-b")
        action = Action(
            kind=ActionKind.ENTER,
            reason="t",
            recipe="deepseek",
            gpus=slots,
            container=container_name("deepseek", slots),
        )
        applier = Applier(desired, connect=False)
        if fails:
            with pytest.raises(BelowReserve, match="below the free-VRAM reserve"):
                applier.check_reserve(action, observed)
        else:
            assert applier.check_reserve(action, observed).below == slots
        assert applier.context.figures()["gpu_reserve"]["policy"] == policy


def test_h200_capture_below_reserve_and_idle() -> None:
    case = {
        "telemetry": "nvml",
        "nvml": "h200-below-reserve.json",
        "recipes": {"omni": {"tp": 1}},
        "manifest": [{"omni": ["dark-compute-a"]}],
    }
    desired = make_desired(case)
    figures = vram_by_slot(desired.host, make_observed(case, desired).gpus)
    assert figures["dark-compute-a"].free_bytes == 976355328 and figures["dark-compute-a"].below_reserve
    idle = {**case, "nvml": "h200-idle-v2.json"}
    view = make_observed(idle, desired).gpus.slots["dark-compute-a"]
    assert not vram_by_slot(desired.host, make_observed(idle, desired).gpus)["dark-compute-a"].below_reserve
    assert unlisted_used_bytes(desired.host, view) is None  # 615 MiB idle: under the 1 GiB baseline


def test_telemetry_none_checks_nothing() -> None:
    case = {"recipes": {"omni": {"tp": 1}}, "manifest": [{"omni": ["dark-compute-a"]}]}
    desired = make_desired({**case, "host": {"gpu_reserve": {"policy": "enforce"}}})
    v = enter_reserve_verdict(desired, "omni", make_observed(case, desired).gpus, ("dark-compute-a",))
    assert not v.checked and not v.failed


# ---------------------------------------------------------------- status, text and JSON


def test_status_wsl2_memory_na_and_below_reserve() -> None:
    data, text = _status(EXCLUSIVE)
    a = data["slots"]["dark-compute-a"]
    assert a["below_reserve"] is True and a["reserve_bytes"] == 3 * GIB and a["memory_free_bytes"] < 3 * GIB
    assert a["processes"][0]["used_bytes"] is None
    assert data["gpu_driver_reports"] == {"process_memory": "not reported", "utilization": "not reported"}
    assert "per-process memory and utilisation: not reported by this driver" in text
    assert "memory n/a" in text
    assert "2.10 GiB free, BELOW RESERVE 3.00 GiB (report)" in text


def test_status_unlisted_vram_is_not_free() -> None:
    case = {
        "telemetry": "nvml",
        "nvml": "wsl2-foreign-vram.json",
        "recipes": {"omni": {"tp": 1}},
        "manifest": [{"omni": ["dark-compute-b"]}],
    }
    data, text = _status(case)
    a = data["slots"]["dark-compute-a"]
    assert a["free"] is False and a["unlisted_used_bytes"] == int(14.2 * GIB) // 4096 * 4096
    assert "14.20 GiB in use and no visible process" in text


def test_status_unresolved_pid_says_so() -> None:
    case = {
        "telemetry": "nvml",
        "nvml": "wsl2-unresolved-pid.json",
        "recipes": {"omni": {"tp": 1}},
        "manifest": [{"omni": ["dark-compute-b"]}],
    }
    data, text = _status(case)
    (p,) = data["slots"]["dark-compute-b"]["processes"]
    assert p["resolved"] is False and p["container"] is None
    assert "pid 98765 (not found in this /proc: another pid namespace, or gone) (memory n/a, no container)" in text


def test_h200_status_reports_per_process_memory() -> None:
    case = {
        "telemetry": "nvml",
        "nvml": "h200-busy-v2.json",
        "pids": {470: {"command": "python3 hold_gpu.py"}},
        "recipes": {"omni": {"tp": 1}},
        "manifest": [{"omni": ["dark-compute-a"]}],
    }
    data, text = _status(case)
    assert data["gpu_driver_reports"] == {"process_memory": "reported", "utilization": "reported"}
    assert "not reported by this driver" not in text


# ---------------------------------------------------------------- metrics, from the last pass's observation


def _samples(m: Metrics) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, s.labels.get("slot", "")): s.value
        for fam in text_string_to_metric_families(m.render().decode())
        for s in fam.samples
    }


def test_metrics_free_total_reserve_below_and_unlisted() -> None:
    case = {
        "telemetry": "nvml",
        "nvml": "wsl2-foreign-vram.json",
        "recipes": {"omni": {"tp": 1}},
        "manifest": [{"omni": ["dark-compute-b"]}],
    }
    desired = make_desired(case)
    observed = make_observed(case, desired)
    m = Metrics(desired.host, process_metrics=False)
    m.observe_state(observed, plan(desired, observed))
    got = _samples(m)
    free_a = 102641958912 - int(14.2 * GIB) // 4096 * 4096
    assert got[("reconciler_gpu_memory_free_bytes", "dark-compute-a")] == free_a
    assert got[("reconciler_gpu_memory_total_bytes", "dark-compute-a")] == 102641958912
    assert got[("reconciler_gpu_memory_reserve_bytes", "dark-compute-a")] == 3 * GIB
    assert got[("reconciler_gpu_memory_below_reserve", "dark-compute-a")] == 0
    assert got[("reconciler_gpu_memory_unlisted_bytes", "dark-compute-a")] == int(14.2 * GIB) // 4096 * 4096
    assert got[("reconciler_gpu_memory_unlisted_bytes", "dark-compute-b")] == 0
    assert 'owner="unlisted",recipe="",slot="dark-compute-a"' in m.render().decode()

    below = make_desired(EXCLUSIVE)
    m.observe_state(make_observed(EXCLUSIVE, below), None)
    assert _samples(m)[("reconciler_gpu_memory_below_reserve", "dark-compute-a")] == 1
