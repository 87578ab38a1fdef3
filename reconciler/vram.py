"""Free VRAM per GPU slot against its reserve, and VRAM in use that no listed process explains. Pure.

The field report judges a lane by the free VRAM each card still reports once the lane is loaded ("the 128K lane
already fails the standing 3 GiB reported-free reserve"). ``configs/host.yaml`` sets that reserve
(``gpu_reserve.free_gib``, per slot ``gpus.<slot>.free_gib``) and its policy (``gpu_reserve.policy``, per recipe
``[gpu_reserve] policy``): ``report`` keeps a lane below it and says so (status, metrics, an alert); ``enforce``
makes an enter whose cards end below it a failed enter (``reconciler.apply`` calls ``enter_reserve_verdict``).

The figures are NVML's, so only ``gpu_telemetry: nvml`` has them; with ``none`` there is no reserve to judge.
Called by the planner (the occupancy check by memory), the apply layer, the status renderer and the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.model import DesiredState, HostConfig
from reconciler.observed import GpuSlotView, GpuView
from reconciler.units import human_bytes


@dataclass(frozen=True)
class SlotVram:
    """One slot's memory figures and what they mean against its reserve."""

    slot: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserve_bytes: int
    idle_used_bytes: int

    @property
    def below_reserve(self) -> bool:
        return self.free_bytes < self.reserve_bytes

    def describe(self) -> str:
        """``dark-compute-a: 1.20 GiB free of 139.80 GiB, below its 3.00 GiB reserve``."""
        where = "below" if self.below_reserve else "within"
        return (
            f"{self.slot}: {human_bytes(self.free_bytes)} free of {human_bytes(self.total_bytes)}, "
            f"{where} its {human_bytes(self.reserve_bytes)} reserve"
        )


def slot_vram(host: HostConfig, view: GpuSlotView | None) -> SlotVram | None:
    """The figures of one slot, or None where NVML gave none (telemetry none or down, GPU missing)."""
    if view is None or view.missing or view.memory_total_bytes is None or view.memory_used_bytes is None:
        return None
    free = view.free_bytes
    if free is None:
        return None
    return SlotVram(
        slot=view.slot,
        total_bytes=int(view.memory_total_bytes),
        used_bytes=int(view.memory_used_bytes),
        free_bytes=int(free),
        reserve_bytes=host.reserve_bytes(view.slot),
        idle_used_bytes=host.idle_used_bytes(view.slot),
    )


def vram_by_slot(host: HostConfig, gpus: GpuView) -> dict[str, SlotVram]:
    """Every configured slot whose figures NVML gave in this observation."""
    if gpus.telemetry != "nvml":
        return {}
    found = {}
    for slot in host.gpus:
        v = slot_vram(host, gpus.slots.get(slot))
        if v is not None:
            found[slot] = v
    return found


def unlisted_used_bytes(host: HostConfig, view: GpuSlotView | None) -> int | None:
    """VRAM in use on a card that lists no process, when it is more than the card's idle baseline
    (``gpu_reserve.idle_used_gib``): something NVML does not show holds it (on WSL2 a Windows program, or a
    process of another pid namespace). None when nothing is unexplained, or the figures are not known."""
    v = slot_vram(host, view)
    if v is None or view is None or view.processes:
        return None
    return v.used_bytes if v.used_bytes > v.idle_used_bytes else None


@dataclass(frozen=True)
class ReserveVerdict:
    """What the reserve says about an enter's slots once the lane is healthy and settled."""

    policy: str  # report | enforce
    slots: tuple[SlotVram, ...]
    below: tuple[str, ...]  # slots below their reserve
    unknown: tuple[str, ...]  # slots whose figures NVML did not give
    checked: bool  # False with gpu_telemetry none: no figures to judge

    @property
    def failed(self) -> bool:
        """Under ``enforce``, a slot below its reserve, or one whose figures are unknown, fails the enter."""
        return self.checked and self.policy == "enforce" and bool(self.below or self.unknown)

    def message(self) -> str:
        if not self.checked:
            return "free VRAM not checked: gpu_telemetry none gives no memory figures"
        parts = [v.describe() for v in self.slots]
        parts += [f"{slot}: free VRAM not reported" for slot in self.unknown]
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "checked": self.checked,
            "failed": self.failed,
            "below": list(self.below),
            "unknown": list(self.unknown),
            "slots": {
                v.slot: {"free_bytes": v.free_bytes, "total_bytes": v.total_bytes, "reserve_bytes": v.reserve_bytes}
                for v in self.slots
            },
        }


def enter_reserve_verdict(desired: DesiredState, recipe: str | None, gpus: GpuView, slots: tuple[str, ...]) -> ReserveVerdict:
    """The reserve check of an enter: ``slots`` of ``recipe``'s lane, in the GPU view seen once it is healthy
    and settled. The apply layer fails the enter when ``failed``; under ``report`` it only says so."""
    policy = desired.reserve_policy(recipe)
    if gpus.telemetry != "nvml":
        return ReserveVerdict(policy, (), (), (), checked=False)
    seen = vram_by_slot(desired.host, gpus)
    have = tuple(seen[s] for s in slots if s in seen)
    return ReserveVerdict(
        policy=policy,
        slots=have,
        below=tuple(v.slot for v in have if v.below_reserve),
        unknown=tuple(s for s in slots if s not in seen),
        checked=True,
    )
