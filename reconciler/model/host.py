"""configs/host.yaml as pydantic types: the machine, its GPU slots, its engine, its tmpfs, its secrets file, its
VRAM reserve, its page cache and its loop's listener (``api``: TLS, or plain text off loopback on purpose).

Read by ``reconciler.load.host_file``; the planner, the observers and the apply layer read the ``HostConfig`` it
gives.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from reconciler.base.units import GIB
from reconciler.model.door import DoorConfig
from reconciler.model.rules import (
    DOCKER_URL_PATTERN,
    GPU_UUID_PATTERN,
    NAME_PATTERN,
    NAME_RE,
    SHM_DIR_PATTERN,
    SHM_PATTERN_DEFAULT,
    SHM_PATTERN_PATTERN,
    check_docker_url,
    check_gpu_uuid,
    check_name,
    check_shm_dir,
    check_shm_pattern,
)
from reconciler.model.source import SourceConfig
from reconciler.model.strict import _ok, _pattern, _Strict

PID_MAX = 4194304  # Linux's PID_MAX_LIMIT


class GpuSlot(_Strict):
    """A named GPU slot and the physical GPU behind it (UUID preferred when given)."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": ["index"]}, {"required": ["uuid"]}]})

    index: int | None = Field(
        default=None,
        ge=0,
        le=1023,
        description="The card's index as NVML and nvidia-smi number it. Give index, uuid or both.",
    )
    uuid: str | None = Field(
        default=None,
        description="The card's UUID (nvidia-smi -L: GPU-... or MIG-...). It does not change when the cards are "
        "numbered anew, so it is preferred to index when given.",
        json_schema_extra=_pattern(GPU_UUID_PATTERN),
    )
    free_gib: float | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description="The free VRAM (GiB) this card must keep, over gpu_reserve.free_gib.",
    )
    idle_used_gib: float | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description="The VRAM (GiB) this card reports in use with nothing on it, over gpu_reserve.idle_used_gib.",
    )

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_gpu_uuid(v), v)

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
    """The container engine: Docker, or Podman's Docker-compatible service, directly or behind a socket proxy."""

    url: str = Field(
        default="unix:///var/run/docker.sock",
        description="The engine's API: unix:///ABSOLUTE/SOCKET, or tcp|ssh|http|https://HOST[:PORT].",
        json_schema_extra=_pattern(DOCKER_URL_PATTERN),
    )
    gpu_requests: bool = Field(
        default=True,
        description="Ask the engine for each container's GPUs (a DeviceRequest: needs the NVIDIA runtime). false: "
        "the GPUs are named by environment and labels only (a host without that runtime: the demo, CI).",
    )
    keep_failed: int = Field(
        default=3,
        ge=1,
        le=1000,
        description="Failed containers kept per assignment for their logs (stopped, renamed NAME-failed-STAMP); "
        "older ones are removed, and all of them once the assignment is gone from the manifest (`reconciler prune "
        "--confirm` removes them at once).",
    )
    # The Docker SDK's own default; a busy engine listing thousands of exited containers can take several.
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds one engine request may take before the engine counts as answering too slowly (not as "
        "down).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _ok(check_docker_url(v), v)


class ShmConfig(_Strict):
    """The tmpfs where the servers' offload files land, and the guard over it."""

    dir: str = Field(
        default="/dev/shm",
        description="The tmpfs the offload files land in (the host's /dev/shm for containers with ipc host): an "
        "absolute, normalised path, the mount point itself, never '/'. Checked at load and again before any delete.",
        json_schema_extra=_pattern(SHM_DIR_PATTERN),
    )
    pattern: str = Field(
        default=SHM_PATTERN_DEFAULT,
        description="The offload files' names: a literal prefix and suffix around exactly one '*' (no other "
        "wildcard, no '/'). Only regular files directly in dir that match are inspected or reclaimed.",
        json_schema_extra=_pattern(SHM_PATTERN_PATTERN),
    )
    confirm_interval_s: float = Field(
        default=2.0,
        ge=0,
        le=3600,
        description="Seconds between the two inspections that must agree on a file before it is deleted.",
    )
    ignore_uninspectable_pids: list[int] = Field(
        default_factory=list,
        description="Processes whose /proc entries even root cannot read, vouched for by the operator: any other "
        "such process makes a scan fail closed. shm status lists them all, excused or not.",
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": PID_MAX}},
    )
    reserve_gib: float = Field(
        default=1.0,
        ge=0,
        le=1 << 20,
        description="Room (GiB) kept free on the tmpfs beyond the offload capacities of all assigned recipes.",
    )

    @property
    def reserve_bytes(self) -> int:
        """``reserve_gib`` in bytes: what the loader, the planner and an enter keep free on the tmpfs."""
        return int(self.reserve_gib * GIB)

    @field_validator("dir")
    @classmethod
    def _dir(cls, v: str) -> str:
        return _ok(check_shm_dir(v), v.rstrip("/") or "/")

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        return _ok(check_shm_pattern(v), v)

    @field_validator("ignore_uninspectable_pids")
    @classmethod
    def _pids(cls, v: list[int]) -> list[int]:
        for pid in v:
            if not 1 <= pid <= PID_MAX:
                raise ValueError(f"shm.ignore_uninspectable_pids: {pid} is not a process id (1..{PID_MAX})")
        return v


class SecretsConfig(_Strict):
    """Where recipes' ``"${NAME}"`` env values come from, besides the reconciler's environment."""

    env_file: str | None = Field(
        default=None,
        description='An absolute path of NAME=value lines, readable by its owner only, where "${NAME}" env values '
        "are looked up first (then the reconciler's environment).",
        json_schema_extra=_pattern(r"^/"),
    )

    @field_validator("env_file")
    @classmethod
    def _env_file(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"secrets.env_file must be an absolute path (outside the recipes), got {v!r}")
        return v


class GpuReserveConfig(_Strict):
    """The free VRAM each card must still report once a lane is loaded (the field report's 3 GiB reserve).

    ``report``: a lane below it stays, and status, metrics and an alert say so; ``enforce``: an enter whose cards
    end below it once healthy and settled is a failed enter. ``idle_used_gib``: the VRAM an idle card reports in
    use; more than that with no process listed means something NVML does not show holds the card (WSL2).
    """

    free_gib: float = Field(
        default=3.0, ge=0, le=1 << 20, description="The free VRAM (GiB) each card must keep once its lane is loaded."
    )
    policy: Literal["report", "enforce"] = Field(
        default="report",
        description="report: a lane below the reserve stays, and status, metrics and an alert say so; enforce: an "
        "enter whose cards end below it once healthy and settled is a failed enter.",
    )
    idle_used_gib: float = Field(
        default=1.0,
        ge=0,
        le=1 << 20,
        description="The VRAM (GiB) an idle card reports in use; more with no process listed means something NVML "
        "does not show holds the card.",
    )


class PageCacheConfig(_Strict):
    """``drop_after_leave``: after a leave, sync and drop clean page cache (WSL2: the VM's cache holds memory
    Windows cannot take back). Off by default."""

    drop_after_leave: bool = Field(
        default=False, description="After a leave, sync and drop clean page cache (WSL2 hosts)."
    )


class ApiTlsConfig(_Strict):
    """The certificate and key the loop's listener serves HTTPS with."""

    cert: str = Field(
        description="An absolute path of the listener's certificate (PEM; the chain after it), naming the addresses "
        "and names clients reach it by (subjectAltName).",
        json_schema_extra=_pattern(r"^/"),
    )
    key: str = Field(
        description="An absolute path of the certificate's private key (PEM, unencrypted): the running user's, "
        "readable by no one else.",
        json_schema_extra=_pattern(r"^/"),
    )

    @field_validator("cert", "key")
    @classmethod
    def _absolute(cls, v: str, info: ValidationInfo) -> str:
        if not v.startswith("/"):
            raise ValueError(f"api.tls.{info.field_name} must be an absolute path, got {v!r}")
        return v


class ApiConfig(_Strict):
    """The listener of ``reconciler run`` (``--metrics-addr``): HTTPS with ``tls``; off loopback
    (``--api-allow-remote``) it needs ``tls``, or ``insecure: true`` to serve plain HTTP there on purpose."""

    tls: ApiTlsConfig | None = Field(
        default=None,
        description="Serve HTTPS with this certificate and key (the page's session cookie is then Secure, and "
        "/metrics needs a token: the read token suffices).",
    )
    insecure: bool = Field(
        default=False,
        description="With --api-allow-remote and no tls: serve plain HTTP off loopback anyway (tokens and answers "
        "cross the network in clear: only behind a TLS proxy or on a link nobody else can read).",
    )

    @model_validator(mode="after")
    def _one_of(self) -> ApiConfig:
        if self.tls is not None and self.insecure:
            raise ValueError("api: tls and insecure: true say opposite things; drop insecure (tls is served)")
        return self


class HostConfig(_Strict):
    """configs/host.yaml: the machine, its GPU slots, its engine and its tmpfs."""

    name: str = Field(
        description="The host's name: manifests select their host by it, and with this install's id it marks the "
        "containers this tool owns.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    gpus: dict[str, GpuSlot] = Field(
        description="GPU slot name -> the card behind it. A slot name is lowercase (it becomes part of container "
        "names); two slots may not name one card.",
        json_schema_extra={"minProperties": 1, "propertyNames": {"pattern": NAME_PATTERN}},
    )
    gpu_telemetry: Literal["nvml", "none"] = Field(
        default="nvml",
        description="nvml: GPU processes and memory through NVML; none: a host without NVIDIA GPUs (the demo, CI), "
        "where the engine alone says what holds a slot.",
    )
    docker: DockerConfig = Field(default_factory=DockerConfig, description="The container engine.")
    shm: ShmConfig = Field(default_factory=ShmConfig, description="The tmpfs of the offload files and its guard.")
    secrets: SecretsConfig = Field(
        default_factory=SecretsConfig, description='Where recipes\' "${NAME}" env values come from.'
    )
    gpu_reserve: GpuReserveConfig = Field(
        default_factory=GpuReserveConfig, description="The free VRAM each card must keep, and what a shortfall does."
    )
    page_cache: PageCacheConfig = Field(default_factory=PageCacheConfig, description="Page cache after a leave.")
    source: SourceConfig | None = Field(
        default=None,
        description="Where the manifests and recipes come from when not from this root: a branch of a git "
        "repository (the host file stays here).",
    )
    api: ApiConfig = Field(
        default_factory=ApiConfig,
        description="The listener of `reconciler run`: HTTPS (tls), or plain HTTP off loopback on purpose (insecure).",
    )
    door: DoorConfig = Field(
        default_factory=DoorConfig,
        description="The front door (`reconciler door`): one OpenAI endpoint routing each request to the lane "
        "serving its model, holding it through a switch.",
    )

    def reserve_bytes(self, slot: str) -> int:
        """The free VRAM ``slot``'s card must keep: its ``free_gib``, else ``gpu_reserve.free_gib``."""
        gpu = self.gpus.get(slot)
        gib = gpu.free_gib if gpu is not None and gpu.free_gib is not None else self.gpu_reserve.free_gib
        return int(gib * GIB)

    def idle_used_bytes(self, slot: str) -> int:
        """The VRAM ``slot``'s card reports in use when nothing runs on it."""
        gpu = self.gpus.get(slot)
        gib = gpu.idle_used_gib if gpu is not None and gpu.idle_used_gib is not None else self.gpu_reserve.idle_used_gib
        return int(gib * GIB)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ok(check_name(v, "the host name"), v)

    @field_validator("gpus")
    @classmethod
    def _slots(cls, v: dict[str, GpuSlot]) -> dict[str, GpuSlot]:
        if not v:
            raise ValueError("a host needs at least one GPU slot under 'gpus'")
        seen: dict[str, tuple[str, str]] = {}  # id with its letter case folded -> (slot, the id as written there)
        for slot, gpu in v.items():
            if check_name(slot, "GPU slot name"):
                raise ValueError(f"GPU slot name {slot!r} must match {NAME_RE} (lowercase, at most 128 characters)")
            for dev in gpu.device_ids():
                # NVML writes a UUID as GPU- and lowercase hex: the same UUID in other letters is the same card.
                key = dev.lower()
                if key in seen:
                    other, written = seen[key]
                    case = f" ({written!r} and {dev!r} differ only in letter case)" if written != dev else ""
                    raise ValueError(
                        f"GPU slots {other!r} and {slot!r} both point at GPU {written}{case}: two slots on one card "
                        "would let two recipes share it; give each slot its own card (nvidia-smi -L lists each "
                        "card's index and uuid)"
                    )
                seen[key] = (slot, dev)
        return v

    @field_validator("gpu_telemetry")
    @classmethod
    def _slots_resolvable(cls, v: str, info: ValidationInfo) -> str:
        # Only NVML tells which card an index and a UUID name: without it a slot given by index and one given by
        # UUID may be one card, and nothing would see two recipes enter it.
        gpus: dict[str, GpuSlot] = info.data.get("gpus") or {}
        by_index = [s for s, g in gpus.items() if g.uuid is None]
        by_uuid = [s for s, g in gpus.items() if g.index is None]
        if v != "none" or not by_index or not by_uuid:
            return v
        first, second = sorted((by_uuid[0], by_index[0]), key=list(gpus).index)

        def named(slot: str) -> str:
            g = gpus[slot]
            return f"{slot!r} (index {g.index})" if g.uuid is None else f"{slot!r} (uuid {g.uuid})"

        raise ValueError(
            f"gpu_telemetry is 'none': nothing then tells which card an index and a uuid name, so GPU slots "
            f"{named(first)} and {named(second)} may be one card, and two recipes would share it; give every slot "
            "under gpus by index, or every one by uuid, or set gpu_telemetry: nvml"
        )
