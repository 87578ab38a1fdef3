"""Free VRAM per GPU slot against its reserve, VRAM in use that no listed process explains, and free VRAM sampled
under load while a probe suite runs. Pure but for the sampler's thread, which reads through a callable it is given.

The field report judges a lane by the free VRAM each card still reports once the lane is loaded ("the 128K lane
already fails the standing 3 GiB reported-free reserve"). ``configs/host.yaml`` sets that reserve
(``gpu_reserve.free_gib``, per slot ``gpus.<slot>.free_gib``) and its policy (``gpu_reserve.policy``, per recipe
``[gpu_reserve] policy``): ``report`` keeps a lane below it and says so (status, metrics, an alert); ``enforce``
makes an enter whose cards end below it a failed enter (``reconciler.apply`` calls ``enter_reserve_verdict``).

The figures are NVML's, so only ``gpu_telemetry: nvml`` has them; with ``none`` there is no reserve to judge.
Called by the planner (the occupancy check by memory), the apply layer, the status renderer and the metrics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from reconciler.base.units import human_bytes
from reconciler.model import DesiredState, HostConfig
from reconciler.plan.observed import GpuSlotView, GpuView


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


def enter_reserve_verdict(
    desired: DesiredState, recipe: str | None, gpus: GpuView, slots: tuple[str, ...]
) -> ReserveVerdict:
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


# ---------------------------------------------------------------- free VRAM under load, while a probe suite runs
#
# The report regrets that "per-card free-VRAM telemetry was not sampled" during its context ladder: a lane at rest
# keeps more free than the same lane serving a 128K prompt or twenty requests at once. So while a suite runs, its
# cards are sampled a few times a second, and the reserve judges the lowest figure each card reported, naming the
# probe that was running then.

SAMPLE_INTERVAL_S = 0.2  # NVML's memory query takes well under a millisecond; five a second catches a batch's peak


@dataclass(frozen=True)
class LoadLow:
    """One card's lowest free figure while a suite ran, and what ran then."""

    slot: str
    free_bytes: int
    total_bytes: int
    reserve_bytes: int
    probe: str | None  # the probe running when it was sampled; None before the first or after the last
    at_s: float  # seconds into the suite
    samples: int

    @property
    def below_reserve(self) -> bool:
        return self.free_bytes < self.reserve_bytes

    def describe(self) -> str:
        """``dark-compute-a: 1.20 GiB free of 139.80 GiB at its lowest, during probe 'batch' (12.4 s in), below
        its 3.00 GiB reserve``."""
        during = f"during probe {self.probe!r}" if self.probe else "between probes"
        where = "below" if self.below_reserve else "within"
        return (
            f"{self.slot}: {human_bytes(self.free_bytes)} free of {human_bytes(self.total_bytes)} at its lowest, "
            f"{during} ({self.at_s:.1f} s in), {where} its {human_bytes(self.reserve_bytes)} reserve"
        )

    def to_json(self) -> dict:
        return {
            "min_free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "reserve_bytes": self.reserve_bytes,
            "below_reserve": self.below_reserve,
            "probe": self.probe,
            "at_s": round(self.at_s, 3),
            "samples": self.samples,
        }


class VramSampler:
    """Samples the free VRAM of a lane's cards in a thread while a suite runs (a context manager). ``read()``
    returns ``{slot: (free_bytes, total_bytes)}`` (NVML, through ``reconciler.observe.gpu.MemoryReader``) or
    raises; ``running(name)`` says which probe runs from now on. Without ``read`` (telemetry none) it samples
    nothing. One sample is taken as it starts and one as it ends, so even a suite of milliseconds has two."""

    def __init__(
        self,
        read: Callable[[], Mapping[str, tuple[int, int]]] | None,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._read = read
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe: str | None = None
        self._t0 = 0.0
        self._low: dict[str, tuple[int, int, str | None, float]] = {}  # slot -> free, total, probe, at
        self._count: dict[str, int] = {}
        self.errors: list[str] = []

    def running(self, probe: str | None) -> None:
        with self._lock:
            self._probe = probe

    def sample(self) -> None:
        if self._read is None:
            return
        try:
            seen = self._read()
        except Exception as exc:  # noqa: BLE001 - a failed read is a missing sample, said in the verdict
            with self._lock:
                if len(self.errors) < 5:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            return
        at = self._clock() - self._t0
        with self._lock:
            for slot, (free, total) in seen.items():
                self._count[slot] = self._count.get(slot, 0) + 1
                low = self._low.get(slot)
                if low is None or free < low[0]:
                    self._low[slot] = (int(free), int(total), self._probe, at)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> VramSampler:
        self._t0 = self._clock()
        self.sample()
        if self._read is not None:
            self._thread = threading.Thread(target=self._loop, name="vram-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.running(None)
        self.sample()

    @property
    def sampling(self) -> bool:
        return self._read is not None

    def lows(self, host: HostConfig) -> dict[str, LoadLow]:
        with self._lock:
            return {
                slot: LoadLow(slot, free, total, host.reserve_bytes(slot), probe, at, self._count[slot])
                for slot, (free, total, probe, at) in self._low.items()
            }


@dataclass(frozen=True)
class LoadVerdict:
    """What the reserve says about a lane's cards at their lowest while a suite ran."""

    policy: str  # report | enforce
    suite: str
    slots: tuple[LoadLow, ...]
    below: tuple[str, ...]
    unknown: tuple[str, ...]  # slots no sample reached (NVML failed, or the slot's card is gone)
    checked: bool  # False with gpu_telemetry none, or without slots to sample (a lane that does not run)
    interval_s: float = SAMPLE_INTERVAL_S
    errors: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.checked and self.policy == "enforce" and bool(self.below or self.unknown)

    def message(self) -> str:
        if not self.checked:
            return "free VRAM under load not sampled (gpu_telemetry none, or no card of the lane to sample)"
        parts = [v.describe() for v in self.slots]
        parts += [
            f"{slot}: free VRAM not sampled" + (f" ({self.errors[0]})" if self.errors else "") for slot in self.unknown
        ]
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "policy": self.policy,
            "suite": self.suite,
            "checked": self.checked,
            "failed": self.failed,
            "interval_s": self.interval_s,
            "below": list(self.below),
            "unknown": list(self.unknown),
            "slots": {v.slot: v.to_json() for v in self.slots},
            "errors": list(self.errors),
        }


def load_reserve_verdict(
    desired: DesiredState, recipe: str | None, suite: str, sampler: VramSampler, slots: tuple[str, ...]
) -> LoadVerdict:
    """The reserve's verdict on ``slots`` at their lowest while ``suite`` ran. Under ``enforce`` a slot below its
    reserve, or one never sampled, fails it (an enter's preflight: a failed enter)."""
    policy = desired.reserve_policy(recipe)
    if not sampler.sampling or not slots:
        return LoadVerdict(policy, suite, (), (), (), checked=False, interval_s=sampler.interval_s)
    lows = sampler.lows(desired.host)
    have = tuple(lows[s] for s in slots if s in lows)
    return LoadVerdict(
        policy,
        suite,
        have,
        tuple(v.slot for v in have if v.below_reserve),
        tuple(s for s in slots if s not in lows),
        checked=True,
        interval_s=sampler.interval_s,
        errors=tuple(sampler.errors),
    )
