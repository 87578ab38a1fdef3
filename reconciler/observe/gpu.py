"""GPU telemetry behind one interface: ``observe_gpus(host) -> GpuView``.

``none`` (a host without NVIDIA GPUs: the demo, CI): every configured slot is reported with no processes,
and GPU occupancy comes from Docker alone. ``nvml`` reads the GPUs through NVML (``nvidia-ml-py``), split
into a read and a parse:

- ``read_nvml(host)`` is the only code that talks to NVML. It returns plain, JSON-able data (the devices by
  index with name, UUID, memory and compute processes, and every failed call as text) and never raises.
- ``parse_nvml(raw, host, container_of=..., command_of=...)`` is pure: it resolves each configured slot to a
  GPU (by UUID when ``configs/host.yaml`` gives one, else by index), attributes each process to a container
  through the callables it is handed, and decides whether the source is usable. It is tested on captured
  NVML answers.

Fail closed: with ``gpu_telemetry: nvml`` any NVML error (library missing, driver not loaded, a GPU lost, a
failed per-device call on a configured slot) makes the source unavailable, so the planner blocks every enter
that needs a GPU. A configured slot whose GPU is not on the host is ``missing``: that blocks the slot alone.
NVML indices are the driver's (PCI bus order), the same ones the NVIDIA container runtime and
``nvidia-smi`` use; ``CUDA_VISIBLE_DEVICES`` inside a process may order them differently.

Called by ``reconciler.observe.observe`` (every observation pass) and the apply layer's re-observation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from reconciler.model import HostConfig
from reconciler.observe.procfs import container_candidates_of_pid, innermost_known, read_comm
from reconciler.plan.observed import GpuProcess, GpuSlotView, GpuView, Reading

HOST_FILE = "configs/host.yaml"
_FIX_NONE = f"on a host without NVIDIA GPUs set 'gpu_telemetry: none' in {HOST_FILE}"

RawNvml = dict[str, Any]


def nvml_error(exc: BaseException) -> str:
    """One line naming the NVML error class and its text, e.g. 'NVMLError_DriverNotLoaded: Driver Not Loaded'."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def nvml_text(value: object) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------- the read (I/O)


def read_nvml(host: HostConfig) -> RawNvml:
    """Ask NVML about the GPUs; plain data back, never an exception.

    Name and UUID are read for every device (a slot given by UUID may be any of them); memory and compute
    processes only for devices a configured slot points at, by index or UUID. Shape::

        {"error": None | "NVMLError_...: text", "driver_version": str, "device_count": int, "read_s": float,
         "devices": [{"index", "name", "uuid", "memory_total", "memory_used", "memory_free",
                      "utilization_gpu" | "utilization_error",
                      "minor", "mig": [MIG UUIDs], "identity_errors": {call: text},
                      "processes": [{"pid", "used_gpu_memory"}], "errors": {call: "NVMLError_...: text"}}]}

    ``used_gpu_memory`` is None where the driver does not report a process's memory (the binding turns NVML's
    NVML_VALUE_NOT_AVAILABLE into None: WSL2 and Windows WDDM drivers).
    """
    started = time.monotonic()
    raw: RawNvml = {"error": None, "driver_version": "", "device_count": 0, "devices": [], "read_s": 0.0}
    try:
        import pynvml  # here: hosts with gpu_telemetry none never need it
    except ImportError as exc:
        raw["error"] = f"the nvidia-ml-py package is not installed ({exc}); pip install nvidia-ml-py"
        return raw
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_* subclasses, or OSError from the C loader
        raw["error"] = nvml_error(exc)
        raw["read_s"] = time.monotonic() - started
        return raw
    try:
        _read_devices(pynvml, host, raw)
    except Exception as exc:  # noqa: BLE001 - the read must never raise; the parse turns this into "unavailable"
        raw["error"] = nvml_error(exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - a failed shutdown does not spoil what was read
            raw.setdefault("shutdown_error", nvml_error(exc))
    raw["read_s"] = time.monotonic() - started
    return raw


def _read_devices(pynvml: Any, host: HostConfig, raw: RawNvml) -> None:
    try:
        raw["driver_version"] = nvml_text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as exc:
        raw["driver_version_error"] = nvml_error(exc)
    count = int(pynvml.nvmlDeviceGetCount())
    raw["device_count"] = count
    want_index = {g.index for g in host.gpus.values() if g.index is not None}
    want_uuid = {g.uuid for g in host.gpus.values() if g.uuid}
    for index in range(count):
        dev: dict[str, Any] = {"index": index, "errors": {}}
        raw["devices"].append(dev)
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            dev["errors"]["handle"] = nvml_error(exc)
            continue
        for key, call in (("uuid", pynvml.nvmlDeviceGetUUID), ("name", pynvml.nvmlDeviceGetName)):
            try:
                dev[key] = nvml_text(call(handle))
            except pynvml.NVMLError as exc:
                dev["errors"][key] = nvml_error(exc)
        if index not in want_index and dev.get("uuid") not in want_uuid and "uuid" in dev:
            continue  # not a configured slot: name and UUID are all anyone needs from it
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            dev["memory_total"] = int(mem.total)
            dev["memory_used"] = int(mem.used)
            dev["memory_free"] = int(mem.free)
        except pynvml.NVMLError as exc:
            dev["errors"]["memory"] = nvml_error(exc)
        try:
            dev["utilization_gpu"] = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError as exc:
            # Not a failure of the source: WSL2's driver answers N/A (Not Supported) here, and nothing needs it.
            dev["utilization_error"] = nvml_error(exc)
        _read_identity(pynvml, handle, dev)
        try:
            procs = _compute_processes(pynvml, handle)
            dev["processes"] = [
                {"pid": int(p.pid), "used_gpu_memory": None if p.usedGpuMemory is None else int(p.usedGpuMemory)}
                for p in procs
            ]
        except pynvml.NVMLError as exc:
            dev["errors"]["processes"] = nvml_error(exc)


def _read_identity(pynvml: Any, handle: Any, dev: dict[str, Any]) -> None:
    """The other names a container may give this card: its device node's minor number (``/dev/nvidiaN``) and the
    UUIDs of its MIG devices (``[]`` with MIG off). A call that fails leaves the key out and says why in
    ``identity_errors``: not a failure of the source, but a container naming the card so then holds every slot."""
    errors: dict[str, str] = {}
    try:
        dev["minor"] = int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError as exc:
        errors["minor"] = nvml_error(exc)
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        current = 0  # a card without MIG has no MIG devices
    except pynvml.NVMLError as exc:
        errors["mig"] = nvml_error(exc)
        current = None
    if current == 0:
        dev["mig"] = []
    elif current is not None:
        migs: list[str] = []
        try:
            for i in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                except pynvml.NVMLError_NotFound:
                    continue  # no MIG device at this index
                migs.append(nvml_text(pynvml.nvmlDeviceGetUUID(mig)))
            dev["mig"] = migs
        except pynvml.NVMLError as exc:
            errors["mig"] = nvml_error(exc)
    if errors:
        dev["identity_errors"] = errors


def _compute_processes(pynvml: Any, handle: Any) -> list[Any]:
    try:
        return list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except pynvml.NVMLError_FunctionNotFound:
        # A driver older than the bindings lacks the _v3 entry point; _v2 answers the same question.
        return list(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle))


class MemoryReader:
    """Free and total memory of some slots' cards, read again and again while NVML stays initialised: the VRAM
    sampler's read while a probe suite runs (``reconciler.plan.vram.VramSampler``), a few times a second. A context
    manager; each slot's card is found as ``parse_nvml`` finds it (by UUID when given, else by index)."""

    def __init__(self, host: HostConfig, slots: Collection[str]):
        self.host = host
        self.slots = tuple(slots)
        self._pynvml: Any = None
        self._handles: dict[str, Any] = {}

    def __enter__(self) -> MemoryReader:
        import pynvml  # here: hosts with gpu_telemetry none never need it

        pynvml.nvmlInit()
        self._pynvml = pynvml
        for slot in self.slots:
            gpu = self.host.gpus.get(slot)
            if gpu is None:
                continue
            try:
                if gpu.uuid:
                    self._handles[slot] = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                elif gpu.index is not None:
                    self._handles[slot] = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except pynvml.NVMLError:
                continue  # no sample for it: the verdict names the slot as not sampled
        return self

    def __call__(self) -> dict[str, tuple[int, int]]:
        out = {}
        for slot, handle in self._handles.items():
            mem = self._pynvml.nvmlDeviceGetMemoryInfo(handle)
            out[slot] = (int(mem.free), int(mem.total))
        return out

    def __exit__(self, *exc: object) -> None:
        if self._pynvml is not None:
            with contextlib.suppress(Exception):  # a failed shutdown does not spoil what was read
                self._pynvml.nvmlShutdown()
            self._pynvml = None


# ---------------------------------------------------------------- the parse (pure)


def parse_nvml(
    raw: Mapping[str, Any],
    host: HostConfig,
    *,
    container_of: Callable[[int], str | None],
    command_of: Callable[[int], str],
) -> GpuView:
    """Turn one ``read_nvml`` answer into the slots the planner reads.

    ``container_of(pid)`` gives the full id of the engine's container a host pid runs in (None: in none of the
    engine's containers; see ``engine_container_of``);
    ``command_of(pid)`` a short command line for humans ('' when the pid is gone).
    """
    if raw.get("error"):
        detail = f"NVML: {raw['error']}; {_FIX_NONE}"
        return _unavailable(host, detail)

    devices: list[Mapping[str, Any]] = list(raw.get("devices") or [])
    by_index = {int(d["index"]): d for d in devices}
    # NVML writes a UUID as GPU- and lowercase hex; the same UUID in other letters names the same card.
    by_uuid = {str(d["uuid"]).lower(): d for d in devices if d.get("uuid")}
    unreadable = [d for d in devices if "uuid" not in d]

    slots: dict[str, GpuSlotView] = {}
    problems: list[str] = []
    cards: dict[int, list[str]] = {}  # each slot resolved to its card (NVML index), before anything is decided
    for slot, gpu in host.gpus.items():
        where = f"{HOST_FILE} gpus.{slot}"
        dev: Mapping[str, Any] | None
        if gpu.uuid:
            dev = by_uuid.get(gpu.uuid.lower())
            if dev is None:
                if unreadable:
                    # The GPU may be one whose UUID NVML would not give: not knowing is not "missing".
                    idx = ", ".join(str(d["index"]) for d in unreadable)
                    why = f"{where}: uuid {gpu.uuid} not among the readable GPUs; GPU(s) {idx} did not answer"
                    problems.append(why)
                    slots[slot] = GpuSlotView(slot=slot, index=gpu.index, uuid=gpu.uuid, error=why)
                    continue
                found = ", ".join(f"{d['index']}={d['uuid']}" for d in devices) or "none"
                why = f"{where}: no GPU with uuid {gpu.uuid} (found: {found})"
                slots[slot] = _missing(slot, gpu.index, gpu.uuid, why)
                continue
            if gpu.index is not None and int(dev["index"]) != gpu.index:
                # Containers may name this GPU by either id; they must agree or the slot means two GPUs.
                why = (
                    f"{where}: uuid {gpu.uuid} is GPU index {dev['index']}, but index {gpu.index} is given; "
                    "fix the index or remove it"
                )
                slots[slot] = _missing(slot, gpu.index, gpu.uuid, why)
                continue
            cards.setdefault(int(dev["index"]), []).append(slot)
            if dev["uuid"] != gpu.uuid:
                # The card is known, but the runtime is handed the UUID as written: only NVML's spelling is sure.
                why = (
                    f"{where}: uuid {gpu.uuid} is GPU {dev['index']}'s uuid {dev['uuid']} in other letters; write it "
                    "as NVML does (nvidia-smi -L shows it)"
                )
                slots[slot] = _missing(slot, gpu.index, gpu.uuid, why)
                continue
        else:
            dev = by_index.get(int(gpu.index)) if gpu.index is not None else None
            if dev is None:
                count = int(raw.get("device_count") or len(devices))
                why = f"{where}: no GPU with index {gpu.index}; this host has {count} GPU(s) (indices 0..{count - 1})"
                slots[slot] = _missing(slot, gpu.index, gpu.uuid, why)
                continue
            cards.setdefault(int(dev["index"]), []).append(slot)
        view, errors = _slot_view(slot, dev, container_of=container_of, command_of=command_of)
        problems.extend(f"{where} (GPU {dev['index']}): {e}" for e in errors)
        slots[slot] = view

    for index, on_card in cards.items():
        if len(on_card) > 1:
            why = _one_card(host, on_card, by_index[index])
            problems.append(why)
            for slot in on_card:
                view = slots[slot]
                slots[slot] = replace(view, error=f"{view.error}; {why}" if view.error else why)

    answers = _driver_answers(slots.values())
    if problems:
        source = Reading("gpu", False, "NVML: " + "; ".join(problems))
        return GpuView(telemetry="nvml", reading=source, slots=slots, **answers)
    driver = raw.get("driver_version") or "unknown"
    detail = f"NVML driver {driver}, {raw.get('device_count', len(devices))} GPU(s)"
    return GpuView(telemetry="nvml", reading=Reading("gpu", True, detail), slots=slots, **answers)


def _one_card(host: HostConfig, on_card: list[str], dev: Mapping[str, Any]) -> str:
    """The host error for slots that resolve to one card: two recipes could enter it, each sure it is alone."""

    def written(slot: str) -> str:
        g = host.gpus[slot]
        ids = [f"uuid {g.uuid}"] if g.uuid else []
        ids += [f"index {g.index}"] if g.index is not None else []
        return f"{slot!r} ({', '.join(ids)})"

    names = [written(s) for s in on_card]
    listed = " and ".join(names) if len(names) == 2 else ", ".join(names[:-1]) + f" and {names[-1]}"
    return (
        f"{HOST_FILE} gpus: slots {listed} are one card, GPU {dev['index']} ({dev.get('uuid', 'uuid unknown')}), "
        f"and two recipes could enter it; give each slot its own card in {HOST_FILE} (nvidia-smi -L lists each "
        "card's index and uuid)"
    )


def _driver_answers(views: Collection[GpuSlotView]) -> dict[str, str]:
    """What this driver answers, judged by what it answered: per-process memory (None for every listed process:
    not reported, as on WSL2) and utilisation."""
    procs = [p for v in views for p in v.processes]
    if not procs:
        memory = "unknown"
    elif all(p.used_bytes is None for p in procs):
        memory = "not reported"
    else:
        memory = "reported"
    read = [v for v in views if not v.missing and not v.error]
    if any(v.utilization_percent is not None for v in read):
        util = "reported"
    else:
        util = "not reported" if read else "unknown"
    return {"process_memory": memory, "utilization": util}


def _slot_view(
    slot: str,
    dev: Mapping[str, Any],
    *,
    container_of: Callable[[int], str | None],
    command_of: Callable[[int], str],
) -> tuple[GpuSlotView, list[str]]:
    errors = [f"{call} failed: {text}" for call, text in sorted((dev.get("errors") or {}).items())]
    used: dict[int, int | None] = {}
    for p in dev.get("processes") or []:
        pid = int(p["pid"])
        mem = p.get("used_gpu_memory")
        # A pid can appear once per context (MIG instances, several contexts): one entry, memory summed.
        if pid in used and used[pid] is not None and mem is not None:
            used[pid] = int(used[pid]) + int(mem)  # type: ignore[arg-type]
        elif pid in used:
            used[pid] = None
        else:
            used[pid] = None if mem is None else int(mem)
    processes = []
    for pid in sorted(used):
        command = command_of(pid)
        # A pid with no /proc entry here: in another pid namespace (WSL2 lists container pids so), or just gone.
        processes.append(
            GpuProcess(
                pid=pid, used_bytes=used[pid], container_id=container_of(pid), command=command, resolved=bool(command)
            )
        )
    util = dev.get("utilization_gpu")
    view = GpuSlotView(
        slot=slot,
        index=int(dev["index"]),
        uuid=dev.get("uuid"),
        name=str(dev.get("name") or ""),
        memory_total_bytes=dev.get("memory_total"),
        memory_used_bytes=dev.get("memory_used"),
        processes=tuple(processes),
        error="; ".join(errors),
        memory_free_bytes=dev.get("memory_free"),
        utilization_percent=None if util is None else int(util),
        minor=None if dev.get("minor") is None else int(dev["minor"]),
        mig_uuids=None if dev.get("mig") is None else tuple(str(u) for u in dev["mig"]),
    )
    return view, errors


def _missing(slot: str, index: int | None, uuid: str | None, why: str) -> GpuSlotView:
    return GpuSlotView(slot=slot, index=index, uuid=uuid, missing=True, error=why)


def _unavailable(host: HostConfig, detail: str) -> GpuView:
    return GpuView(
        telemetry="nvml",
        reading=Reading("gpu", False, detail),
        slots={slot: GpuSlotView(slot=slot, index=g.index, uuid=g.uuid, error=detail) for slot, g in host.gpus.items()},
    )


def slots_of_container(view: GpuView, container_id: str) -> tuple[str, ...]:
    """The slots on whose GPU any process of ``container_id`` runs, in slot order.

    For enter's postcondition: once healthy, a recipe's container must be on exactly its slots.
    """
    return tuple(slot for slot, s in view.slots.items() if any(p.container_id == container_id for p in s.processes))


def unattributable_slots(view: GpuView, slots: Collection[str]) -> tuple[str, ...]:
    """Of ``slots``, those on which NVML cannot show whose processes run: a listed pid that does not resolve
    here (another pid namespace: container pids on WSL2), or no process listed while the card reports memory in
    use beyond what nothing would (WSL2 lists none at all). Enter's postcondition then rests on Docker alone."""
    found = []
    for slot in slots:
        s = view.slots.get(slot)
        if s is None or s.missing:
            continue
        if any(not p.resolved for p in s.processes) or (not s.processes and (s.memory_used_bytes or 0) > 0):
            found.append(slot)
    return tuple(found)


# ---------------------------------------------------------------- the observer


def engine_container_of(
    host: HostConfig,
    known: Collection[str] | None = None,
    *,
    candidates_of: Callable[[int], tuple[str, ...]] = container_candidates_of_pid,
) -> Callable[[int], str | None]:
    """pid -> the innermost container on its cgroup path that the engine of ``host.docker.url`` lists.

    ``known``: the engine's container ids when the caller already listed them; otherwise they are listed once,
    on the first pid whose cgroup names a container at all. An id the engine does not list (the outer container
    of an engine that runs in one, another runtime's container) is no container: None, and the process still
    occupies its GPU. When the engine does not answer nothing can be confirmed: None too (the Docker source is
    then unavailable and blocks every enter anyway).
    """
    ids: list[Collection[str]] = [] if known is None else [known]

    def container_of(pid: int) -> str | None:
        candidates = candidates_of(pid)
        if not candidates:
            return None
        if not ids:
            # start-up: the engine's observer only when a GPU process must be matched to a container
            from reconciler.observe.containers import EngineObserver

            try:
                ids.append(EngineObserver.for_host(host).container_ids())
            except Exception:  # noqa: BLE001 - an engine that does not answer confirms nothing
                ids.append(frozenset())
        return innermost_known(candidates, ids[0])

    return container_of


def observe_gpus(
    host: HostConfig,
    *,
    read: Callable[[HostConfig], Mapping[str, Any]] = read_nvml,
    container_of: Callable[[int], str | None] | None = None,
    command_of: Callable[[int], str] = read_comm,
    known_containers: Collection[str] | None = None,
) -> GpuView:
    """The GPU view for one observation pass; never raises (a failure is an unavailable source).

    ``known_containers``: the ids the engine listed in this pass, if the caller has them (saves a list call).
    """
    if host.gpu_telemetry == "none":
        return GpuView(
            telemetry="none",
            reading=Reading("gpu", True, "GPU occupancy from Docker alone"),
            slots={slot: GpuSlotView(slot=slot, index=g.index, uuid=g.uuid) for slot, g in host.gpus.items()},
        )
    if container_of is None:
        container_of = engine_container_of(host, known_containers)
    try:
        return parse_nvml(read(host), host, container_of=container_of, command_of=command_of)
    except Exception as exc:  # noqa: BLE001 - fail closed: a malformed answer blocks GPU work, never a whole pass
        return _unavailable(host, f"NVML answer could not be read: {nvml_error(exc)}")
