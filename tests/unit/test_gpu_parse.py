"""GPU telemetry without a GPU: the parse of NVML answers (captured as data), slot resolution, cgroup parsing,
fail-closed handling, and the planner reading the result. Runs everywhere, in milliseconds."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe
from reconciler.observe.gpu import engine_container_of, observe_gpus, parse_nvml, read_nvml, slots_of_container
from reconciler.observe.procfs import container_of_pid, innermost_known, parse_cgroup_container_ids
from reconciler.plan.observed import ENGINE_ANSWERED, GpuView, Observed, Reading, ShmView, Tmpfs, observation
from reconciler.plan.planner import plan

DATA = Path(__file__).parent.parent / "data"
GIB = 1024**3

UUID_0 = "GPU-5d3e8f0a-8c1e-4a57-9a8e-0c7d1f1a2b30"
UUID_1 = "GPU-9b2c4e61-17f0-4e0d-b3c5-6a8f2d9e4c11"
CTR = "7f1c0e5b2d9a4c3e8b6a1f0d2e3c4b5a6978e1d2c3b4a5968778695a4b3c2d1e"

# The shape read_nvml returns on the field report's two-GPU host: omni's vLLM worker on GPU 1, nothing on GPU 0.
TWO_GPUS: dict[str, Any] = {
    "error": None,
    "driver_version": "580.159.03",
    "device_count": 2,
    "read_s": 0.04,
    "devices": [
        {
            "index": 0,
            "name": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "uuid": UUID_0,
            "memory_total": 102641958912,
            "memory_used": 564330496,
            "processes": [],
            "errors": {},
        },
        {
            "index": 1,
            "name": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "uuid": UUID_1,
            "memory_total": 102641958912,
            "memory_used": 90194313216,
            "processes": [{"pid": 4242, "used_gpu_memory": 89615204352}],
            "errors": {},
        },
    ],
}

DOCKER_V2_SYSTEMD = f"0::/system.slice/docker-{CTR}.scope\n"


def host(gpus: Mapping[str, Mapping[str, Any]], telemetry: str = "nvml") -> HostConfig:
    return HostConfig(name="workstation", gpus=dict(gpus), gpu_telemetry=telemetry)


SPLIT = host({"dark-compute-a": {"index": 0}, "dark-compute-b": {"index": 1}})


def procs(
    cgroups: Mapping[int, str], commands: Mapping[int, str] | None = None, known: frozenset[str] = frozenset({CTR})
) -> dict[str, Any]:
    """container_of / command_of over captured /proc text: the real cgroup parse and resolution against the ids
    an engine lists (``known``), no /proc needed."""
    commands = commands or {}
    return {
        "container_of": lambda pid: innermost_known(parse_cgroup_container_ids(cgroups.get(pid, "")), known),
        "command_of": lambda pid: commands.get(pid, ""),
    }


def with_devices(*devices: dict[str, Any], **top: Any) -> dict[str, Any]:
    raw = {**TWO_GPUS, "devices": list(devices), "device_count": len(devices)}
    raw.update(top)
    return raw


# ---------------------------------------------------------------- slots, memory, processes


def test_slots_by_index_carry_name_uuid_memory_and_processes() -> None:
    view = parse_nvml(TWO_GPUS, SPLIT, **procs({4242: DOCKER_V2_SYSTEMD}, {4242: "python3 -m vllm.entrypoints"}))
    assert view.telemetry == "nvml"
    assert view.reading.ok, view.reading.detail
    assert view.reading.detail == "NVML driver 580.159.03, 2 GPU(s)"
    a, b = view.slots["dark-compute-a"], view.slots["dark-compute-b"]
    assert (a.index, a.uuid, a.processes, a.missing) == (0, UUID_0, (), False)
    assert (a.memory_total_bytes, a.memory_used_bytes) == (102641958912, 564330496)
    assert b.uuid == UUID_1 and b.name.startswith("NVIDIA RTX PRO 6000")
    assert b.memory_used_bytes == 90194313216
    [p] = b.processes
    assert (p.pid, p.used_bytes, p.container_id, p.command) == (4242, 89615204352, CTR, "python3 -m vllm.entrypoints")


def test_a_host_process_belongs_to_no_container() -> None:
    sandbox = (DATA / "cgroup" / "host-process-sandbox.txt").read_text()
    view = parse_nvml(TWO_GPUS, SPLIT, **procs({4242: sandbox}))
    [p] = view.slots["dark-compute-b"].processes
    assert p.container_id is None


def test_slot_by_uuid_follows_the_uuid_not_the_order() -> None:
    # The slot names GPU 1 by UUID: a reordered bus must not move it.
    h = host({"dark-compute-a": {"uuid": UUID_1}, "dark-compute-b": {"uuid": UUID_0}})
    view = parse_nvml(TWO_GPUS, h, **procs({}))
    assert view.reading.ok
    assert view.slots["dark-compute-a"].index == 1
    assert [p.pid for p in view.slots["dark-compute-a"].processes] == [4242]
    assert view.slots["dark-compute-b"].index == 0
    assert view.slots["dark-compute-b"].processes == ()


def test_uuid_and_index_that_disagree_make_the_slot_unusable() -> None:
    h = host({"dark-compute-a": {"index": 0, "uuid": UUID_1}})
    view = parse_nvml(TWO_GPUS, h, **procs({}))
    s = view.slots["dark-compute-a"]
    assert s.missing
    assert s.error == (
        f"configs/host.yaml gpus.dark-compute-a: uuid {UUID_1} is GPU index 1, but index 0 is given; "
        "fix the index or remove it"
    )


def test_uuid_and_index_that_agree_resolve() -> None:
    view = parse_nvml(TWO_GPUS, host({"dark-compute-b": {"index": 1, "uuid": UUID_1}}), **procs({}))
    assert not view.slots["dark-compute-b"].missing
    assert view.slots["dark-compute-b"].index == 1


def test_missing_index_is_missing_and_names_the_file_and_count() -> None:
    h = host({"dark-compute-a": {"index": 0}, "dark-compute-b": {"index": 1}})
    raw = with_devices(TWO_GPUS["devices"][0])  # the second card fell off the bus
    view = parse_nvml(raw, h, **procs({}))
    assert view.reading.ok  # the rest of the host is still known; the planner blocks the one slot
    b = view.slots["dark-compute-b"]
    assert b.missing and b.index == 1
    assert b.error == (
        "configs/host.yaml gpus.dark-compute-b: no GPU with index 1; this host has 1 GPU(s) (indices 0..0)"
    )
    assert not view.slots["dark-compute-a"].missing


def test_missing_uuid_lists_what_was_found() -> None:
    gone = "GPU-00000000-0000-0000-0000-000000000000"
    view = parse_nvml(TWO_GPUS, host({"dark-compute-a": {"uuid": gone}}), **procs({}))
    s = view.slots["dark-compute-a"]
    assert s.missing and s.uuid == gone and s.index is None
    assert s.error == f"configs/host.yaml gpus.dark-compute-a: no GPU with uuid {gone} (found: 0={UUID_0}, 1={UUID_1})"


def test_one_pid_in_several_contexts_is_one_process_with_memory_summed() -> None:
    dev = {
        **TWO_GPUS["devices"][0],
        "processes": [
            {"pid": 7, "used_gpu_memory": 1 * GIB},
            {"pid": 9, "used_gpu_memory": None},  # NVML_VALUE_NOT_AVAILABLE: memory unknown, pid still blocks
            {"pid": 7, "used_gpu_memory": 2 * GIB},
        ],
    }
    view = parse_nvml(with_devices(dev), host({"a": {"index": 0}}), **procs({}))
    got = [(p.pid, p.used_bytes) for p in view.slots["a"].processes]
    assert got == [(7, 3 * GIB), (9, None)]


def test_slots_of_a_container_for_the_enter_postcondition() -> None:
    # A TP=2 container: one worker per GPU; a stray host process on GPU 0 as well.
    other = "0" * 63 + "1"
    raw = with_devices(
        {
            **TWO_GPUS["devices"][0],
            "processes": [{"pid": 10, "used_gpu_memory": GIB}, {"pid": 99, "used_gpu_memory": GIB}],
        },
        {**TWO_GPUS["devices"][1], "processes": [{"pid": 11, "used_gpu_memory": GIB}]},
    )
    cg = {10: DOCKER_V2_SYSTEMD, 11: DOCKER_V2_SYSTEMD, 99: f"0::/docker/{other}\n"}
    view = parse_nvml(raw, SPLIT, **procs(cg, known=frozenset({CTR, other})))
    assert slots_of_container(view, CTR) == ("dark-compute-a", "dark-compute-b")
    assert slots_of_container(view, other) == ("dark-compute-a",)
    assert slots_of_container(view, "f" * 64) == ()


# ---------------------------------------------------------------- answers captured on a real H200

H200_UUID = "GPU-e80e409b-e725-65d5-3f7e-084f615acdf6"


def _captured(name: str) -> dict[str, Any]:
    return json.loads((DATA / "nvml" / name).read_text())


def test_captured_h200_with_a_cuda_process() -> None:
    cgroup = (DATA / "cgroup" / "host-process-h200-v2.txt").read_text()
    for slot in ({"index": 0}, {"uuid": H200_UUID}, {"index": 0, "uuid": H200_UUID}):
        view = parse_nvml(_captured("h200-busy.json"), host({"dark-compute-a": slot}), **procs({421: cgroup}))
        assert view.reading.ok and view.reading.detail == "NVML driver 580.159.04, 1 GPU(s)"
        s = view.slots["dark-compute-a"]
        assert (s.index, s.uuid, s.name) == (0, H200_UUID, "NVIDIA H200")
        assert (s.memory_total_bytes, s.memory_used_bytes) == (150754820096, 2367553536)
        [p] = s.processes
        # 1 GiB allocated by PyTorch; NVML counts its CUDA context too.
        assert (p.pid, p.used_bytes, p.container_id) == (421, 1713373184, None)


def test_captured_idle_h200_and_a_second_slot_it_does_not_have() -> None:
    h = host({"dark-compute-a": {"index": 0}, "dark-compute-b": {"index": 1}})
    view = parse_nvml(_captured("h200-idle.json"), h, **procs({}))
    assert view.reading.ok
    assert view.slots["dark-compute-a"].processes == () and not view.slots["dark-compute-a"].missing
    assert view.slots["dark-compute-b"].missing
    assert "this host has 1 GPU(s)" in view.slots["dark-compute-b"].error


# ---------------------------------------------------------------- fail closed


@pytest.mark.parametrize(
    "error",
    [
        "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
        "NVMLError_DriverNotLoaded: Driver Not Loaded",
        "NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch.",
        "the nvidia-ml-py package is not installed (No module named 'pynvml'); pip install nvidia-ml-py",
    ],
)
def test_an_nvml_error_is_an_unavailable_source(error: str) -> None:
    raw = {"error": error, "driver_version": "", "device_count": 0, "devices": [], "read_s": 0.0}
    view = parse_nvml(raw, SPLIT, **procs({}))
    assert not view.reading.ok
    fix = "on a host without NVIDIA GPUs set 'gpu_telemetry: none' in configs/host.yaml"
    assert view.reading.detail == f"NVML: {error}; {fix}"
    assert set(view.slots) == {"dark-compute-a", "dark-compute-b"}
    assert all(s.processes == () and s.error == view.reading.detail for s in view.slots.values())


def test_a_failed_process_list_on_a_configured_gpu_is_unavailable() -> None:
    dev = {**TWO_GPUS["devices"][1], "errors": {"processes": "NVMLError_GpuIsLost: GPU is lost"}}
    dev.pop("processes")
    view = parse_nvml(with_devices(TWO_GPUS["devices"][0], dev), SPLIT, **procs({}))
    assert not view.reading.ok
    assert view.reading.detail == (
        "NVML: configs/host.yaml gpus.dark-compute-b (GPU 1): processes failed: NVMLError_GpuIsLost: GPU is lost"
    )
    assert view.slots["dark-compute-b"].error == "processes failed: NVMLError_GpuIsLost: GPU is lost"


def test_a_failed_call_on_a_gpu_no_slot_uses_does_not_matter() -> None:
    dev1 = {"index": 1, "errors": {"handle": "NVMLError_Unknown: Unknown Error"}}
    view = parse_nvml(with_devices(TWO_GPUS["devices"][0], dev1), host({"a": {"index": 0}}), **procs({}))
    assert view.reading.ok, view.reading.detail


def test_a_uuid_slot_with_an_unreadable_gpu_is_unknown_not_missing() -> None:
    dev1 = {"index": 1, "errors": {"handle": "NVMLError_GpuIsLost: GPU is lost"}}
    raw = with_devices(TWO_GPUS["devices"][0], dev1)
    view = parse_nvml(raw, host({"b": {"uuid": UUID_1}}), **procs({}))
    assert not view.reading.ok
    assert not view.slots["b"].missing
    assert "GPU(s) 1 did not answer" in view.reading.detail


def test_observe_never_raises_on_a_broken_read() -> None:
    def explode(_: HostConfig) -> dict[str, Any]:
        raise RuntimeError("ctypes went away")

    view = observe_gpus(SPLIT, read=explode)
    assert not view.reading.ok
    assert view.reading.detail == "NVML answer could not be read: RuntimeError: ctypes went away"
    malformed = observe_gpus(SPLIT, read=lambda _: {"error": None, "devices": [{"name": "no index"}]})
    assert not malformed.reading.ok and "KeyError" in malformed.reading.detail


def test_telemetry_none_never_reads_nvml() -> None:
    def must_not_be_called(_: HostConfig) -> dict[str, Any]:
        raise AssertionError("NVML read with gpu_telemetry none")

    view = observe_gpus(host({"a": {"index": 0}}, telemetry="none"), read=must_not_be_called)
    assert view.telemetry == "none" and view.reading.ok
    assert view.reading.detail == "GPU occupancy from Docker alone"


def test_read_without_the_bindings_reports_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what Python does when the package is not installed
    raw = read_nvml(SPLIT)
    assert raw["error"].startswith("the nvidia-ml-py package is not installed")
    assert raw["error"].endswith("; pip install nvidia-ml-py")
    assert raw["devices"] == []


def test_importing_the_observer_does_not_load_nvml() -> None:
    code = "import sys, reconciler.observe.gpu, reconciler.plan.planner; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_read_answer_is_plain_json() -> None:
    # The read hands back data, not NVML objects: it can be captured, stored and parsed later.
    assert json.loads(json.dumps(TWO_GPUS)) == TWO_GPUS
    assert json.loads(json.dumps(read_nvml(SPLIT)))["devices"] == read_nvml(SPLIT)["devices"]


# ---------------------------------------------------------------- cgroup forms

A = "3f7e2a9c1b5d4e6f8a0b2c4d6e8f0a1b3c5d7e9f1a2b4c6d8e0f1a3b5c7d9e1f"
B = "c1d2e3f4a5b6978812345678901234567890abcdefabcdefabcdefabcdef0123"

CGROUP_FORMS = [
    # Written by Docker with the systemd cgroup driver on cgroup v2 (Debian 12, Ubuntu 22.04+).
    ("docker v2 systemd", f"0::/system.slice/docker-{A}.scope\n", A),
    # The same, for a container that runs systemd or its own sub-cgroups inside.
    ("docker v2 systemd nested", f"0::/system.slice/docker-{A}.scope/init.scope\n", A),
    ("docker v2 cgroupfs", f"0::/docker/{A}\n", A),
    (
        "docker v1 systemd",
        "".join(
            f"{n}:{c}:/system.slice/docker-{A}.scope\n" for n, c in [(12, "pids"), (4, "memory"), (1, "name=systemd")]
        )
        + "0::/\n",
        A,
    ),
    ("rootless docker", f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{A}.scope\n", A),
    (
        "containerd cri systemd v2",
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod0d6c7b2e_4f1a_4c3b_9e8d_7a6b5c4d3e2f.slice/cri-containerd-{A}.scope\n"
        ),
        A,
    ),
    (
        "containerd cri systemd v1",
        (
            "11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0d6c7b2e_4f1a.slice"
            f"/cri-containerd-{A}.scope\n1:name=systemd:/kubepods.slice/x/cri-containerd-{A}.scope\n"
        ),
        A,
    ),
    ("kubepods cgroupfs v1", f"10:memory:/kubepods/burstable/pod0d6c7b2e-4f1a-4c3b-9e8d-7a6b5c4d3e2f/{A}\n", A),
    ("kubepods cgroupfs v2", f"0::/kubepods/besteffort/pod0d6c7b2e-4f1a-4c3b-9e8d-7a6b5c4d3e2f/{A}\n", A),
    ("nerdctl systemd", f"0::/system.slice/nerdctl-{A}.scope\n", A),
    ("containerd default namespace", f"0::/default/{A}\n", A),
    ("podman", f"0::/machine.slice/libpod-{A}.scope/container\n", A),
    ("cri-o", f"0::/kubepods.slice/kubepods-pod1.slice/crio-{A}.scope\n", A),
    # Docker in Docker seen from the host: both ids, the inner one first (which one is the container depends on
    # the engine asked; tests/unit/test_procfs_parse.py resolves them on real files).
    ("docker in docker", f"1:name=systemd:/docker/{A}/docker/{B}\n0::/docker/{A}/docker/{B}\n", (B, A)),
    # Host processes: never a container.
    ("host v2 session", "0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("host v1 root", "12:pids:/\n4:memory:/\n1:name=systemd:/\n0::/\n", None),
    ("containerd daemon itself", "0::/system.slice/containerd.service\n", None),
    ("kubelet pod slice only", "0::/kubepods.slice/kubepods-besteffort.slice\n", None),
    ("a 64-hex name glued to more text", f"0::/docker/{A}x\n", None),
    ("garbage", "not a cgroup file\n\n", None),
]


@pytest.mark.parametrize(("form", "text", "want"), CGROUP_FORMS, ids=[f[0] for f in CGROUP_FORMS])
def test_cgroup_forms(form: str, text: str, want: str | tuple[str, ...] | None) -> None:
    expected = want if isinstance(want, tuple) else (want,) if want else ()
    assert parse_cgroup_container_ids(text) == expected


def test_cgroup_captured_from_a_real_docker_container() -> None:
    # /proc/PID/cgroup of a busybox container under Docker 20.10 (cgroupfs driver, cgroup v1), read on the host.
    text = (DATA / "cgroup" / "docker-v1-cgroupfs.txt").read_text()
    want = (DATA / "cgroup" / "docker-v1-cgroupfs.ids").read_text().strip()
    assert parse_cgroup_container_ids(text) == (want,)


@pytest.mark.parametrize("name", ["host-process-sandbox.txt", "host-process-h200-v2.txt"])
def test_cgroup_captured_from_a_sandboxed_host_process(name: str) -> None:
    # A 32-hex sandbox cgroup (/process_api/<hex>, cgroup v1 and v2) is not a container id.
    assert parse_cgroup_container_ids((DATA / "cgroup" / name).read_text()) == ()


def test_container_of_pid_reads_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(DOCKER_V2_SYSTEMD)
    assert container_of_pid(4242, {CTR}, proc_root=str(tmp_path)) == CTR
    assert container_of_pid(4242, {A}, proc_root=str(tmp_path)) is None  # not a container of this engine
    assert container_of_pid(4343, {CTR}, proc_root=str(tmp_path)) is None  # gone: no container, never an error


def test_gpu_processes_are_attributed_to_containers_the_engine_lists() -> None:
    """Docker in Docker on the GPU host: the engine asked knows one of the two ids on the path, never both."""
    nested = {4242: f"0::/docker/{A}/docker/{CTR}\n", 4343: f"0::/docker/{A}\n", 11: "0::/user.slice\n"}
    candidates = lambda pid: parse_cgroup_container_ids(nested.get(pid, ""))  # noqa: E731
    inner_engine = engine_container_of(SPLIT, {CTR}, candidates_of=candidates)
    assert [inner_engine(p) for p in (4242, 4343, 11)] == [CTR, None, None]
    outer_engine = engine_container_of(SPLIT, {A}, candidates_of=candidates)
    assert [outer_engine(p) for p in (4242, 4343, 11)] == [A, A, None]
    raw = with_devices({**TWO_GPUS["devices"][1], "processes": [{"pid": 4242, "used_gpu_memory": GIB}]})
    view = observe_gpus(SPLIT, read=lambda h: raw, known_containers={CTR}, command_of=lambda pid: "")
    [p] = view.slots["dark-compute-b"].processes
    assert p.container_id is None  # no /proc/4242 here: no cgroup, no container, and the process still counts


def test_without_a_given_list_the_engine_is_asked_once_and_an_unanswering_one_confirms_nothing() -> None:
    dead = HostConfig.model_validate(
        {"name": "w", "gpus": {"a": {"index": 0}}, "docker": {"url": "unix:///nonexistent/docker.sock"}}
    )
    calls: list[int] = []

    def candidates(pid: int) -> tuple[str, ...]:
        calls.append(pid)
        return (CTR,) if pid != 11 else ()

    container_of = engine_container_of(dead, candidates_of=candidates)
    assert [container_of(p) for p in (4242, 11, 4343)] == [None, None, None]
    assert calls == [4242, 11, 4343]


# ---------------------------------------------------------------- the planner reads it


def _recipe() -> Recipe:
    return Recipe.model_validate(
        {
            "tensor_parallel_size": 1,
            "model": {"id": "omni"},
            "container": {"image": "omni:test", "command": ["vllm", "serve", "omni"]},
        }
    )


def _observed(gpus: GpuView) -> Observed:
    shm = ShmView(
        "/dev/shm", "vllm_offload_*.mmap", Tmpfs(64 * GIB, 0, 64 * GIB), Reading("proc", True), ENGINE_ANSWERED
    )
    return observation("workstation", gpus=gpus, shm=shm)


def _desired() -> DesiredState:
    r = _recipe()
    return DesiredState(
        host=SPLIT,
        recipes={"omni": r},
        assignments=(
            DesiredAssignment(recipe="omni", slots=("dark-compute-b",), recipe_hash=r.content_hash(), offload_bytes=0),
        ),
    )


def test_a_stray_process_on_the_slot_blocks_the_enter_naming_the_pid() -> None:
    sandbox = (DATA / "cgroup" / "host-process-sandbox.txt").read_text()
    gpus = parse_nvml(TWO_GPUS, SPLIT, **procs({4242: sandbox}, {4242: "python3 train.py"}))
    p = plan(_desired(), _observed(gpus))
    assert p.blocked and not p.actions
    [b] = p.blockers
    assert b.holder == "pid 4242"
    assert b.reason == "pid 4242 (python3 train.py) in no container uses GPU slot dark-compute-b"


def test_the_same_manifest_enters_when_the_slot_is_free() -> None:
    idle = with_devices(TWO_GPUS["devices"][0], {**TWO_GPUS["devices"][1], "processes": [], "memory_used": 564330496})
    p = plan(_desired(), _observed(parse_nvml(idle, SPLIT, **procs({}))))
    assert not p.blocked
    assert [(a.kind.value, a.recipe, a.gpus) for a in p.actions] == [("enter", "omni", ("dark-compute-b",))]


def test_no_listed_process_but_memory_in_use_is_not_free() -> None:
    """The card still reports 84 GiB in use, but NVML lists no process (WSL2 hides Windows programs): blocked,
    naming the figure, never taken as free."""
    hidden = with_devices(TWO_GPUS["devices"][0], {**TWO_GPUS["devices"][1], "processes": []})
    p = plan(_desired(), _observed(parse_nvml(hidden, SPLIT, **procs({}))))
    [b] = p.blockers
    assert b.reason.startswith("84.00 GiB in use on dark-compute-b and no visible process")
    assert b.cause == "memory" and b.holder == "84.00 GiB unlisted"


def test_unavailable_telemetry_blocks_and_says_why() -> None:
    raw = {"error": "NVMLError_DriverNotLoaded: Driver Not Loaded", "devices": []}
    p = plan(_desired(), _observed(parse_nvml(raw, SPLIT, **procs({}))))
    assert p.unavailable == ("gpu",)
    assert p.blocked and not p.actions
    assert p.blockers[0].reason.startswith("GPU telemetry (nvml) unavailable: NVML: NVMLError_DriverNotLoaded")


def test_a_missing_gpu_blocks_only_its_slot() -> None:
    raw = with_devices(TWO_GPUS["devices"][0])
    p = plan(_desired(), _observed(parse_nvml(raw, SPLIT, **procs({}))))
    assert p.unavailable == ()
    [b] = p.blockers
    assert b.reason.startswith(
        "GPU for slot dark-compute-b not found on this host (configs/host.yaml gpus.dark-compute-b: no GPU with index 1"
    )


def test_a_cards_device_node_and_mig_devices_are_its_names_too() -> None:
    """NVML's minor number (/dev/nvidiaN) and MIG devices of each slot's card reach the planner, which resolves a
    container's device node or MIG id by them; where NVML did not say, they stay unknown (None)."""
    mig = "MIG-7a8b9c0d-1e2f-5a3b-8c4d-5e6f7a8b9c0d"
    raw = with_devices(
        {**TWO_GPUS["devices"][0], "minor": 1, "mig": []},
        {**TWO_GPUS["devices"][1], "minor": 0, "mig": [mig], "identity_errors": {}},
    )
    view = parse_nvml(raw, SPLIT, **procs({}))
    assert view.reading.ok
    a, b = view.slots["dark-compute-a"], view.slots["dark-compute-b"]
    assert (a.minor, a.mig_uuids, b.minor, b.mig_uuids) == (1, (), 0, (mig,))
    unknown = parse_nvml(TWO_GPUS, SPLIT, **procs({})).slots["dark-compute-a"]
    assert unknown.minor is None and unknown.mig_uuids is None
