"""The declarative model: the host file, recipes and manifests as pydantic types, and the desired state.

Pure: no I/O beyond what the caller hands in, and no Docker, NVML or metrics imports (checked by a test).
``reconciler.loader`` reads the files into these types; the planner consumes ``DesiredState``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reconciler.units import GIB

NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
_VOLUME_RE = re.compile(r"^(?P<host>/[^:]*|[A-Za-z0-9][A-Za-z0-9_.-]*):(?P<ctr>/[^:]*)(?::(?P<mode>ro|rw))?$")


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- configs/host.yaml


class GpuSlot(_Strict):
    """A named GPU slot and the physical GPU behind it (UUID preferred when given)."""

    index: int | None = Field(default=None, ge=0)
    uuid: str | None = None

    @model_validator(mode="after")
    def _one_id(self) -> GpuSlot:
        if self.index is None and self.uuid is None:
            raise ValueError("a GPU slot needs 'index' or 'uuid' (for example {index: 0})")
        return self

    def device_ids(self) -> tuple[str, ...]:
        """Every id by which a container may name this GPU (index and/or UUID)."""
        ids: list[str] = []
        if self.uuid:
            ids.append(self.uuid)
        if self.index is not None:
            ids.append(str(self.index))
        return tuple(ids)

    def preferred_id(self) -> str:
        return self.uuid if self.uuid else str(self.index)


class DockerConfig(_Strict):
    url: str = "unix:///var/run/docker.sock"
    gpu_requests: bool = True
    # Failed containers kept (stopped, renamed NAME-failed-STAMP) for their logs, per assignment; older ones go.
    keep_failed: int = Field(default=3, ge=1)


class ShmConfig(_Strict):
    dir: str = "/dev/shm"
    pattern: str = "vllm_offload_*.mmap"
    confirm_interval_s: float = Field(default=2.0, ge=0)
    ignore_uninspectable_pids: list[int] = Field(default_factory=list)
    # Room kept free on the tmpfs beyond the sum of all offload capacities (the "room to spare").
    reserve_gib: float = Field(default=1.0, ge=0)

    @field_validator("dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"shm.dir must be an absolute path, got {v!r}")
        return v.rstrip("/") or "/"

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        if "/" in v or not v or "*" not in v:
            raise ValueError(f"shm.pattern must be a file name glob with '*' and no '/', got {v!r}")
        return v


class HostConfig(_Strict):
    name: str = Field(pattern=NAME_RE)
    gpus: dict[str, GpuSlot]
    gpu_telemetry: Literal["nvml", "none"] = "nvml"
    docker: DockerConfig = Field(default_factory=DockerConfig)
    shm: ShmConfig = Field(default_factory=ShmConfig)

    @field_validator("gpus")
    @classmethod
    def _slots(cls, v: dict[str, GpuSlot]) -> dict[str, GpuSlot]:
        if not v:
            raise ValueError("a host needs at least one GPU slot under 'gpus'")
        seen: dict[str, str] = {}
        for slot, gpu in v.items():
            if not re.match(NAME_RE, slot):
                raise ValueError(f"GPU slot name {slot!r} must match {NAME_RE}")
            for dev in gpu.device_ids():
                if dev in seen:
                    raise ValueError(f"GPU slots {seen[dev]!r} and {slot!r} both point at GPU {dev}")
                seen[dev] = slot
        return v


# ---------------------------------------------------------------- configs/recipes/NAME.toml


class ModelRef(_Strict):
    id: str = Field(min_length=1)
    revision: str | None = None


class ContainerSpec(_Strict):
    image: str = Field(min_length=1)
    command: list[str] = Field(default_factory=list)
    entrypoint: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    volumes: list[str] = Field(default_factory=list)
    ipc: str | None = "host"
    network: str | None = "host"
    init: bool = False
    shm_size: str | None = None
    user: str | None = None

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: list[str]) -> list[str]:
        for vol in v:
            if not _VOLUME_RE.match(vol):
                raise ValueError(f"volume {vol!r} must be 'host:container' or 'host:container:ro' with absolute paths")
        return v


class OffloadSpec(_Strict):
    enabled: bool = False
    capacity_gib: float = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _capacity(self) -> OffloadSpec:
        if self.enabled and self.capacity_gib <= 0:
            raise ValueError("offload.enabled needs offload.capacity_gib > 0 (the size of the offload mmap)")
        return self

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gib * GIB) if self.enabled else 0


class HealthSpec(_Strict):
    url: str | None = None
    settle_s: float = Field(default=5, ge=0)
    start_timeout_s: float = Field(default=600, gt=0)


class StopSpec(_Strict):
    timeout_s: float = Field(default=180, gt=0)


class Recipe(_Strict):
    description: str = ""
    tensor_parallel_size: int = Field(ge=1)
    model: ModelRef
    container: ContainerSpec
    offload: OffloadSpec = Field(default_factory=OffloadSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    stop: StopSpec = Field(default_factory=StopSpec)

    def content_hash(self) -> str:
        """Stable hash of everything that defines the container: a changed recipe means recreate.

        The free-text description is left out: rewording it must not restart a model that took minutes to load.
        """
        canon = json.dumps(self.model_dump(mode="json", exclude={"description"}), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- manifests/*.yaml


class AssignmentSpec(_Strict):
    recipe: str = Field(min_length=1)
    gpus: list[str] = Field(min_length=1)


class Manifest(_Strict):
    host: str
    assignments: list[AssignmentSpec] = Field(default_factory=list)


# ---------------------------------------------------------------- the desired state the planner consumes


@dataclass(frozen=True)
class DesiredAssignment:
    """One container that should run: a recipe on an ordered tuple of GPU slots."""

    recipe: str
    slots: tuple[str, ...]
    recipe_hash: str
    offload_bytes: int

    @property
    def key(self) -> str:
        return assignment_key(self.recipe, self.slots)


def assignment_key(recipe: str, slots: tuple[str, ...] | list[str]) -> str:
    """The identity of an assignment; also the stem of its container name."""
    return f"{recipe}@{'+'.join(slots)}"


def container_name(recipe: str, slots: tuple[str, ...] | list[str]) -> str:
    return f"reconciler-{recipe}-{'-'.join(slots)}"


@dataclass(frozen=True)
class DesiredState:
    host: HostConfig
    recipes: dict[str, Recipe]
    assignments: tuple[DesiredAssignment, ...]
    manifest_path: str | None = None

    def slot_owner(self) -> dict[str, DesiredAssignment]:
        return {slot: a for a in self.assignments for slot in a.slots}
