"""GPU telemetry behind one interface: ``observe_gpus(host) -> GpuView``.

``none`` (a host without NVIDIA GPUs: the demo, CI): every configured slot is reported with no processes,
and GPU occupancy comes from Docker alone. ``nvml`` reads each slot's GPU through NVML.
Called by ``reconciler.observe.observe``.
"""

from __future__ import annotations

from reconciler.model import HostConfig
from reconciler.observed import GpuSlotView, GpuView, Source


def observe_gpus(host: HostConfig) -> GpuView:
    if host.gpu_telemetry == "none":
        return GpuView(
            telemetry="none",
            source=Source("gpu", True, "telemetry none: GPU occupancy from Docker alone"),
            slots={slot: GpuSlotView(slot=slot, index=g.index, uuid=g.uuid) for slot, g in host.gpus.items()},
        )
    return GpuView(
        telemetry="nvml",
        source=Source("gpu", False, "NVML telemetry is not implemented yet"),
        slots={slot: GpuSlotView(slot=slot, index=g.index, uuid=g.uuid) for slot, g in host.gpus.items()},
    )
