"""A stand-in for nvidia-ml-py's ``pynvml`` on a machine without NVIDIA GPUs: the GPU view a test needs (memory in
use that no process lists, then freed), read on every call from the JSON file ``$FAKE_NVML_FILE``, so a test changes
it while a real command or loop runs. Only the calls ``reconciler.observe.gpu`` makes. Put this directory first on
``PYTHONPATH`` of the process under test.

The file: ``{"devices": {"INDEX": {"total": BYTES, "used": BYTES}}}``; a device not listed has 80 GiB, none used.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

GIB = 1 << 30


class NVMLError(Exception):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


def _devices() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML_FILE"], encoding="utf-8") as f:
        return dict(json.load(f).get("devices") or {})


def nvmlInit() -> None:
    _devices()


def nvmlShutdown() -> None:
    return None


def nvmlSystemGetDriverVersion() -> str:
    return "000.00-fake"


def nvmlDeviceGetCount() -> int:
    return max((int(i) for i in _devices()), default=-1) + 1


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    return int(uuid.rsplit("-", 1)[1])


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{handle:012d}"


def nvmlDeviceGetName(handle: int) -> str:
    return "Fake GPU"


def nvmlDeviceGetMemoryInfo(handle: int) -> Any:
    d = _devices().get(str(handle)) or {}
    total, used = int(d.get("total", 80 * GIB)), int(d.get("used", 0))
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle: int) -> Any:
    return SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[Any]:
    return []


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetMinorNumber(handle: int) -> int:
    return int(handle)  # /dev/nvidiaN of card N, as on a host whose cards were probed in order


def nvmlDeviceGetMigMode(handle: int) -> tuple[int, int]:
    raise NVMLError_NotSupported("no MIG on this stand-in")


def nvmlDeviceGetMaxMigDeviceCount(handle: int) -> int:
    return 0


def nvmlDeviceGetMigDeviceHandleByIndex(handle: int, index: int) -> int:
    raise NVMLError_NotFound("no MIG device")
