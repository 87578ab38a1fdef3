"""configs/recipes/NAME.toml as pydantic types: the model served, its container, offload, health, stop, drain and
reserve settings, and the recipe's content hash.

Read by ``reconciler.load.recipes``; the planner, the apply layer and the service read the ``Recipe`` it gives.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from reconciler.base.units import GIB
from reconciler.model.probe_spec import ProbeSpec
from reconciler.model.recipe_hash import content_hash as _content_hash
from reconciler.model.rules import (
    _NO_CONTROL,
    _NO_NUL,
    ENV_NAME_PATTERN,
    ENV_REF,
    ENV_VALUE_PATTERN,
    IMAGE_PATTERN,
    IPC_PATTERN,
    LOOPBACK_URL_PATTERN,
    NETWORK_PATTERN,
    SERVED_NAME_PATTERN,
    SHM_SIZE_PATTERN,
    USER_PATTERN,
    VOLUME_PATTERN,
    check_env_name,
    check_env_ref,
    check_health_url,
    check_image_ref,
    check_ipc_mode,
    check_network_mode,
    check_probe_url,
    check_shm_size,
    check_text,
    check_user,
    check_volume,
)
from reconciler.model.strict import DAY_S, _ok, _pattern, _Strict


class ModelRef(_Strict):
    """The model a recipe serves: shown in plan and status, and put on its container as labels."""

    id: str = Field(
        min_length=1,
        description="The model's name, like deepseek-ai/DeepSeek-V4-Flash-0731.",
        json_schema_extra=_pattern(_NO_CONTROL),
    )
    revision: str | None = Field(
        default=None,
        description="The model's pinned revision (a commit hash).",
        json_schema_extra=_pattern(_NO_CONTROL),
    )
    served_names: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The names the server answers to when its command gives no --served-model-name (a server that "
        "takes its names otherwise): the front door routes a request's model by them. Default: id. Not part of the "
        "recipe's hash (it says how the lane is asked, not what runs in it).",
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": SERVED_NAME_PATTERN}},
    )

    @field_validator("served_names")
    @classmethod
    def _names(cls, v: list[str] | None) -> list[str] | None:
        for name in v or ():
            if not re.fullmatch(SERVED_NAME_PATTERN, name):
                raise ValueError(f"served name {name!r} is empty, too long, or holds a space or control character")
        if v is not None and len(set(v)) != len(v):
            raise ValueError("served_names names a model twice: name each once")
        return v

    @field_validator("id", "revision")
    @classmethod
    def _label(cls, v: str | None) -> str | None:
        # Both go on the container as labels.
        if v is not None and any(ord(c) < 32 for c in v):
            raise ValueError(f"{v!r} holds control characters (it becomes a container label); remove them")
        return v


class ContainerSpec(_Strict):
    """The container a recipe runs. Its whole rendered form is hashed onto the container: a change recreates it."""

    # Something to run: the first word of entrypoint (when given), else of command, and not blank.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["entrypoint"], "properties": {"entrypoint": {"type": "array", "minItems": 1}}},
            "then": {"properties": {"entrypoint": {"prefixItems": [{"pattern": r"\S"}]}}},
            "else": {
                "required": ["command"],
                "properties": {"command": {"minItems": 1, "prefixItems": [{"pattern": r"\S"}]}},
            },
        }
    )

    image: str = Field(
        min_length=1,
        description="[REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], the name in lowercase; pinned by digest on real "
        "hosts.",
        json_schema_extra=_pattern(IMAGE_PATTERN),
    )
    command: list[str] = Field(
        default_factory=list,
        description="The program and its arguments (after entrypoint, when given).",
        json_schema_extra={"items": {"type": "string", "pattern": _NO_NUL}},
    )
    entrypoint: list[str] | None = Field(
        default=None,
        description="Replaces the image's entrypoint.",
        json_schema_extra={"items": {"type": "string", "pattern": _NO_NUL}},
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description='Environment variables. A value written "${NAME}" is a secret, taken at create time from '
        "secrets.env_file or the reconciler's environment and never printed.",
        json_schema_extra={
            "propertyNames": {"pattern": ENV_NAME_PATTERN},
            "additionalProperties": {"type": "string", "pattern": ENV_VALUE_PATTERN},
        },
    )
    volumes: list[str] = Field(
        default_factory=list,
        description="HOST:CONTAINER[:ro|:rw] with absolute, normalised paths (the host side may be a named volume); "
        "two may not mount at one place.",
        json_schema_extra={"items": {"type": "string", "pattern": VOLUME_PATTERN}},
    )
    ipc: str | None = Field(
        default="host",
        description="host (offload files then land in the host's /dev/shm), private, shareable, none or "
        "container:NAME; null: the engine's default.",
        json_schema_extra=_pattern(IPC_PATTERN),
    )
    network: str | None = Field(
        default="host",
        description="host, bridge, none, container:NAME or a network's name; null: the engine's default.",
        json_schema_extra=_pattern(NETWORK_PATTERN),
    )
    init: bool = Field(default=False, description="Run an init as the container's first process.")
    shm_size: str | None = Field(
        default=None,
        description="Size of the container's own /dev/shm (not with ipc host), like 64m or 2g.",
        json_schema_extra=_pattern(SHM_SIZE_PATTERN),
    )
    user: str | None = Field(
        default=None,
        description="NAME, UID, UID:GID or NAME:GROUP to run as.",
        json_schema_extra=_pattern(USER_PATTERN),
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        return _ok(check_image_ref(v), v)

    @field_validator("command", "entrypoint")
    @classmethod
    def _argv(cls, v: list[str] | None) -> list[str] | None:
        for i, arg in enumerate(v or ()):
            _ok(check_text(arg, f"argument {i}"), arg)
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            _ok(check_env_name(name) or check_text(value, f"container.env.{name}") or check_env_ref(name, value), value)
        return v

    def env_refs(self) -> dict[str, str]:
        """env key -> the variable it takes its value from (``"${VAR}"``: a secret kept out of the recipe)."""
        return {k: m.group(1) for k, v in self.env.items() if (m := ENV_REF.fullmatch(v))}

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: list[str]) -> list[str]:
        targets: dict[str, str] = {}
        for vol in v:
            _ok(check_volume(vol), vol)
            ctr = vol.split(":")[1]
            if ctr in targets:
                raise ValueError(f"volumes {targets[ctr]!r} and {vol!r} both mount at {ctr} in the container; keep one")
            targets[ctr] = vol
        return v

    @field_validator("ipc")
    @classmethod
    def _ipc(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_ipc_mode(v), v)

    @field_validator("network")
    @classmethod
    def _network(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_network_mode(v), v)

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_shm_size(v), v)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_user(v), v)

    @model_validator(mode="after")
    def _something_to_run(self) -> ContainerSpec:
        argv = [*(self.entrypoint or ()), *self.command]
        if not argv:
            raise ValueError(
                "container.command is empty and there is no container.entrypoint: say what to run, "
                'like command = ["vllm", "serve", "MODEL"]'
            )
        if not argv[0].strip():
            raise ValueError("the program to run (the first word of entrypoint, or of command) is empty; name it")
        return self


class OffloadSpec(_Strict):
    """vLLM's native KV-cache offload into one mmap'ed file in shm.dir."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["enabled"], "properties": {"enabled": {"const": True}}},
            "then": {"required": ["capacity_gib"], "properties": {"capacity_gib": {"exclusiveMinimum": 0}}},
        }
    )

    enabled: bool = Field(default=False, description="Whether the server keeps an offload file in shm.dir.")
    capacity_gib: float = Field(
        default=0,
        ge=0,
        le=1 << 20,
        description="The offload file's size (GiB): room for it on the tmpfs is made before the enter.",
    )

    @model_validator(mode="after")
    def _capacity(self) -> OffloadSpec:
        if self.enabled and self.capacity_gib <= 0:
            raise ValueError("offload.enabled needs offload.capacity_gib > 0 (the size of the offload mmap)")
        return self

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gib * GIB) if self.enabled else 0


class HealthSpec(_Strict):
    """When a started container counts as serving."""

    url: str | None = Field(
        default=None,
        description="A loopback http(s) URL that answers 200 once the server is ready (no credentials). Without it: "
        "running and not restarted for settle_s.",
        json_schema_extra=_pattern(LOOPBACK_URL_PATTERN),
    )
    settle_s: float = Field(
        default=5,
        ge=0,
        le=DAY_S,
        description="Seconds the container must keep running (after its health URL answered, if it has one) before "
        "its enter is done.",
    )
    start_timeout_s: float = Field(
        default=600, gt=0, le=DAY_S, description="Seconds from start to healthy before the enter counts as failed."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_health_url(v), v)


class StopSpec(_Strict):
    """How a leave stops the container."""

    timeout_s: float = Field(
        default=180,
        gt=0,
        le=DAY_S,
        description="Seconds the server has to exit after the stop signal before it is killed.",
    )


class DrainSpec(_Strict):
    """Before a healthy lane leaves: wait until it runs and queues no request (vLLM's own gauges on its
    ``/metrics``), at most ``timeout_s``, then stop it anyway."""

    enabled: bool = Field(default=True, description="Wait for the requests in flight before a healthy lane leaves.")
    timeout_s: float = Field(
        default=60, ge=0, le=DAY_S, description="The longest wait (seconds); then the lane is stopped anyway."
    )
    metrics_url: str | None = Field(
        default=None,
        description="Where vLLM's gauges are read; default: the origin of health.url + /metrics.",
        json_schema_extra=_pattern(LOOPBACK_URL_PATTERN),
    )

    @field_validator("metrics_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_probe_url(v, "drain.metrics_url"), v)


# vLLM's sleep mode and its native KV offload together: the engine dies after its first level-1 sleep and wake
# (vLLM issue #45268, EngineDeadError). Refused unless the recipe says the runtime was requalified.
SLEEP_WITH_OFFLOAD_ISSUE = "vLLM issue #45268: the engine dies (EngineDeadError) after its first sleep and wake"
SLEEP_MODE_FLAG = "--enable-sleep-mode"
SLEEP_DEV_ENV = "VLLM_SERVER_DEV_MODE"


class SleepSpec(_Strict):
    """vLLM's sleep mode for this lane: kept asleep (its process, CUDA context and compiled graphs kept, its GPU
    memory given back) while its topology is on standby, woken in seconds when it runs again."""

    level: Literal[1, 2] = Field(
        default=1,
        description="1: the weights go to CPU memory and the KV cache is discarded (a fast wake, host RAM the size "
        "of the weights); 2: both discarded, the weights reloaded from the checkpoint on wake (slower, no host RAM).",
    )
    timeout_s: float = Field(
        default=60,
        gt=0,
        le=DAY_S,
        description="Seconds a sleep or a wake may take (each call, and the confirmation that follows it); a lane "
        "that will not sleep in time is left (stopped) instead, one that will not wake is a failed enter.",
    )
    allow_with_offload: bool = Field(
        default=False,
        description=f"Allow [sleep] with [offload] enabled = true ({SLEEP_WITH_OFFLOAD_ISSUE}): only once this "
        "image was requalified; say so in a comment beside it.",
    )


class RecipeReserve(_Strict):
    """A recipe's own reserve policy, over the host's ``gpu_reserve.policy``."""

    policy: Literal["report", "enforce"] | None = Field(
        default=None, description="report or enforce for this recipe's lane; default: the host's gpu_reserve.policy."
    )


class Recipe(_Strict):
    """configs/recipes/NAME.toml: one immutable serving recipe; its name is the file's stem."""

    description: str = Field(default="", description="Free text for plan and status; not part of the recipe's hash.")
    tensor_parallel_size: int = Field(
        ge=1, le=1024, description="How many GPU slots the recipe needs: an assignment gives it exactly that many."
    )
    model: ModelRef = Field(description="The model served.")
    container: ContainerSpec = Field(description="The container that serves it.")
    offload: OffloadSpec = Field(default_factory=OffloadSpec, description="Native KV-cache offload.")
    health: HealthSpec = Field(default_factory=HealthSpec, description="When the container counts as serving.")
    stop: StopSpec = Field(default_factory=StopSpec, description="How it is stopped.")
    probes: list[ProbeSpec] = Field(
        default_factory=list, max_length=64, description="Functional checks of the lane ([[probes]])."
    )
    drain: DrainSpec = Field(default_factory=DrainSpec, description="Waiting for requests in flight before a leave.")
    sleep: SleepSpec | None = Field(
        default=None,
        description="vLLM's sleep mode ([sleep]): the lane is kept asleep while its topology is on standby. Needs "
        f'{SLEEP_MODE_FLAG} in the command, {SLEEP_DEV_ENV} = "1" in container.env and a health.url.',
    )

    @field_validator("probes")
    @classmethod
    def _probe_names(cls, v: list[ProbeSpec]) -> list[ProbeSpec]:
        seen: set[str] = set()
        for p in v:
            if p.name in seen:
                raise ValueError(f"two probes are named {p.name!r}; give each its own name")
            seen.add(p.name)
        return v

    @model_validator(mode="after")
    def _urls_for_probes(self) -> Recipe:
        if self.health.url is None and any(p.base_url is None for p in self.probes):
            raise ValueError(
                "probes need a server to ask: set health.url (probes go to its origin) or each probe's base_url"
            )
        return self

    @model_validator(mode="after")
    def _sleep_needs(self) -> Recipe:
        """docs/design.md, sleeping lanes rules 4 and 7: what [sleep] needs of the rest of the recipe."""
        if self.sleep is None:
            return self
        argv = [*(self.container.entrypoint or []), *self.container.command]
        if not any(a == SLEEP_MODE_FLAG or a.startswith(SLEEP_MODE_FLAG + "=") for a in argv):
            raise ValueError(
                f"[sleep] needs the server started with {SLEEP_MODE_FLAG}: add it to container.command "
                "(without it vLLM answers every sleep with an error)"
            )
        if self.container.env.get(SLEEP_DEV_ENV) != "1":
            raise ValueError(
                f'[sleep] needs {SLEEP_DEV_ENV} = "1" in [container.env]: vLLM serves /sleep, /wake_up and '
                "/is_sleeping only then (they are reached on loopback only, never through the API)"
            )
        if self.health.url is None:
            raise ValueError(
                "[sleep] needs health.url: its origin is where /sleep, /wake_up and /is_sleeping are asked"
            )
        if self.offload.enabled and not self.sleep.allow_with_offload:
            raise ValueError(
                f"[sleep] with [offload] enabled = true is refused ({SLEEP_WITH_OFFLOAD_ISSUE}): remove one, or, "
                "once this image was requalified, set sleep.allow_with_offload = true with a comment saying so"
            )
        return self

    def sleep_origin(self) -> str | None:
        """Where the lane's sleep endpoints are (the health URL's origin), with [sleep] only."""
        return self.api_origin() if self.sleep is not None else None

    def suite(self, name: str) -> list[ProbeSpec]:
        """The probes of one suite (``preflight``, ``regression``), in the recipe's order; ``all``: every probe."""
        return [p for p in self.probes if name in ("all", p.suite)]

    def api_origin(self) -> str | None:
        """scheme://host:port of the health URL: where the OpenAI API and /metrics are by default."""
        if not self.health.url:
            return None
        u = urlsplit(self.health.url)
        return f"{u.scheme}://{u.netloc}"

    def drain_metrics_url(self) -> str | None:
        origin = self.api_origin()
        return self.drain.metrics_url or (f"{origin}/metrics" if origin else None)

    gpu_reserve: RecipeReserve = Field(
        default_factory=RecipeReserve, description="This lane's own reserve policy, over the host's."
    )

    def content_hash(self) -> str:
        """Stable hash of everything that defines the container: a changed recipe means recreate.

        The free-text description is left out: rewording it must not restart a model that took minutes to load;
        so is the reserve policy, a judgement of the lane, not part of it. So are the probes, the drain and the sleep
        settings: they say how the reconciler checks, stops and sleeps the lane, not what runs in it (the command's
        --enable-sleep-mode is part of it). A key added after hash version 1 counts only where it is not at its
        default, so a release that adds one restarts no lane (``reconciler.model.recipe_hash``).
        """
        return _content_hash(self)


def offload_lands_in(container: ContainerSpec, shm_dir: str) -> bool:
    """Whether a recipe's offload files land in ``shm_dir`` on the host: the container shares the host's /dev/shm
    (ipc host) and shm.dir is /dev/shm, or shm.dir is bind-mounted into it."""
    if container.ipc == "host" and shm_dir == "/dev/shm":
        return True
    return any(v.split(":")[0] == shm_dir for v in container.volumes)
