"""Builds DesiredState and Observed values from the compact YAML of tests/cases/plan/*.yaml (pure, no I/O)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.model import GIB, DesiredAssignment, DesiredState, HostConfig, Recipe
from reconciler.observe.gpu import parse_nvml
from reconciler.plan import spec
from reconciler.plan.observed import (
    LABEL_CREATE_TOKEN,
    LABEL_HOST,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_PRESERVED,
    LABEL_RECIPE,
    LABEL_RECIPE_HASH,
    LABEL_SLOTS,
    LABEL_SPEC_HASH,
    LABEL_SPEC_PARTS,
    CardNodes,
    ContainerView,
    EnterFacts,
    GpuProcess,
    GpuSlotView,
    GpuView,
    Listener,
    NodeHolder,
    Observed,
    Owner,
    Ownership,
    Reading,
    ShmFile,
    ShmView,
    Tmpfs,
    observation,
)

SLOTS = {"dark-compute-a": 0, "dark-compute-b": 1}
NVML_DATA = Path(__file__).parent / "data" / "nvml"
INSTALL_ID = "1" * 32  # this install's id in every case; a container's `install:` overrides it (`none`: no label)


def make_recipe(
    tp: int = 1, offload_gib: float = 0, image: str = "img", command: list[str] | None = None, port: int | None = None
) -> Recipe:
    return Recipe.model_validate(
        {
            "tensor_parallel_size": tp,
            "model": {"id": "m"},
            "container": {"image": image, "command": command or ["serve"]},
            "offload": {"enabled": bool(offload_gib), "capacity_gib": offload_gib},
            **({"health": {"url": f"http://127.0.0.1:{port}/health"}} if port else {}),
        }
    )


def make_desired(case: dict[str, Any]) -> DesiredState:
    host = HostConfig.model_validate(
        {
            "name": "h",
            "gpus": {s: {"index": i, **(case.get("slots") or {}).get(s, {})} for s, i in SLOTS.items()},
            "gpu_telemetry": case.get("telemetry", "none"),
            **(case.get("host") or {}),  # more host.yaml keys (gpu_reserve, page_cache)
        }
    )
    recipes = {name: make_recipe(**(spec or {})) for name, spec in case["recipes"].items()}
    assignments = []
    for entry in case.get("manifest") or []:
        ((name, slots),) = entry.items()
        r = recipes[name]
        assignments.append(DesiredAssignment(name, tuple(slots), r.content_hash(), r.offload.capacity_bytes))
    return DesiredState(host=host, recipes=recipes, assignments=tuple(assignments), fallback=case.get("fallback", True))


def _source(name: str, spec: Any) -> Reading:
    if spec in (None, "ok"):
        return Reading(name, True)
    return Reading(name, False, str(spec))


def make_observed(case: dict[str, Any], desired: DesiredState) -> Observed:
    obs = case.get("observed") or {}
    containers = []
    for n, c in enumerate(obs.get("containers") or []):
        labels: dict[str, str] = {}
        if c.get("managed"):
            recipe = c["recipe"]
            slots = tuple(c.get("slots") or [])
            h = desired.recipes[recipe].content_hash() if recipe in desired.recipes else "gone"
            parts = (
                spec.part_hashes(desired.host, desired.recipes[recipe], slots)
                if recipe in desired.recipes and all(s in desired.host.gpus for s in slots)
                else {"recipe": "gone"}
            )
            if c.get("hash") == "stale":
                parts = {**parts, "recipe": "stale000"}
            for part in c.get("changed") or ():  # which parts differ from what the files make now
                parts = {**parts, part: "0ld0ld00"}
            labels = {
                LABEL_MANAGED: "true",
                LABEL_HOST: c.get("host", "h"),
                LABEL_RECIPE: recipe,
                LABEL_RECIPE_HASH: "stale0000" if c.get("hash") == "stale" else h,
                LABEL_SPEC_HASH: spec.spec_hash(parts),
                LABEL_SPEC_PARTS: spec.encode_parts(parts),
                LABEL_SLOTS: ",".join(slots),
            }
            install = c.get("install", INSTALL_ID)
            if install != "none":
                labels[LABEL_INSTALL] = install
            if c.get("preserved"):
                labels[LABEL_PRESERVED] = "true"
            if c.get("token"):
                labels[LABEL_CREATE_TOKEN] = c["token"]
        containers.append(
            ContainerView(
                id=c.get("id", f"{n:02d}" + "c" * 62),
                name=c["name"],
                state=c.get("state", "running"),
                image="img",
                labels=labels,
                exit_code=c.get("exit_code"),
                gpu_devices=tuple(str(g) for g in c.get("gpus") or ()),
                offload=bool(c.get("offload")),
                inherited=frozenset(c.get("inherited") or ()),
            )
        )
    healthy = frozenset(
        containers[n].id
        for n, c in enumerate(obs.get("containers") or [])
        if c.get("managed") and c.get("healthy", True)
    )
    adopted = frozenset(by.id for by in containers if by.name in set(obs.get("adopted") or ()))
    by_name = {c.name: c for c in containers}
    procs = obs.get("gpu_processes") or {}
    missing = set(obs.get("missing_gpus") or [])
    slots = {}
    for slot, idx in SLOTS.items():
        plist = tuple(
            GpuProcess(
                pid=p["pid"],
                used_bytes=p.get("mib", 100) * 1024**2,
                container_id=by_name[p["container"]].id if p.get("container") in by_name else p.get("container"),
                command=p.get("command", "python"),
                resolved=p.get("resolved", True),
            )
            for p in procs.get(slot, [])
        )
        used = (obs.get("gpu_memory_used_gib") or {}).get(slot)  # what the card reports in use (WSL2 shapes)
        # A card's other names as NVML reports them: its device node's minor number, the UUIDs of its MIG devices.
        minor = (obs.get("gpu_minor") or {}).get(slot)
        migs = (obs.get("mig") or {}).get(slot)
        slots[slot] = GpuSlotView(
            slot=slot,
            index=idx,
            uuid=None,
            processes=plist,
            missing=slot in missing,
            memory_total_bytes=None if used is None else 80 * GIB,
            memory_used_bytes=None if used is None else int(used * GIB),
            minor=minor,
            mig_uuids=None if migs is None else tuple(migs),
        )
    gpus = GpuView(telemetry=desired.host.gpu_telemetry, reading=_source("gpu", obs.get("gpu")), slots=slots)
    if case.get("nvml"):
        # An NVML answer from tests/data/nvml/ (captured, or built where marked so), through the real parse. `pids`
        # says which pid runs in which container, with what command; a pid not named there does not resolve.
        pids = {int(k): v for k, v in (case.get("pids") or {}).items()}

        def container_of(pid: int) -> str | None:
            name = (pids.get(pid) or {}).get("container")
            return by_name[name].id if name in by_name else name

        def command_of(pid: int) -> str:
            return (pids.get(pid) or {}).get("command", "")

        raw = json.loads((NVML_DATA / case["nvml"]).read_text())
        gpus = parse_nvml(raw, desired.host, container_of=container_of, command_of=command_of)
    shm_spec = obs.get("shm") or {}
    files = []
    for n, f in enumerate(shm_spec.get("files") or []):
        size = int(f.get("gib", 1) * GIB)
        owners = tuple(Owner(pid=1000 + n, via="map", container=o) for o in f.get("owners") or [])
        files.append(
            ShmFile(
                path=f"/dev/shm/{f['name']}",
                dev=42,
                inode=100 + n,
                size_bytes=size,
                allocated_bytes=size,
                owners=owners,
                state=f.get("state", "owned" if owners else "orphan"),
            )
        )
    # `deleted:` files unlinked but still mapped (a current vLLM's offload file): no name, used space all the same.
    deleted = []
    for n, f in enumerate(shm_spec.get("deleted") or []):
        size = int(f.get("gib", 1) * GIB)
        owners = tuple(Owner(pid=2000 + n, via="map", container=o) for o in f.get("owners") or [])
        deleted.append(
            ShmFile(
                path="/dev/shm/vllm_offload_deleted.mmap (deleted)",
                dev=42,
                inode=200 + n,
                size_bytes=size,
                allocated_bytes=size,
                owners=owners,
                state="owned",
            )
        )
    size = int(shm_spec.get("size_gib", 31.4) * GIB)
    held = [*(shm_spec.get("files") or []), *(shm_spec.get("deleted") or [])]
    free = int(shm_spec.get("free_gib", 31.4 - sum(f.get("gib", 1) for f in held)) * GIB)
    docker = _source("docker", obs.get("docker"))
    shm = ShmView(
        dir="/dev/shm",
        pattern="vllm_offload_*.mmap",
        tmpfs=Tmpfs(size_bytes=size, used_bytes=size - free, free_bytes=free),
        proc=_source("proc", shm_spec.get("proc")),
        docker=docker,
        files=tuple(files),
        blocking_containers=tuple(shm_spec.get("blocking") or ()),
        deleted_mapped_bytes=sum(f.allocated_bytes for f in deleted),
        deleted_mapped=tuple(deleted),
    )
    # This install's record of the containers it created: every managed one but a `copied:` one (a copy of a lane
    # made from its labels); `record: none`: an install from before the record (its first apply records them).
    created = frozenset(
        containers[n].id for n, c in enumerate(obs.get("containers") or []) if c.get("managed") and not c.get("copied")
    )
    ownership = Ownership(
        install_id=obs.get("install_id", INSTALL_ID),
        adopted=adopted,
        healthy=healthy | adopted,
        created=None if obs.get("record") == "none" else created,
        pending=frozenset((name, token) for name, token in obs.get("pending") or ()),
    )
    # What the engine and /proc/net say for the enters' knowable failures: `images` (name -> present),
    # `gpu_runtime` (present | absent | unknown), `listeners` ([{port, container | pid, address}]) on `ports`.
    e = obs.get("enter") or {}
    listeners = tuple(
        Listener(
            address=x.get("address", "0.0.0.0"),
            port=x["port"],
            inode=5000 + n,
            pid=x.get("pid", 7000 + n) if x.get("pid", 0) is not None else None,
            command=x.get("command", ""),
            container_id=by_name[x["container"]].id if x.get("container") in by_name else None,
        )
        for n, x in enumerate(e.get("listeners") or [])
    )
    enter = EnterFacts(
        images=tuple((k, bool(v)) for k, v in (e.get("images") or {}).items()),
        gpu_runtime=e.get("gpu_runtime", "unknown"),
        gpu_runtime_detail=e.get("gpu_runtime_detail", "runtimes: runc; no CDI device nvidia.com/gpu=*"),
        ports=frozenset(e.get("ports") or {x.port for x in listeners}),
        listeners=listeners,
    )
    # `card_nodes:` the processes the /proc scan found holding a card's node open ([{pid, minor, container}]), or
    # `unread` where that scan could not be made.
    nodes = obs.get("card_nodes") or []
    card_nodes = (
        CardNodes(read=False, detail="proc unavailable: /proc: processes kept appearing")
        if nodes == "unread"
        else CardNodes(
            tuple(
                NodeHolder(
                    pid=x["pid"],
                    minor=x["minor"],
                    container_id=by_name[x["container"]].id if x.get("container") in by_name else None,
                    container=x.get("container"),
                    command=x.get("command", "python"),
                )
                for x in nodes
            )
        )
    )
    return observation(
        "h",
        containers=containers,
        gpus=gpus,
        shm=shm,
        docker=docker,
        ownership=ownership,
        enter=enter,
        card_nodes=card_nodes,
    )
