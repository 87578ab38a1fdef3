"""Metrics, alert rules and the monitoring examples.

``Metrics`` is fed small hand-built Observed/Plan values and its exposition is read back sample by sample;
``promtool`` (Debian's prometheus package, installed by .ci/setup-host) checks the exposition, the rules and
the rule unit tests; a real Prometheus server scrapes a live exposition and evaluates the rules against it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from e2e_helpers import running_prometheus
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from reconciler.door.metrics import DoorMetrics
from reconciler.loop.metric_families import (
    ACTION_KINDS,
    ACTION_RESULTS,
    OFFLOAD_STATES,
    PASS_RESULTS,
    REFUSAL_REASONS,
    SOURCES,
)
from reconciler.loop.metrics import CONTENT_TYPE, Metrics, SlotOwner, gpu_owners
from reconciler.model import HostConfig
from reconciler.model.door import DOOR_DEFAULT_LISTEN
from reconciler.plan.actions import Action, ActionKind, Blocker, Held, Plan
from reconciler.plan.causes import BlockerCause
from reconciler.plan.observed import (
    LABEL_HOST,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SLOTS,
    ContainerView,
    GpuProcess,
    GpuSlotView,
    GpuView,
    Observed,
    Owner,
    Ownership,
    Reading,
    ShmFile,
    ShmView,
    Tmpfs,
    Uninspectable,
    observation,
)

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "configs" / "prometheus"
ALERTS = PROM_DIR / "alerts.yml"
EXAMPLES = ROOT / "examples"
MiB = 1024**2
GiB = 1024**3
A, B = "dark-compute-a", "dark-compute-b"
EMPTY_TMPFS = Tmpfs(size_bytes=64 * GiB, used_bytes=0, free_bytes=64 * GiB)


# ---------------------------------------------------------------- builders (small, by hand)


def make_host(telemetry: str = "nvml") -> HostConfig:
    return HostConfig.model_validate(
        {"name": "workstation", "gpus": {A: {"index": 0}, B: {"index": 1}}, "gpu_telemetry": telemetry}
    )


def managed(
    name: str, recipe: str, slots: tuple[str, ...], *, state: str = "running", host: str = "workstation"
) -> ContainerView:
    labels = {LABEL_MANAGED: "true", LABEL_RECIPE: recipe, LABEL_SLOTS: ",".join(slots), LABEL_HOST: host}
    return ContainerView(id=f"{name}-id".ljust(64, "0"), name=name, state=state, image="img", labels=labels)


def unmanaged(name: str, devices: tuple[str, ...], *, state: str = "running") -> ContainerView:
    return ContainerView(id=f"{name}-id".ljust(64, "0"), name=name, state=state, image="img", gpu_devices=devices)


def shm_file(name: str, *, state: str, allocated: int, size: int | None = None) -> ShmFile:
    owners = (Owner(pid=100, via="map", container="c"),) if state == "owned" else ()
    return ShmFile(
        path=f"/dev/shm/{name}",
        dev=42,
        inode=abs(hash(name)) % 10**6,
        size_bytes=size or allocated,
        allocated_bytes=allocated,
        owners=owners,
        state=state,
    )


def make_observed(
    *,
    containers: tuple[ContainerView, ...] = (),
    slots: dict[str, GpuSlotView] | None = None,
    telemetry: str = "nvml",
    files: tuple[ShmFile, ...] = (),
    deleted: tuple[ShmFile, ...] = (),
    tmpfs: Tmpfs = EMPTY_TMPFS,
    uninspectable: tuple[Uninspectable, ...] = (),
    docker_ok: bool = True,
    proc_ok: bool = True,
    gpu_ok: bool = True,
) -> Observed:
    if slots is None:
        slots = {s: GpuSlotView(slot=s, index=i, uuid=None) for i, s in enumerate((A, B))}
    shm = ShmView(
        dir="/dev/shm",
        pattern="vllm_offload_*.mmap",
        tmpfs=tmpfs,
        proc=Reading("proc", proc_ok, "" if proc_ok else "/proc/77/maps: Permission denied"),
        docker=Reading("docker", docker_ok, "" if docker_ok else "connection refused"),
        files=files,
        deleted_mapped=deleted,
        deleted_mapped_bytes=sum(f.allocated_bytes for f in deleted),
        uninspectable=uninspectable,
    )
    gpus = GpuView(
        telemetry=telemetry, reading=Reading("gpu", gpu_ok, "" if gpu_ok else "NVML: Driver Not Loaded"), slots=slots
    )
    return observation("workstation", containers=containers, gpus=gpus, shm=shm, docker=shm.docker)


def busy_host() -> tuple[Observed, Plan]:
    """omni (ours) on slot b, a notebook container on slot a, a bare CUDA process on slot a, orphan files."""
    omni = managed("reconciler-omni-dark-compute-b", "omni", (B,))
    notebook = unmanaged("jupyter", ("0",))
    slots = {
        A: GpuSlotView(
            slot=A,
            index=0,
            uuid="GPU-a",
            memory_total_bytes=141 * GiB,
            memory_used_bytes=10 * GiB,
            processes=(
                GpuProcess(pid=300, used_bytes=GiB, container_id=notebook.id),
                GpuProcess(pid=4242, used_bytes=GiB),
            ),
        ),
        B: GpuSlotView(
            slot=B,
            index=1,
            uuid="GPU-b",
            memory_total_bytes=141 * GiB,
            memory_used_bytes=70 * GiB,
            processes=(GpuProcess(pid=500, used_bytes=70 * GiB, container_id=omni.id),),
        ),
    }
    observed = make_observed(
        containers=(omni, notebook),
        slots=slots,
        files=(
            shm_file("vllm_offload_1.mmap", state="owned", allocated=GiB),
            shm_file("vllm_offload_2.mmap", state="orphan", allocated=256 * MiB, size=512 * MiB),
            shm_file("vllm_offload_3.mmap", state="orphan", allocated=512 * MiB),
        ),
        deleted=(shm_file("vllm_offload_0.mmap (deleted)", state="owned", allocated=128 * MiB),),
        tmpfs=Tmpfs(size_bytes=64 * GiB, used_bytes=24 * GiB, free_bytes=40 * GiB),
        uninspectable=(
            Uninspectable(pid=1, command="init", reason="Permission denied", excused=True),
            Uninspectable(pid=77, command="agent", reason="Permission denied", excused=False),
        ),
    )
    plan = Plan(
        host="workstation",
        actions=(Action(kind=ActionKind.RECLAIM, reason="2 orphan offload file(s)", bytes=768 * MiB),),
        blockers=(
            Blocker(
                recipe="v4-flash",
                gpus=(A, B),
                reason="container jupyter holds GPU slot dark-compute-a",
                holder="jupyter",
                cause=BlockerCause.HELD,
            ),
        ),
    )
    return observed, plan


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def samples(m: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return samples(m).get((name, frozenset(labels.items())))


def series(m: Metrics, name: str) -> list[dict[str, str]]:
    return [dict(lbl) for (n, lbl) in samples(m) if n == name]


def need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not found: install Debian's {package} package (.ci/setup-host does)")
    return path


# ---------------------------------------------------------------- initial exposition


def test_every_known_label_combination_is_exported_at_start() -> None:
    m = Metrics(make_host(), recipes=["omni", "v4-flash"], clock=Clock())
    s = samples(m)
    for result in PASS_RESULTS:
        assert s[("reconciler_reconcile_passes_total", frozenset({("result", result)}))] == 0
        assert s[("reconciler_reconcile_duration_seconds_count", frozenset({("result", result)}))] == 0
    for kind in ACTION_KINDS:
        assert s[("reconciler_pending_actions", frozenset({("kind", kind)}))] == 0
        for result in ACTION_RESULTS:
            assert s[("reconciler_actions_total", frozenset({("kind", kind), ("result", result)}))] == 0
            assert s[("reconciler_action_duration_seconds_count", frozenset({("kind", kind), ("result", result)}))] == 0
    for reason in REFUSAL_REASONS:
        assert s[("reconciler_refusals_total", frozenset({("reason", reason)}))] == 0
    for state in OFFLOAD_STATES:
        assert s[("reconciler_offload_bytes", frozenset({("state", state)}))] == 0
        assert s[("reconciler_offload_files", frozenset({("state", state)}))] == 0
    for source in SOURCES:
        # Unknown until the first pass: down, never optimistically up.
        assert s[("reconciler_source_up", frozenset({("source", source)}))] == 0
    for recipe in ("omni", "v4-flash"):
        assert s[("reconciler_recipe_backoff", frozenset({("recipe", recipe)}))] == 0
        assert s[("reconciler_recipe_backoff_until_timestamp_seconds", frozenset({("recipe", recipe)}))] == 0
    assert s[("reconciler_manifest_valid", frozenset())] == 0
    assert s[("reconciler_reclaimed_bytes_total", frozenset())] == 0
    assert s[("reconciler_last_success_timestamp_seconds", frozenset())] == 0
    assert s[("reconciler_start_time_seconds", frozenset())] == 1_700_000_000.0
    build = series(m, "reconciler_build_info")
    assert build and build[0]["version"] == __import__("reconciler").__version__
    assert series(m, "reconciler_host_info") == [
        {"host": "workstation", "gpu_telemetry": "nvml", "shm_dir": "/dev/shm"}
    ]
    # Process metrics ride along on the dedicated registry (the loop's footprint goals are watched with them).
    assert ("process_resident_memory_bytes", frozenset()) in s


def test_every_metric_has_help_and_the_prefix_and_counters_end_in_total() -> None:
    m = Metrics(make_host(), recipes=["omni"])
    text = m.render().decode()
    families = list(text_string_to_metric_families(text))
    ours = [f for f in families if f.name.startswith("reconciler_")]
    assert len(ours) >= 30
    for fam in ours:
        assert fam.documentation.strip(), f"{fam.name} has no help text"
    for line in text.splitlines():
        if line.startswith("# TYPE reconciler_") and line.endswith(" counter"):
            assert line.split()[2].endswith("_total"), line


def test_a_dedicated_registry_is_used_never_the_global_one() -> None:
    first, second = Metrics(make_host()), Metrics(make_host())
    first.record_pass("converged", 0.1)
    assert value(first, "reconciler_reconcile_passes_total", result="converged") == 1
    assert value(second, "reconciler_reconcile_passes_total", result="converged") == 0
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("reconciler_")]


# ---------------------------------------------------------------- observe_state


def test_observe_state_exports_owners_memory_offload_tmpfs_and_plan() -> None:
    m = Metrics(make_host(), recipes=["omni", "v4-flash"])
    observed, plan = busy_host()
    m.observe_state(observed, plan)

    owners = sorted(series(m, "reconciler_gpu_owner_info"), key=lambda d: (d["slot"], d["owner"]))
    assert owners == [
        {"slot": A, "recipe": "", "container": "", "owner": "process"},
        {"slot": A, "recipe": "", "container": "jupyter", "owner": "unmanaged"},
        {"slot": B, "recipe": "omni", "container": "reconciler-omni-dark-compute-b", "owner": "managed"},
    ]
    assert (
        value(
            m,
            "reconciler_gpu_owner_info",
            slot=B,
            recipe="omni",
            container="reconciler-omni-dark-compute-b",
            owner="managed",
        )
        == 1
    )
    assert value(m, "reconciler_gpu_memory_used_bytes", slot=A) == 10 * GiB
    assert value(m, "reconciler_gpu_memory_total_bytes", slot=B) == 141 * GiB
    assert value(m, "reconciler_gpu_processes", slot=A) == 2
    assert value(m, "reconciler_gpu_processes", slot=B) == 1

    assert value(m, "reconciler_offload_files", state="owned") == 1
    assert value(m, "reconciler_offload_files", state="orphan") == 2
    assert value(m, "reconciler_offload_files", state="blocked") == 0
    assert value(m, "reconciler_offload_files", state="deleted") == 1
    # Allocated bytes, not apparent size: what fills the tmpfs.
    assert value(m, "reconciler_offload_bytes", state="orphan") == 768 * MiB
    assert value(m, "reconciler_offload_bytes", state="owned") == GiB
    assert value(m, "reconciler_offload_bytes", state="deleted") == 128 * MiB
    assert value(m, "reconciler_tmpfs_size_bytes") == 64 * GiB
    assert value(m, "reconciler_tmpfs_free_bytes") == 40 * GiB
    assert value(m, "reconciler_uninspectable_processes", excused="true") == 1
    assert value(m, "reconciler_uninspectable_processes", excused="false") == 1

    assert value(m, "reconciler_pending_actions", kind="reclaim") == 1
    assert value(m, "reconciler_pending_actions", kind="enter") == 0
    assert value(m, "reconciler_blocked_changes") == 1
    assert value(m, "reconciler_drift") == 1
    for source in SOURCES:
        assert value(m, "reconciler_source_up", source=source) == 1


def test_a_later_observation_replaces_owners_and_a_converged_plan_clears_drift() -> None:
    clock = Clock()
    m = Metrics(make_host(), recipes=["omni"], clock=clock)
    m.observe_state(*busy_host())
    clock.now += 60
    slots = {
        s: GpuSlotView(slot=s, index=i, uuid=None, memory_total_bytes=141 * GiB, memory_used_bytes=0)
        for i, s in enumerate((A, B))
    }
    m.observe_state(make_observed(slots=slots), Plan(host="workstation"))
    assert sorted(series(m, "reconciler_gpu_owner_info"), key=lambda d: d["slot"]) == [
        {"slot": A, "recipe": "", "container": "", "owner": "free"},
        {"slot": B, "recipe": "", "container": "", "owner": "free"},
    ]
    assert value(m, "reconciler_gpu_processes", slot=A) == 0
    assert value(m, "reconciler_offload_files", state="orphan") == 0
    assert value(m, "reconciler_offload_bytes", state="deleted") == 0
    assert value(m, "reconciler_drift") == 0
    assert value(m, "reconciler_blocked_changes") == 0
    assert value(m, "reconciler_pending_actions", kind="reclaim") == 0
    assert value(m, "reconciler_last_converged_timestamp_seconds") == clock.now


def test_held_enters_and_unavailable_sources_count_as_drift() -> None:
    m = Metrics(make_host())
    m.observe_state(make_observed(), Plan(host="workstation", held=(Held(recipe="omni", gpus=(B,), reason="backoff"),)))
    assert value(m, "reconciler_held_assignments") == 1
    assert value(m, "reconciler_drift") == 1
    m.observe_state(make_observed(docker_ok=False), Plan(host="workstation", unavailable=("docker",)))
    assert value(m, "reconciler_drift") == 1
    assert value(m, "reconciler_source_up", source="docker") == 0
    assert value(m, "reconciler_source_up", source="proc") == 1


def test_without_a_plan_the_plan_gauges_keep_their_values() -> None:
    m = Metrics(make_host())
    observed, plan = busy_host()
    m.observe_state(observed, plan)
    m.observe_state(make_observed(), None)  # configuration invalid since start: observation still exported
    assert value(m, "reconciler_drift") == 1
    assert value(m, "reconciler_pending_actions", kind="reclaim") == 1
    assert value(m, "reconciler_offload_files", state="orphan") == 0


def test_gpu_figures_nobody_could_read_are_absent_not_zero() -> None:
    m = Metrics(make_host(telemetry="none"))
    m.observe_state(*busy_host())
    assert value(m, "reconciler_gpu_memory_used_bytes", slot=A) == 10 * GiB
    m.observe_state(make_observed(telemetry="none"), Plan(host="workstation"))
    assert series(m, "reconciler_gpu_memory_used_bytes") == []
    assert series(m, "reconciler_gpu_processes") == []
    m.observe_state(make_observed(gpu_ok=False), Plan(host="workstation", unavailable=("gpu",)))
    assert series(m, "reconciler_gpu_memory_total_bytes") == []
    assert value(m, "reconciler_source_up", source="gpu") == 0
    missing = {
        A: GpuSlotView(slot=A, index=0, uuid=None, missing=True),
        B: GpuSlotView(slot=B, index=1, uuid=None, memory_used_bytes=5),
    }
    m.observe_state(make_observed(slots=missing), Plan(host="workstation"))
    assert value(m, "reconciler_gpu_memory_used_bytes", slot=A) is None
    assert value(m, "reconciler_gpu_memory_used_bytes", slot=B) == 5


def test_gpu_owners_follow_the_planners_claims() -> None:
    host = make_host(telemetry="none")
    everything = unmanaged("bench", ("all",))
    stopped = managed("reconciler-old-dark-compute-a", "old", (A,), state="exited")
    foreign = managed("reconciler-omni-dark-compute-b", "omni", (B,), host="other-host")
    by_uuid = unmanaged("by-uuid", ("GPU-bbb",))
    owners = gpu_owners(make_observed(containers=(everything, stopped)), host)
    assert owners == {A: (SlotOwner("unmanaged", "", "bench"),), B: (SlotOwner("unmanaged", "", "bench"),)}
    # Our label for another host is not ours and claims no slot by its name; a stopped container holds nothing.
    owners = gpu_owners(make_observed(containers=(foreign, stopped)), host)
    assert owners == {A: (SlotOwner("free"),), B: (SlotOwner("free"),)}
    # Judged by its GPU ids instead, it is an unmanaged owner of the GPU it was given.
    foreign_on_b = dataclasses.replace(foreign, gpu_devices=("1",))
    owners = gpu_owners(make_observed(containers=(foreign_on_b, stopped)), host)
    assert owners == {A: (SlotOwner("free"),), B: (SlotOwner("unmanaged", "", "reconciler-omni-dark-compute-b"),)}
    # A device request by UUID maps to its slot through what telemetry saw.
    slots = {A: GpuSlotView(slot=A, index=0, uuid="GPU-aaa"), B: GpuSlotView(slot=B, index=1, uuid="GPU-bbb")}
    owners = gpu_owners(make_observed(containers=(by_uuid,), slots=slots), host)
    assert owners[B] == (SlotOwner("unmanaged", "", "by-uuid"),)
    assert owners[A] == (SlotOwner("free"),)
    # In any letter case, as the planner reads it (metrics and plan build one index of ids).
    shouting = dataclasses.replace(by_uuid, name="shouting", gpu_devices=("gpu-AAA",))
    owners = gpu_owners(make_observed(containers=(shouting,), slots=slots), host)
    assert owners[A] == (SlotOwner("unmanaged", "", "shouting"),)
    # This install's labels on a container it did not create (a copy made from a lane's labels): not managed.
    install = "1" * 32
    lane = managed("reconciler-omni-dark-compute-b", "omni", (B,))
    lane = dataclasses.replace(lane, labels={**lane.labels, LABEL_INSTALL: install})
    copy = dataclasses.replace(lane, id="copy-id".ljust(64, "0"), name="omni-copy")
    own = Ownership(install_id=install, created=frozenset({lane.id}))
    observed = dataclasses.replace(make_observed(containers=(lane, copy)), ownership=own)
    assert gpu_owners(observed, host)[B] == (
        SlotOwner("managed", "omni", lane.name),
        SlotOwner("unmanaged", "", "omni-copy"),
    )


def test_configure_follows_recipe_and_slot_edits_but_keeps_a_recipe_in_backoff() -> None:
    m = Metrics(make_host(), recipes=["omni", "v4-flash", "dspark"])
    m.observe_state(*busy_host())
    m.set_backoff("v4-flash", 1_700_000_100.0, failures=2)
    m.configure(host=make_host(), recipes=["omni"])
    assert {d["recipe"] for d in series(m, "reconciler_recipe_backoff")} == {"omni", "v4-flash"}
    m.set_backoff("v4-flash", None)
    m.configure(host=make_host(), recipes=["omni"])
    assert {d["recipe"] for d in series(m, "reconciler_recipe_backoff")} == {"omni"}
    one_slot = HostConfig.model_validate({"name": "workstation", "gpus": {A: {"index": 0}}, "gpu_telemetry": "nvml"})
    m.configure(host=one_slot, recipes=["omni"])
    assert {d["slot"] for d in series(m, "reconciler_gpu_owner_info")} == {A}
    assert {d["slot"] for d in series(m, "reconciler_gpu_memory_used_bytes")} == {A}


# ---------------------------------------------------------------- events


def test_record_pass_counts_times_and_moves_the_timestamps() -> None:
    clock = Clock()
    m = Metrics(make_host(), clock=clock)
    m.record_pass("changed", 12.5)
    assert value(m, "reconciler_reconcile_passes_total", result="changed") == 1
    assert value(m, "reconciler_reconcile_duration_seconds_sum", result="changed") == 12.5
    assert value(m, "reconciler_reconcile_duration_seconds_bucket", result="changed", le="10.0") == 0
    assert value(m, "reconciler_reconcile_duration_seconds_bucket", result="changed", le="30.0") == 1
    assert value(m, "reconciler_last_success_timestamp_seconds") == clock.now
    success_at = clock.now
    clock.now += 30
    m.record_pass("failed", 3.0)
    clock.now += 30
    m.record_pass("error", 0.01)
    assert value(m, "reconciler_reconcile_consecutive_failures") == 2
    assert value(m, "reconciler_last_pass_timestamp_seconds") == clock.now
    assert value(m, "reconciler_last_success_timestamp_seconds") == success_at
    m.record_pass("blocked", 0.2)
    assert value(m, "reconciler_reconcile_consecutive_failures") == 0
    assert value(m, "reconciler_last_success_timestamp_seconds") == clock.now


def test_record_action_reclaim_and_refusal() -> None:
    m = Metrics(make_host())
    m.record_action(ActionKind.ENTER, "ok", 234.0)  # the field report's TP=2 enter
    m.record_action("reclaim", "refused", 2.1)
    m.record_reclaim(768 * MiB)
    m.record_reclaim(256 * MiB)
    m.record_refusal("uninspectable_process")
    assert value(m, "reconciler_actions_total", kind="enter", result="ok") == 1
    assert value(m, "reconciler_actions_total", kind="reclaim", result="refused") == 1
    assert value(m, "reconciler_action_duration_seconds_bucket", kind="enter", result="ok", le="120.0") == 0
    assert value(m, "reconciler_action_duration_seconds_bucket", kind="enter", result="ok", le="300.0") == 1
    assert value(m, "reconciler_reclaimed_bytes_total") == GiB
    assert value(m, "reconciler_refusals_total", reason="uninspectable_process") == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda m: m.record_pass("ok", 1),
            "unknown pass result 'ok'; use one of: converged, changed, blocked, failed, error",
        ),
        (
            lambda m: m.record_action("restart", "ok", 1),
            "unknown action kind 'restart'; use one of: leave, reclaim, enter",
        ),
        (
            lambda m: m.record_action("enter", "timeout", 1),
            "unknown action result 'timeout'; use one of: ok, failed, refused",
        ),
        (lambda m: m.record_refusal("because"), "unknown refusal reason 'because'; use one of: source_unavailable"),
        (lambda m: m.record_reclaim(-1), "reclaimed bytes must be >= 0, got -1"),
    ],
)
def test_unknown_label_values_are_refused_with_the_allowed_ones(call, message: str) -> None:  # type: ignore[no-untyped-def]
    m = Metrics(make_host())
    with pytest.raises(ValueError) as err:
        call(m)
    assert str(err.value).startswith(message)


def test_manifest_validity_exports_the_first_error_and_clears_it() -> None:
    clock = Clock()
    m = Metrics(make_host(), clock=clock)
    m.set_manifest_valid(True)
    assert value(m, "reconciler_manifest_valid") == 1
    assert series(m, "reconciler_manifest_error_info") == []
    m.set_manifest_valid(False, "manifests/workstation.yaml:4: unknown recipe 'nope'\nconfigs/host.yaml:2: bad slot\n")
    assert value(m, "reconciler_manifest_valid") == 0
    assert series(m, "reconciler_manifest_error_info") == [
        {"error": "manifests/workstation.yaml:4: unknown recipe 'nope' (+1 more)"}
    ]
    assert value(m, "reconciler_manifest_last_error_timestamp_seconds") == clock.now
    m.set_manifest_valid(False, "x" * 1000)
    (only,) = series(m, "reconciler_manifest_error_info")
    assert len(only["error"]) == 300 and only["error"].endswith("…")
    m.set_manifest_valid(True)
    assert series(m, "reconciler_manifest_error_info") == []
    assert value(m, "reconciler_manifest_last_error_timestamp_seconds") == clock.now


def test_backoff_gauges() -> None:
    m = Metrics(make_host(), recipes=["omni"])
    m.set_backoff("omni", 1_700_000_600.0, failures=3)
    assert value(m, "reconciler_recipe_backoff", recipe="omni") == 1
    assert value(m, "reconciler_recipe_backoff_until_timestamp_seconds", recipe="omni") == 1_700_000_600.0
    assert value(m, "reconciler_recipe_enter_failures", recipe="omni") == 3
    m.set_backoff("new-recipe", 1_700_000_060.0)
    assert value(m, "reconciler_recipe_backoff", recipe="new-recipe") == 1
    m.set_backoff("omni", None)
    assert value(m, "reconciler_recipe_backoff", recipe="omni") == 0
    assert value(m, "reconciler_recipe_backoff_until_timestamp_seconds", recipe="omni") == 0
    assert value(m, "reconciler_recipe_enter_failures", recipe="omni") == 0


def test_a_scrape_during_updates_never_sees_a_half_replaced_owner_set() -> None:
    m = Metrics(make_host(), process_metrics=False)
    busy, busy_plan = busy_host()
    idle, idle_plan = make_observed(), Plan(host="workstation")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            m.observe_state(busy, busy_plan)
            m.observe_state(idle, idle_plan)

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(100):
            owners = series(m, "reconciler_gpu_owner_info")
            assert {d["slot"] for d in owners} == {A, B}, owners
            assert len(owners) in (2, 3), owners
    finally:
        stop.set()
        t.join()


# ---------------------------------------------------------------- promtool


def test_promtool_check_metrics_finds_nothing_to_complain_about() -> None:
    promtool = need("promtool", "prometheus")
    m = Metrics(make_host())
    m.observe_state(*busy_host())
    m.record_pass("changed", 3)
    m.record_action("enter", "failed", 600)
    m.record_refusal("inspections_disagree")
    m.set_manifest_valid(False, "manifests/workstation.yaml:4: unknown recipe 'nope'")
    m.set_backoff("omni", time.time() + 60, failures=1)
    text = m.render()
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert done.returncode == 0 and done.stdout == b"" and done.stderr == b"", (done.stdout, done.stderr)


def test_promtool_check_metrics_would_complain_about_a_bad_counter() -> None:
    # The check above is only worth something if promtool really lints: a counter without _total must fail.
    promtool = need("promtool", "prometheus")
    bad = b"# HELP reconciler_passes Passes.\n# TYPE reconciler_passes counter\nreconciler_passes 1\n"
    done = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True)
    assert b"_total" in done.stdout + done.stderr


def test_promtool_check_rules() -> None:
    promtool = need("promtool", "prometheus")
    done = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 19 rules found" in done.stdout


def test_promtool_test_rules() -> None:
    promtool = need("promtool", "prometheus")
    files = sorted(str(p) for p in (PROM_DIR / "tests").glob("*.yml"))
    assert len(files) >= 3
    done = subprocess.run([promtool, "test", "rules", *files], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(files)


def test_rule_tests_fail_when_an_alert_fires_too_early(tmp_path: Path) -> None:
    # A copy of the rules with the drift alert's 15m shortened must break its rule test.
    promtool = need("promtool", "prometheus")
    copy = tmp_path / "prometheus"
    shutil.copytree(PROM_DIR, copy)
    text = (copy / "alerts.yml").read_text()
    assert text.count("for: 15m") == 1
    (copy / "alerts.yml").write_text(text.replace("for: 15m", "for: 1m"))
    done = subprocess.run(
        [promtool, "test", "rules", str(copy / "tests" / "convergence.yml")], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "ReconcilerDriftPersisting" in done.stdout + done.stderr


def _alert_rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_the_required_alerts_exist_and_tell_the_operator_what_to_run() -> None:
    rules = {r["alert"]: r for r in _alert_rules()}
    for name in (
        "ReconcilerDown",
        "ReconcilerNotScraped",
        "ReconcileFailing",
        "ReconcilerDriftPersisting",
        "ReconcilerOrphanOffloadBytes",
        "ReconcilerTmpfsNearlyFull",
        "ReconcilerSourceDown",
        "ReconcilerManifestInvalid",
        "ReconcilerRecipeInBackoff",
        "ReconcilerEngineSlow",
        "ReconcilerProbeSuiteFailing",
        "ReconcilerGpuBelowReserveUnderLoad",
    ):
        assert name in rules, name
    assert 'absent(up{job="reconciler"})' in rules["ReconcilerNotScraped"]["expr"]
    assert rules["ReconcilerDriftPersisting"]["for"] == "15m"
    for name, rule in rules.items():
        ann = rule["annotations"]
        assert ann["summary"].strip() and ann["description"].strip(), name
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert re.search(r"`(reconciler |systemctl |journalctl |promtool |docker )", ann["description"]), name


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in (PROM_DIR / "tests").glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../alerts.yml"], path
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {r["alert"] for r in _alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested not firing"


def _exposed_names() -> set[str]:
    m = Metrics(make_host(), recipes=["omni"])
    m.observe_state(*busy_host())
    m.set_manifest_valid(False, "manifests/x.yaml:1: broken")
    # The probe families come from the host's probe history, empty here: a gauge's family name is its sample name.
    empty_gauges = {fam.name for fam in m.registry.collect() if fam.type == "gauge" and not fam.samples}
    door = DoorMetrics()  # the front door's own /metrics (ReconcilerDoorHolding)
    door_names = {s.name for fam in door.registry.collect() for s in fam.samples} | {
        fam.name for fam in door.registry.collect()
    }
    return {name for name, _ in samples(m)} | empty_gauges | door_names


def test_alerts_and_dashboard_use_only_exported_metric_names() -> None:
    exposed = _exposed_names()
    for source in (ALERTS, EXAMPLES / "grafana-dashboard.json", EXAMPLES / "grafana-fleet.json"):
        used = set(re.findall(r"\breconciler_[a-z_]+", source.read_text()))
        assert used, source
        assert used - exposed == set(), f"{source.name} uses metrics nobody exports"


# ---------------------------------------------------------------- examples


def test_example_prometheus_config_is_valid_and_scrapes_the_loop() -> None:
    promtool = need("promtool", "prometheus")
    path = EXAMPLES / "prometheus.yml"
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 19 rules found" in done.stdout  # the rule file was found through the relative path
    doc = yaml.safe_load(path.read_text())
    job, door = doc["scrape_configs"]
    assert job["job_name"] == "reconciler"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    # The front door on its default door.listen, for ReconcilerDoorHolding.
    assert door["job_name"] == "reconciler-door"
    assert door["static_configs"][0]["targets"] == [DOOR_DEFAULT_LISTEN]


def test_systemd_unit_runs_the_loop_and_keeps_what_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.store.lock import lock_dir

    monkeypatch.delenv("RECONCILER_LOCK_DIR", raising=False)
    unit = (EXAMPLES / "reconciler.service").read_text()
    settings = [ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and not ln.startswith("#")]
    conf = {k: v for k, v in settings}
    assert (
        conf["ExecStart"]
        == "/opt/pipx/venvs/reconciler/bin/reconciler run --root /etc/reconciler --metrics-addr 127.0.0.1:9464"
    )
    assert conf["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert conf["ProtectSystem"] == "strict" and conf["NoNewPrivileges"] == "yes"
    # Under ProtectSystem=strict only listed paths are writable: the host lock's runtime directory is the unit's
    # own, private and kept across restarts (an operator's apply may hold the lock meanwhile).
    assert str(lock_dir()) == f"/run/{conf['RuntimeDirectory']}" and conf["RuntimeDirectoryMode"] == "0700"
    assert conf["RuntimeDirectoryPreserve"] == "yes" and conf["StateDirectoryMode"] == "0700"
    # READY=1 after the first pass, WATCHDOG=1 from the loop; room for many connections.
    assert conf["Type"] == "notify" and conf["NotifyAccess"] == "main" and conf["WatchdogSec"].endswith("s")
    assert int(conf["LimitNOFILE"]) >= 65536
    # ...and the state directory, where the install id lives (StateDirectory= makes /var/lib/NAME writable).
    monkeypatch.delenv("RECONCILER_STATE_DIR", raising=False)
    from reconciler.store.state import state_dir

    assert str(state_dir()) == f"/var/lib/{conf['StateDirectory']}"
    # /dev/shm, the NVIDIA device nodes and every process in /proc must stay visible.
    assert "PrivateDevices" not in conf and "ProtectProc" not in conf and "ProcSubset" not in conf
    assert "AF_UNIX" in conf["RestrictAddressFamilies"]  # the Docker socket
    assert {"CAP_SYS_PTRACE", "CAP_FOWNER", "CAP_LEASE"} <= set(conf["CapabilityBoundingSet"].split())
    analyze = need("systemd-analyze", "systemd")
    # verify checks the binary exists: point ExecStart at this checkout's console script.
    script = shutil.which("reconciler") or sys.executable
    local = tmp_path / "reconciler.service"
    local.write_text(unit.replace("/opt/pipx/venvs/reconciler/bin/reconciler", script))
    done = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr


_DASHBOARDS = {
    "grafana-dashboard.json": (
        "reconciler_drift",
        "reconciler_gpu_owner_info",
        "reconciler_offload_bytes",
        "reconciler_tmpfs_free_bytes",
        "reconciler_reconcile_passes_total",
        "reconciler_actions_total",
        "reconciler_source_up",
    ),
    # The fleet's: every host side by side (tests/real/test_git_source.py runs its every query on a real Prometheus).
    "grafana-fleet.json": (
        "reconciler_drift",
        "reconciler_blocked_changes",
        "reconciler_git_commit_info",
        "reconciler_git_state",
        "reconciler_gpu_memory_free_bytes",
        "reconciler_tmpfs_free_bytes",
        "reconciler_lane_up",
    ),
}


@pytest.mark.parametrize("name", sorted(_DASHBOARDS))
def test_grafana_dashboard_is_valid(name: str) -> None:
    dash = json.loads((EXAMPLES / name).read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    boxes: list[tuple[str, dict[str, int]]] = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for other, og in boxes:
            overlap = (
                g["x"] < og["x"] + og["w"]
                and og["x"] < g["x"] + g["w"]
                and g["y"] < og["y"] + og["h"]
                and og["y"] < g["y"] + g["h"]
            )
            assert not overlap, (p["title"], other)
        boxes.append((p["title"], g))
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    for needed in _DASHBOARDS[name]:
        assert needed in exprs, needed


# ---------------------------------------------------------------- a real Prometheus server


@pytest.fixture
def metrics_server() -> Iterator[tuple[Metrics, str]]:
    m = Metrics(make_host())

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = m.render()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # keep test output clean; Prometheus reports scrape errors itself

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield m, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _api(base: str, path: str, **params: str) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def test_a_real_prometheus_scrapes_the_exposition_and_evaluates_the_rules(metrics_server: tuple[Metrics, str]) -> None:
    need("prometheus", "prometheus")
    m, target = metrics_server
    m.observe_state(*busy_host())
    m.set_manifest_valid(False, "manifests/workstation.yaml:4: unknown recipe 'nope'")
    with (
        tempfile.TemporaryDirectory(prefix="reconciler-prom-") as tmp,
        running_prometheus(target, Path(tmp), rule_files=[ALERTS]) as (base, proc),
    ):
        deadline = time.monotonic() + 30
        alert = None
        while time.monotonic() < deadline and alert is None:
            time.sleep(0.5)
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                alerts = _api(base, "/api/v1/alerts")["data"]["alerts"]
            except OSError:
                continue
            alert = next((a for a in alerts if a["labels"]["alertname"] == "ReconcilerManifestInvalid"), None)
        assert alert is not None, "ReconcilerManifestInvalid never became pending"
        assert alert["state"] == "pending"  # for: 2m
        # The annotation's template query ran against the scraped error series.
        assert alert["annotations"]["description"].startswith("manifests/workstation.yaml:4: unknown recipe 'nope'")

        (t,) = _api(base, "/api/v1/targets")["data"]["activeTargets"]
        assert t["health"] == "up" and t["lastError"] == "", t
        owners = _api(base, "/api/v1/query", query="reconciler_gpu_owner_info")["data"]["result"]
        assert sorted(r["metric"]["owner"] for r in owners) == ["managed", "process", "unmanaged"]
        orphan = _api(base, "/api/v1/query", query='reconciler_offload_bytes{state="orphan"}')["data"]["result"]
        assert float(orphan[0]["value"][1]) == 768 * MiB
        groups = _api(base, "/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == 19 and all(r["health"] == "ok" for r in rules), [
            (r["name"], r.get("lastError")) for r in rules
        ]


def test_a_backoff_that_ran_out_is_no_longer_held_but_keeps_its_count() -> None:
    m = Metrics(make_host(), recipes=["omni"])
    m.set_backoff("omni", 2_000_000_000.0, failures=3)
    text = m.render().decode()
    assert 'reconciler_recipe_backoff{recipe="omni"} 1.0' in text
    m.end_backoff_wait("omni")
    text = m.render().decode()
    assert 'reconciler_recipe_backoff{recipe="omni"} 0.0' in text
    assert 'reconciler_recipe_enter_failures{recipe="omni"} 3.0' in text
