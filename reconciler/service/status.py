"""``reconciler status`` as data: what each GPU slot should run and what holds it, the containers, the offload shm,
the sources, the plan and the loop; measured against the last valid desired state while the files do not validate.

Called by ``reconciler.service.host_service.HostService.status``, with its ``CallContext``; the JSON (``status_data``) is the contract of
docs/design.md, "JSON output", and ``reconciler.cli.render.render_status`` turns it into text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.apply.host_io import REAL_IO, HostIO
from reconciler.base.errors import ConfigError
from reconciler.load.desired import _secret_digests
from reconciler.load.host_file import load_host
from reconciler.load.recipes import load_recipes
from reconciler.model import DesiredAssignment, DesiredState
from reconciler.observe.lanes import GAUGE_KEYS, LaneReading
from reconciler.plan.actions import Plan
from reconciler.plan.claims import node_slots, owner_kind, slot_holders, slot_ids
from reconciler.plan.enter_checks import enter_needs
from reconciler.plan.observed import ContainerView, Observed, ShmFile, ShmView
from reconciler.plan.planner import plan
from reconciler.plan.verdict import acting, decide, in_flight
from reconciler.plan.vram import slot_vram, unlisted_used_bytes
from reconciler.service.alias_verdicts import alias_verdicts
from reconciler.service.loop_view import loop_view
from reconciler.service.results import StatusResult, error_object, sources_error
from reconciler.store.door_state import door_status
from reconciler.store.history import last_topology
from reconciler.store.loop_state import read_loop_state
from reconciler.store.probe_history import last_suites
from reconciler.store.source import read_source_record

if TYPE_CHECKING:
    from reconciler.service.context import CallContext


def status_data(
    desired: DesiredState, observed: Observed, plan: Plan, lanes: Mapping[str, LaneReading] | None = None
) -> dict[str, Any]:
    """The JSON of ``reconciler status``: per slot what is desired and what holds it, containers, shm, sources;
    ``lanes``, what each running lane's server said of itself (``lane_readings``), by container name."""
    held = slot_holders(desired, observed)
    want = desired.slot_owner()
    own = observed.ownership
    whose = {c.id: owner_kind(c, desired.host.name, own) for c in observed.containers}
    by_id = {c.id: c for c in observed.containers}
    # What could not be observed is unknown, never "free": without Docker no container is known, and without GPU
    # telemetry (where the host has it) a process outside any container may hold a slot.
    blind = [s.name for s in (observed.docker, observed.gpus.reading) if not s.ok]
    slots: dict[str, Any] = {}
    ids = slot_ids(desired.host, observed)
    # The processes holding a card's node open, by the slots they hold (safety rule 11).
    nodes: dict[str, list[dict[str, Any]]] = {}
    for h in observed.card_nodes.holders:
        for s in node_slots(h.minor, ids, tuple(desired.host.gpus)):
            shown = {"pid": h.pid, "node": f"/dev/nvidia{h.minor}", "container": h.container, "command": h.command}
            nodes.setdefault(s, []).append(shown)

    def sleeping(c: ContainerView) -> bool | None:
        """The lane's own answer (sleeping lanes rule 3: asleep is never serving); None: no sleep mode, or none."""
        return observed.sleeping.get(c.id) if desired.sleeps(c.recipe) and c.state == "running" else None

    for slot, gpu in desired.host.gpus.items():
        holders = held.get(slot, [])
        view = observed.gpus.slots.get(slot)
        procs = []
        for p in view.processes if view else ():
            owner = by_id.get(p.container_id) if p.container_id else None
            procs.append(
                {
                    "pid": p.pid,
                    "used_bytes": p.used_bytes,
                    "container": owner.name if owner else p.container_id,
                    "command": p.command,
                    "resolved": p.resolved,
                }
            )
        d = want.get(slot)
        nvml_ok = observed.gpus.telemetry == "nvml" and observed.gpus.reading.ok
        fig = slot_vram(desired.host, view) if nvml_ok else None
        unlisted = unlisted_used_bytes(desired.host, view) if nvml_ok and not holders else None
        slots[slot] = {
            "desired": d.recipe if d else None,
            "index": view.index if view and view.index is not None else gpu.index,
            "uuid": view.uuid if view and view.uuid else gpu.uuid,
            "name": view.name if view else "",
            "missing": bool(view and view.missing),
            "error": view.error if view else "",
            "memory_total_bytes": view.memory_total_bytes if view else None,
            "memory_used_bytes": view.memory_used_bytes if view else None,
            "containers": [
                {
                    "name": c.name,
                    "id": c.id[:12],
                    "managed": whose[c.id] == "ours",
                    "owner": whose[c.id],
                    "recipe": c.recipe,
                    "state": c.state,
                    "healthy": c.id in own.healthy,
                    "sleeping": sleeping(c),
                }
                for c in holders
            ],
            "processes": procs,
            # What the sleeping lanes on this card still hold (sleeping lanes rule 2: it counts against the reserve).
            "asleep_bytes": sum(
                p.used_bytes or 0
                for p in (view.processes if view else ())
                if observed.sleeping.get(p.container_id or "")
            )
            if nvml_ok
            else None,
            "node_holders": nodes.get(slot, []),
            "free": False if holders or procs or unlisted or nodes.get(slot) else (None if blind else True),
            "unknown": blind,
            "memory_free_bytes": fig.free_bytes if fig else None,
            "reserve_bytes": fig.reserve_bytes if fig else None,
            "below_reserve": fig.below_reserve if fig else None,
            "reserve_policy": desired.reserve_policy(d.recipe if d else None),
            "unlisted_used_bytes": unlisted,
            "utilization_percent": view.utilization_percent if view else None,
        }
    shm = observed.shm
    return {
        "host": desired.host.name,
        "converged": plan.converged,
        "manifest": desired.manifest_path,
        "topology": desired.topology,
        # The host's git source (source: of the host file): the commit in use and what holds a newer one back.
        "source": source_json(desired),
        # The standby topologies' lanes kept asleep beside the running ones (sleeping lanes): wanted, not serving.
        "standby": [{"recipe": a.recipe, "gpus": list(a.slots)} for a in desired.standby],
        "gpu_telemetry": observed.gpus.telemetry,
        "gpu_source": observed.gpus.reading.detail or observed.gpus.reading.render(),
        # What the driver answers (learnt from its answers): "reported", "not reported" (WSL2), "unknown".
        "gpu_driver_reports": {
            "process_memory": observed.gpus.process_memory,
            "utilization": observed.gpus.utilization,
        },
        "sources": {n: v.render() for n, v in observed.readings.items()},
        "slots": slots,
        "containers": [
            {
                "name": c.name,
                "id": c.id[:12],
                "state": c.state,
                "recipe": c.recipe,
                "slots": list(c.slots),
                "recipe_hash": c.recipe_hash,
                "preserved": c.preserved,
                "exit_code": c.exit_code,
                "owner": whose[c.id],
                "healthy": c.id in own.healthy,
                "sleeping": sleeping(c),
                # A current vLLM's offload file, unlinked once mapped: its bytes, held by this container's pids.
                "shm_deleted_mapped_bytes": _deleted_mapped_bytes(shm.deleted_mapped, c),
                "vllm": _vllm(c, (lanes or {}).get(c.name), shm, asked=lanes is not None),
            }
            for c in observed.containers
            if whose[c.id] != "foreign"
        ],
        "install_id": own.install_id,
        "shm": {
            "dir": shm.dir,
            "tmpfs": {
                "size_bytes": shm.tmpfs.size_bytes,
                "used_bytes": shm.tmpfs.used_bytes,
                "free_bytes": shm.tmpfs.free_bytes,
            },
            "files": {
                state: {"count": len(shm.by_state(state)), "bytes": sum(f.allocated_bytes for f in shm.by_state(state))}
                for state in ("owned", "orphan", "blocked")
            },
            "deleted_mapped_bytes": shm.deleted_mapped_bytes,
            "blocking_containers": list(shm.blocking_containers),
        },
        "plan": plan.to_json(),
        "loop": read_loop_state(desired.host.name),
        "door": door_status(desired.host.name),
    }


def host_status(ctx: CallContext) -> StatusResult:
    """``reconciler status``: per slot what is desired and what holds it, as the loop's view plans it, with the last
    run of each recipe's probe suites; against the last valid desired state while the files do not validate."""
    io = ctx.io or REAL_IO
    try:
        desired = ctx.desired()
    except ConfigError as exc:
        return status_of_invalid_files(ctx.root, exc, io)
    view = loop_view(desired.host.name)
    observed = io.observe(desired.host, **enter_needs(desired, view.get("last_good", ())))
    lanes = io.lanes.readings(desired, observed)
    data = status_data(desired, observed, plan(desired, observed, **view), lanes)
    data["probe_suites"] = last_suites(desired.host.name, set(desired.recipes))
    if desired.aliases:
        data["aliases"] = alias_verdicts(desired)
    if observed.unavailable():
        data["error"] = sources_error(observed)
    return StatusResult(with_verdict(data), observed)


def with_verdict(data: dict[str, Any]) -> dict[str, Any]:
    """The status with its verdict (``reconciler.plan.verdict``, the one every view gives): not converged while a
    pass of the running loop is acting, whatever the plan made meanwhile says."""
    data["converged"] = bool(data.get("converged")) and not acting(data)
    data["verdict"] = decide(data).to_json()
    for a in (data.get("plan") or {}).get("actions") or ():
        # The plan made now sees the pass's own enter waiting for health as one an apply left waiting: it is not.
        if isinstance(a, dict) and in_flight(data, a):
            a["reason"] = f"in flight: the running loop's own {a.get('kind')}, in the pass running now"
    return data


def status_of_invalid_files(root: str, exc: ConfigError, io: HostIO = REAL_IO) -> StatusResult:
    """``status`` while the files do not validate: what the host runs, measured against the last valid desired
    state (the running loop's, which it keeps acting on; else the last converged topology), with the files'
    error in the answer (exit 1). Without a valid host file there is nothing to observe by: the error alone."""
    try:
        host = load_host(root, io.tmpfs)
    except ConfigError:
        raise exc from None
    try:
        recipes = load_recipes(Path(root))
    except ConfigError:
        recipes = {}
    kept = (read_loop_state(host.name) or {}).get("desired")
    if isinstance(kept, dict):
        source, manifest = "the running loop's last valid desired state", kept.get("manifest")
        pairs = [
            (a.get("recipe"), tuple(a.get("gpus") or ())) for a in kept.get("assignments") or () if isinstance(a, dict)
        ]
    else:
        source, manifest = "the last converged topology (no loop is running)", None
        pairs = list(last_topology(host.name))
    assignments = tuple(
        DesiredAssignment(r, slots, recipes[r].content_hash(), recipes[r].offload.capacity_bytes)
        for r, slots in pairs
        if isinstance(r, str) and r in recipes and slots and all(s in host.gpus for s in slots)
    )
    digests, legacy = _secret_digests(Path(root), host, recipes, [])
    desired = DesiredState(
        host=host,
        recipes=recipes,
        assignments=assignments,
        manifest_path=manifest,
        secret_digests=digests,
        legacy_secret_digests=legacy,
    )
    observed = io.observe(host)
    data = status_data(desired, observed, plan(desired, observed, **loop_view(host.name)))
    data["desired_from"] = source if pairs else "none: no loop is running and no topology ever converged"
    data["error"] = error_object(
        "config_invalid",
        "the files do not validate; fix them (`reconciler validate` says the same)",
        problems=[{"path": p.path, "line": p.line, "message": p.message} for p in exc.problems],
    )
    return StatusResult(with_verdict(data), observed)


def _deleted_mapped_bytes(deleted: Sequence[ShmFile], c: ContainerView) -> int:
    """The allocated bytes of the unlinked-but-mapped offload files some process of container ``c`` holds."""
    names = c.names
    return sum(f.allocated_bytes for f in deleted if any(o.container in names for o in f.owners))


def _vllm(c: ContainerView, reading: LaneReading | None, shm: ShmView, *, asked: bool) -> dict[str, Any]:
    """A container's vLLM as its server and the tmpfs say: its release, its gauges, and whether its offload file
    is ``named`` (in shm.dir) or ``unlinked`` (mapped with no name: a current vLLM), None where it holds none."""
    names = c.names
    if any(o.container in names for f in shm.files for o in f.owners):
        offload = "named"
    elif any(o.container in names for f in shm.deleted_mapped for o in f.owners):
        offload = "unlinked"
    else:
        offload = None
    if reading is None:
        return {
            "version": None,
            "offload_file": offload,
            "gauges": dict.fromkeys(GAUGE_KEYS),
            "error": "not read: no running lane of this install"
            if asked
            else "not read: the files do not validate, so no lane's server is asked",
        }
    return {**reading.to_json(), "offload_file": offload}


def source_json(desired: DesiredState) -> dict[str, Any] | None:
    """The host's git source as ``status`` and the fleet's canaries read it; None for a root's own files."""
    src = desired.host.source
    if src is None:
        return None
    record = read_source_record(desired.host.name).for_source(src.git, src.ref, src.path)
    return {**record.to_json(), "in_use": desired.source_commit, "after": list(src.after)}
