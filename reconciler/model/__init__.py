"""The declarative model: the host file, recipes and manifests as pydantic types, and the desired state.

Pure: no I/O beyond what the caller hands in, and no Docker, NVML or metrics imports (checked by a test).
``reconciler.load.loader`` reads the files into these types; the planner consumes ``DesiredState``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from reconciler.base.units import GIB

_T = TypeVar("_T")

NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}", re.ASCII)


def check_name(name: str, what: str) -> str | None:
    """A host, GPU slot or recipe name: it becomes part of container names and labels."""
    if _NAME.fullmatch(name):
        return None
    return f"{what} {name!r} must match [a-z0-9][a-z0-9._-]* (lowercase, at most 128 characters)"


# ---------------------------------------------------------------- rules, as small pure functions
#
# Each ``check_*`` returns None when the value is acceptable, else one sentence saying what is wrong and how to fix
# it. The model's validators call them; the shm guard calls the shm ones again before it deletes anything.

SHM_PATTERN_DEFAULT = "vllm_offload_*.mmap"
_GLOB_CHARS = set("?[]{}\\")
_PATTERN_PART = re.compile(r"[A-Za-z0-9_.+-]+", re.ASCII)


def check_shm_pattern(pattern: str) -> str | None:
    """``shm.pattern``: a literal, non-empty file-name prefix and suffix around exactly one ``*``."""
    fix = f"write a literal file-name prefix and suffix around one '*', like {SHM_PATTERN_DEFAULT!r}"
    if not isinstance(pattern, str) or not pattern:
        return f"shm.pattern is empty; {fix}"
    if "\x00" in pattern or "/" in pattern:
        return f"shm.pattern {pattern!r} must be a file name, not a path (no '/'); {fix}"
    bad = sorted(set(pattern) & _GLOB_CHARS)
    if bad:
        return f"shm.pattern {pattern!r} has the wildcard or escape character(s) {' '.join(bad)}; only one '*' is allowed; {fix}"
    if pattern.count("*") != 1:
        return f"shm.pattern {pattern!r} must hold exactly one '*' (it has {pattern.count('*')}); {fix}"
    prefix, suffix = pattern.split("*")
    if not prefix or not suffix:
        return f"shm.pattern {pattern!r} needs a non-empty prefix and suffix around its '*'; {fix}"
    if prefix.startswith("."):
        return f"shm.pattern {pattern!r} would match hidden files (its prefix starts with '.'); {fix}"
    if set(prefix) == {"."} or set(suffix) == {"."}:
        return f"shm.pattern {pattern!r} has a prefix or suffix of dots only; {fix}"
    if not _PATTERN_PART.fullmatch(prefix) or not _PATTERN_PART.fullmatch(suffix):
        return f"shm.pattern {pattern!r} may hold only letters, digits and '_.+-' around its '*'; {fix}"
    return None


def check_shm_dir(directory: str) -> str | None:
    """``shm.dir``: absolute, normalised (no '.', '..', '//'), and not '/'. Whether it is a tmpfs is the loader's."""
    if not isinstance(directory, str) or not directory:
        return "shm.dir is empty; give the tmpfs mount point, like /dev/shm"
    if "\x00" in directory or any(ord(c) < 32 for c in directory):
        return f"shm.dir {directory!r} holds control characters; give the tmpfs mount point, like /dev/shm"
    if not directory.startswith("/"):
        return f"shm.dir must be an absolute path, got {directory!r}; give the tmpfs mount point, like /dev/shm"
    d = directory.rstrip("/") or "/"
    norm = "/" + posixpath.normpath(d).lstrip("/")
    if norm == "/":
        return (
            f"shm.dir {directory!r} is the root directory: offload files are scanned and deleted there; "
            "give the tmpfs mount point, like /dev/shm"
        )
    if norm != d:
        return f"shm.dir {directory!r} is not normalised ('.', '..' or '//' in it); write it as {norm!r}"
    return None


_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]{{1,5}})?"
_IMAGE_RE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_NAME_COMPONENT}(?:/{_NAME_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?",
    re.ASCII,
)


def check_image_ref(image: str) -> str | None:
    """``container.image``: Docker's reference syntax, [REGISTRY/]NAME[:TAG][@ALGO:DIGEST]."""
    fix = "write [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], the name in lowercase, like anvil-vllm@sha256:<64 hex digits>"
    if not image:
        return f"container.image is empty; {fix}"
    m = _IMAGE_RE.fullmatch(image)
    if m is None or len(m.group("path")) + len(m.group("domain") or "") > 255:
        return f"container.image {image!r} is not a valid image reference; {fix}"
    digest = m.group("digest")
    if digest and digest.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return f"container.image {image!r}: a sha256 digest is 64 lowercase hex digits; {fix}"
    return None


_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", re.ASCII)
_NETWORK_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}", re.ASCII)
IPC_MODES = ("host", "private", "shareable", "none")
NETWORK_MODES = ("host", "bridge", "none")


def _container_ref(value: str) -> bool:
    return value.startswith("container:") and bool(_CONTAINER_NAME.fullmatch(value.removeprefix("container:")))


def check_ipc_mode(mode: str) -> str | None:
    """``container.ipc``: host, private, shareable, none or container:NAME."""
    if mode in IPC_MODES or _container_ref(mode):
        return None
    return f"container.ipc {mode!r} is not an IPC mode; use one of {', '.join(IPC_MODES)} or container:NAME"


def check_network_mode(mode: str) -> str | None:
    """``container.network``: host, bridge, none, container:NAME or the name of a Docker network."""
    if mode in NETWORK_MODES or _container_ref(mode):
        return None
    if not mode.startswith("container:") and ":" not in mode and _NETWORK_NAME.fullmatch(mode):
        return None
    return (
        f"container.network {mode!r} is not a network mode; use one of {', '.join(NETWORK_MODES)}, container:NAME "
        "or a network's name (letters, digits, '_.-')"
    )


def check_pid_mode(mode: str) -> str | None:
    """A pid mode: host, private or container:NAME (for a recipe key that may come)."""
    if mode in ("host", "private") or _container_ref(mode):
        return None
    return f"pid mode {mode!r} is not one of host, private, container:NAME"


_USER_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"
_USER_RE = re.compile(rf"(?:{_USER_NAME}|[0-9]{{1,10}})(?::(?:{_USER_NAME}|[0-9]{{1,10}}))?", re.ASCII)


def check_user(user: str) -> str | None:
    """``container.user``: name, uid, uid:gid or name:group."""
    if _USER_RE.fullmatch(user):
        ids = [int(p) for p in user.split(":") if p.isdigit()]
        if all(i < 2**32 - 1 for i in ids):
            return None
    return f"container.user {user!r} must be NAME, UID, UID:GID or NAME:GROUP (like 1000:1000 or vllm)"


_LOOPBACK_HOSTS = ("localhost", "::1")


def check_health_url(url: str) -> str | None:
    """``health.url``: http or https, with a loopback host (the check runs on this host), no credentials."""
    fix = "like http://127.0.0.1:8000/health"
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as exc:
        return f"health.url {url!r} is not a valid URL ({exc}); {fix}"
    if u.scheme not in ("http", "https"):
        return f"health.url {url!r} must be http:// or https://; {fix}"
    if not u.hostname:
        return f"health.url {url!r} has no host; {fix}"
    if u.username is not None or u.password is not None:
        return f"health.url {url!r} must not carry credentials (they would show in plan and logs); {fix}"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return f"health.url {url!r} holds spaces or control characters; {fix}"
    host = u.hostname
    if not (host in _LOOPBACK_HOSTS or re.fullmatch(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", host)):
        return (
            f"health.url {url!r}: host {host!r} is not loopback; the check is made from this host to the container's "
            f"port on it, so use 127.0.0.1, ::1 or localhost; {fix}"
        )
    if port == 0:
        return f"health.url {url!r}: port 0 is not a port; {fix}"
    return None


_SHM_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([bkmgBKMG]|[kmgKMG][bB])?", re.ASCII)


def check_shm_size(size: str) -> str | None:
    """``container.shm_size``: a positive size in bytes, or with a unit b, k, m or g (like 64m or 2g)."""
    m = _SHM_SIZE_RE.fullmatch(size)
    if m is None or float(m.group(1)) <= 0:
        return f"container.shm_size {size!r} must be a positive size like 64m, 2g or 1073741824 (units b, k, m, g)"
    return None


_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*", re.ASCII)


def _path_problem(path: str, what: str) -> str | None:
    if not path.startswith("/"):
        return f"the {what} path {path!r} must be absolute"
    if any(ord(c) < 32 for c in path):
        return f"the {what} path {path!r} holds control characters"
    parts = path.split("/")
    if ".." in parts or "." in parts or "//" in path or (len(path) > 1 and path.endswith("/")):
        return (
            f"the {what} path {path!r} is not normalised ('.', '..', '//' or a trailing '/'): "
            f"write the path it stands for, {'/' + posixpath.normpath(path).lstrip('/')!r}"
        )
    return None


def check_volume(volume: str) -> str | None:
    """One ``container.volumes`` entry: HOST:CONTAINER[:ro|:rw], both absolute and normalised (or a named volume)."""
    fix = "write HOST:CONTAINER or HOST:CONTAINER:ro with absolute paths, like /models:/models:ro"
    parts = volume.split(":")
    if len(parts) not in (2, 3):
        return f"volume {volume!r} must have 2 or 3 ':'-separated parts; {fix}"
    host, ctr = parts[0], parts[1]
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        return f"volume {volume!r}: mode {parts[2]!r} must be ro or rw; {fix}"
    if not host.startswith("/") and not _VOLUME_NAME.fullmatch(host):
        return f"volume {volume!r}: the host side must be an absolute path (or a named volume); {fix}"
    if host.startswith("/"):
        problem = _path_problem(host, "host")
        if problem:
            return f"volume {volume!r}: {problem}"
        if host == "/":
            return f"volume {volume!r} would mount the host's whole filesystem; mount only the directory it needs"
    problem = _path_problem(ctr, "container")
    if problem:
        return f"volume {volume!r}: {problem}" + (f"; {fix}" if "absolute" in problem else "")
    if ctr == "/":
        return f"volume {volume!r} cannot mount over the container's '/'; {fix}"
    return None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def check_env_name(name: str) -> str | None:
    if _ENV_NAME.fullmatch(name):
        return None
    return f"container.env: variable name {name!r} must match [A-Za-z_][A-Za-z0-9_]*"


DOCKER_URL_SCHEMES = ("unix", "tcp", "ssh", "http", "https")


def check_docker_url(url: str) -> str | None:
    """``docker.url``: unix:///ABSOLUTE/PATH, or tcp/ssh/http/https://HOST[:PORT]."""
    fix = "like unix:///var/run/docker.sock or tcp://127.0.0.1:2375"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return f"docker.url {url!r} holds spaces or control characters; {fix}"
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        return f"docker.url {url!r} is not a valid URL ({exc}); {fix}"
    if u.scheme not in DOCKER_URL_SCHEMES:
        return f"docker.url {url!r}: the scheme must be one of {', '.join(DOCKER_URL_SCHEMES)}; {fix}"
    if u.scheme == "unix":
        path = (u.netloc + u.path) if u.netloc else u.path
        if u.netloc or not path.startswith("/") or path == "/":
            return f"docker.url {url!r}: a unix URL needs an absolute socket path (three slashes); {fix}"
        return None
    if not u.hostname:
        return f"docker.url {url!r} has no host; {fix}"
    return None


_GPU_UUID = re.compile(r"(?:GPU|MIG)-[A-Za-z0-9][A-Za-z0-9/-]*", re.ASCII)


def check_gpu_uuid(uuid: str) -> str | None:
    """A GPU slot's ``uuid``: NVML's form (GPU-… or MIG-…); no ',' that would name a second device."""
    if _GPU_UUID.fullmatch(uuid):
        return None
    return f"GPU uuid {uuid!r} must look like GPU-5d3e8f0a-8c1e-4a57-9a8e-0c7d1f1a2b30 (nvidia-smi -L shows it)"


# A whole env value "${NAME}": the value comes from secrets.env_file or the reconciler's environment (reconciler.load.secrets).
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def check_env_ref(name: str, value: str) -> str | None:
    if "${" in value and not ENV_REF.fullmatch(value):
        return (
            f'container.env.{name}: a reference must be the whole value, "${{NAME}}" (the value then comes from '
            "secrets.env_file in configs/host.yaml or the reconciler's environment)"
        )
    return None


def check_text(value: str, what: str) -> str | None:
    """Free text that reaches Docker (labels, arguments, env values): no NUL."""
    if "\x00" in value:
        return f"{what}: a NUL character cannot be passed to Docker; remove it"
    return None


def offload_lands_in(container: ContainerSpec, shm_dir: str) -> bool:
    """Whether a recipe's offload files land in ``shm_dir`` on the host: the container shares the host's /dev/shm
    (ipc host) and shm.dir is /dev/shm, or shm.dir is bind-mounted into it."""
    if container.ipc == "host" and shm_dir == "/dev/shm":
        return True
    return any(v.split(":")[0] == shm_dir for v in container.volumes)


# ---------------------------------------------------------------- the same rules, as JSON Schema can say them
#
# For the published schemas (``reconciler schema``, schemas/): what an editor can check while the operator types.
# The check_* functions above stay the rules and give the messages; each pattern here says as much of its rule as
# a regular expression can, in the dialect JSON Schema names (ECMA-262; Python's re reads them alike, except that
# its '$' also matches before a final newline). tests/test_schemas.py holds both to the bad-input corpus and lists
# the cases only the loader can tell.

_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_NO_CONTROL = r"^[^\x00-\x1f]*$"
_NO_NUL = r"^[^\x00]*$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
GPU_UUID_PATTERN = r"^(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9/-]*$"
DOCKER_URL_PATTERN = (
    r"^(unix:///[^\s]*[^\s/][^\s]*|(tcp|ssh|http|https)://([^\s/@]+@)?([^\s/:@\[\]]+|\[[0-9A-Fa-f:.]+\])"
    rf"(:{_PORT})?(/[^\s]*)?)$"
)
SHM_DIR_PATTERN = r"^(?![\s\S]*[\x00-\x1f])(?![\s\S]*//[^/])(?!(.*/)?\.\.?(/|$))/.*[^/]/*$"
SHM_PATTERN_PATTERN = r"^(?!\.)[A-Za-z0-9_.+-]+\*(?!\.+$)[A-Za-z0-9_.+-]+$"
IMAGE_PATTERN = (
    rf"^(({_DOMAIN})/)?{_NAME_COMPONENT}(/{_NAME_COMPONENT})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(@(sha256:[0-9a-f]{64}|(?!sha256:)[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_CONTAINER_REF = r"container:[a-zA-Z0-9][a-zA-Z0-9_.-]*"
IPC_PATTERN = rf"^(host|private|shareable|none|{_CONTAINER_REF})$"
NETWORK_PATTERN = rf"^(host|bridge|none|{_CONTAINER_REF}|[a-zA-Z0-9][a-zA-Z0-9_.-]{{0,127}})$"
_USER_PART = r"([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})"
USER_PATTERN = rf"^{_USER_PART}(:{_USER_PART})?$"
SHM_SIZE_PATTERN = r"^(?!0*(\.0*)?([bkmgBKMG]|[kmgKMG][bB])?$)[0-9]+(\.[0-9]+)?([bkmgBKMG]|[kmgKMG][bB])?$"
LOOPBACK_URL_PATTERN = (
    rf"^https?://(127\.[0-9]{{1,3}}\.[0-9]{{1,3}}\.[0-9]{{1,3}}|localhost|\[::1\])(:{_PORT})?([/?#][^\s]*)?$"
)
_ABS_PATH = r"(/(?!\.\.?(/|:|$))[^/:\x00-\x1f]+)+"
VOLUME_PATTERN = rf"^({_ABS_PATH}|[A-Za-z0-9][A-Za-z0-9_.-]*):{_ABS_PATH}(:(ro|rw))?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A value holds no NUL, and a "${NAME}" reference is the whole value or absent.
ENV_VALUE_PATTERN = r"^(?![\s\S]*\$\{)[^\x00]*$|^\$\{[A-Za-z_][A-Za-z0-9_]*\}$"


def _pattern(pattern: str) -> dict[str, Any]:
    """A field's schema-only pattern (the validator keeps its own check and message)."""
    return {"pattern": pattern}


def _ok(problem: str | None, value: _T) -> _T:
    """A validator's answer: the value, or the rule's problem as the ValueError pydantic reports."""
    if problem:
        raise ValueError(problem)
    return value


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default. No inf or nan anywhere. Types are
    strict: YAML and TOML give real integers, booleans and numbers, so a quoted ``"1"`` where a number belongs is
    a mistake to name, not a string to convert (an integer is still a number where a float is asked for)."""

    # defer_build: a model's validator is built when it first validates, not when this module is imported; the
    # nested models are then built once, inside the file models' schemas (about 15 ms of every command's start).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True, strict=True)


# ---------------------------------------------------------------- configs/host.yaml

PID_MAX = 4194304  # Linux's PID_MAX_LIMIT
DAY_S = 86400.0


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


RESERVE_POLICIES = ("report", "enforce")


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


# ---------------------------------------------------------------- configs/recipes/NAME.toml


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


def check_probe_url(url: str, what: str) -> str | None:
    """A probe's or the drain's URL: the same rules as the health URL (http(s), loopback, no credentials)."""
    problem = check_health_url(url)
    return problem.replace("health.url", what) if problem else None


PROBE_KINDS = ("models", "chat", "completion", "tools", "tool-result", "responses", "needle", "batch")
PROBE_SUITES = ("preflight", "regression")
# Keywords a JSON Schema may carry that validate nothing (annotations and structure): accepted beside the
# validating keywords of draft 2020-12. Anything else is refused at load: a misspelt keyword would check nothing,
# and a probe that checks less than it says passes an engine it should fail.
_SCHEMA_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$defs",
        "definitions",
        "$comment",
        "$vocabulary",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)


def check_json_schema(schema: object, where: str) -> str | None:
    """A JSON Schema (draft 2020-12) a probe checks answers against: valid by the meta-schema, and made only of
    keywords the validator applies or knows as annotations. jsonschema is imported here, on first use: only a
    recipe that carries a schema pays for it."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        return f"{where} must be a table (a JSON Schema object)"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = list(exc.absolute_path)
        at = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in path)
        if path and path[-1] == "type":
            return (
                f"{where}{at} {exc.instance!r} is not a JSON Schema type (object, array, string, integer, number, "
                "boolean, null, or a list of them)"
            )
        return f"{where}{at} is not a valid JSON Schema: {exc.message}"
    known = set(Draft202012Validator.VALIDATORS) | _SCHEMA_ANNOTATIONS

    def walk(node: object, path: str) -> str | None:
        if not isinstance(node, dict):
            return None  # a boolean schema (true/false): nothing to misspell
        unknown = sorted(set(node) - known)
        if unknown:
            return (
                f"{path}: unknown JSON Schema keyword(s) {', '.join(unknown)} (draft 2020-12); a misspelt keyword "
                "would check nothing: fix or remove it"
            )
        for key in _SUBSCHEMA_MAPS:
            for name, sub in (node.get(key) or {}).items():
                if problem := walk(sub, f"{path}.{key}.{name}"):
                    return problem
        for key in _SUBSCHEMA_LISTS:
            for i, sub in enumerate(node.get(key) or ()):
                if problem := walk(sub, f"{path}.{key}[{i}]"):
                    return problem
        for key in _SUBSCHEMA_ONE:
            if key in node and (problem := walk(node[key], f"{path}.{key}")):
                return problem
        return None

    return walk(schema, where) or _unresolved_ref(schema, where)


def _unresolved_ref(schema: dict[str, object], where: str) -> str | None:
    """The first ``$ref`` (or ``$dynamicRef``) of a schema that does not resolve within it, as a problem; None when
    all do. A probe checks answers offline: a reference to another document, or to a definition the schema lacks,
    would fail only when an enter's probe first reaches it. Resolved as jsonschema resolves them (its ``referencing``
    library), each from the base URI of the schema object it stands in."""
    from referencing import Registry, Resource
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root = Resource.from_contents(schema, default_specification=DRAFT202012)
    base = root.id() or "urn:reconciler:probe-schema"
    resolver = Registry().with_resource(base, root).resolver(base_uri=base)
    skip = {"enum", "const", "default", "examples"}  # values, not schemas

    def walk(node: object, path: str, resolver: Any) -> str | None:
        if isinstance(node, list):
            for i, sub in enumerate(node):
                if problem := walk(sub, f"{path}[{i}]", resolver):
                    return problem
            return None
        if not isinstance(node, dict):
            return None
        if node is not schema and isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(Resource.from_contents(node, default_specification=DRAFT202012))
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    return (
                        f"{path}.{key} {ref!r} does not resolve within the schema: a probe's schema is checked "
                        "offline, so each reference must point into it (#/$defs/NAME, with NAME defined under $defs)"
                    )
        for k, v in node.items():
            if k not in skip and (problem := walk(v, f"{path}.{k}", resolver)):
                return problem
        return None

    return walk(schema, where, resolver)


class ToolSpec(_Strict):
    """One function a ``tools``, ``tool-result`` or ``batch`` probe offers the model (``[[probes.tools]]``), sent as
    the OpenAI API's ``{"type": "function", "function": {name, description, parameters}}``."""

    name: str = Field(
        min_length=1, max_length=64, description="The function's name.", json_schema_extra=_pattern(r"^[A-Za-z0-9_-]+$")
    )
    description: str = Field(default="", description="What the function does, as the model reads it.")
    parameters: dict[str, object] = Field(
        default_factory=lambda: dict[str, object](type="object", properties={}),
        description="The JSON Schema of its arguments; a call's arguments are validated against it.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ok(
            None
            if re.fullmatch(r"[A-Za-z0-9_-]+", v)
            else (f"tool name {v!r} must be letters, digits, '_' and '-' (the OpenAI API's rule for function names)"),
            v,
        )

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, object]) -> dict[str, object]:
        return _ok(check_json_schema(v, "parameters"), v)

    def to_openai(self) -> dict[str, object]:
        fn: dict[str, object] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


# Which settings each kind reads; any other given is an error naming it (a setting a kind ignores would check
# nothing). Every kind reads name, kind, suite, model, base_url, status, timeout_s and max_latency_s.
_KIND_FIELDS: dict[str, frozenset[str]] = {
    "models": frozenset(),
    "chat": frozenset({"prompt", "max_tokens", "stream", "contains", "matches", "json_schema"}),
    "completion": frozenset({"prompt", "max_tokens", "stream", "contains", "matches"}),
    "tools": frozenset({"prompt", "max_tokens", "stream", "tools", "tool_choice", "function", "contains", "matches"}),
    "tool-result": frozenset(
        {"prompt", "max_tokens", "stream", "tools", "function", "arguments", "tool_result", "contains", "matches"}
    ),
    "responses": frozenset({"prompt", "max_tokens", "contains", "matches", "json_schema"}),
    "needle": frozenset({"max_tokens", "haystack_tokens", "depth", "seed"}),
    "batch": frozenset(
        {
            "prompt",
            "max_tokens",
            "tools",
            "tool_choice",
            "function",
            "contains",
            "matches",
            "requests",
            "prefix_tokens",
            "seed",
        }
    ),
}
_OPTIONAL_FIELDS = (
    "prompt",
    "stream",
    "contains",
    "matches",
    "json_schema",
    "tools",
    "tool_choice",
    "function",
    "arguments",
    "tool_result",
    "haystack_tokens",
    "depth",
    "seed",
    "requests",
    "prefix_tokens",
)


class ProbeSpec(_Strict):
    """One functional check of a lane (``[[probes]]`` in a recipe), against vLLM's OpenAI-compatible server at
    ``base_url`` (default: the origin of ``health.url``). Probes of ``suite = "preflight"`` (the default) run after
    the health URL answers and before an enter counts as done; ``regression`` ones only on demand (``reconciler
    probe RECIPE --suite regression``, the API and MCP). Kinds:

    - ``models``: GET /v1/models lists ``model``;
    - ``chat`` / ``completion``: POST /v1/chat/completions or /v1/completions with ``prompt`` (``stream``;
      ``json_schema`` asks for structured output, chat only);
    - ``tools``: a chat request offering ``tools`` with ``tool_choice``; passes when the answer calls ``function``
      with arguments that validate against its parameters (``stream``: the call reassembled from the deltas);
    - ``tool-result``: ``prompt``, the assistant's call of ``function`` with ``arguments``, and a ``tool`` message
      with ``tool_result``; passes when the answer uses the result (``contains``/``matches`` a value of it);
    - ``responses``: POST /v1/responses, the same text, regex and schema checks on its output text;
    - ``needle``: a haystack of about ``haystack_tokens`` tokens made from ``seed`` with one fact at ``depth``
      (0 the start, 1 the end); passes when the answer carries the fact;
    - ``batch``: ``requests`` at once, sharing a prefix of about ``prefix_tokens`` tokens, each with ``prompt``
      (``{i}`` is the request's number, in ``contains`` and ``matches`` too; with ``tools``, a tool call each);
      passes only when all pass.
    """

    name: str = Field(
        min_length=1,
        max_length=64,
        description="The probe's name in reasons, logs and metrics: letters, digits and '_.-'.",
        json_schema_extra=_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
    )
    kind: Literal["models", "chat", "completion", "tools", "tool-result", "responses", "needle", "batch"] = Field(
        default="chat", description="What the probe asks the server (see the settings each kind reads)."
    )
    suite: Literal["preflight", "regression"] = Field(
        default="preflight",
        description="preflight: run before an enter counts as done; regression: only on demand (reconciler probe).",
    )
    prompt: str | None = Field(default=None, description="The text sent (batch: {i} is each request's number).")
    model: str | None = Field(default=None, description="The served model's name; default: the recipe's model.id.")
    base_url: str | None = Field(
        default=None,
        description="A loopback http(s) origin of the OpenAI-compatible API; default: the origin of health.url.",
        json_schema_extra=_pattern(LOOPBACK_URL_PATTERN),
    )
    max_tokens: int = Field(default=64, ge=1, le=1 << 20, description="The most tokens the answer may have.")
    stream: bool | None = Field(
        default=None, description="Ask for a streamed answer (chat, completion, tools, tool-result)."
    )
    status: int = Field(default=200, ge=100, le=599, description="The HTTP status the answer must have.")
    contains: str | None = Field(default=None, description="Text the answer must contain.")
    matches: str | None = Field(default=None, description="A regular expression (Python's) the answer must match.")
    json_schema: dict[str, object] | None = Field(
        default=None,
        description="A JSON Schema (draft 2020-12) the answer's structured output must validate against (chat, "
        "responses).",
    )
    max_latency_s: float | None = Field(
        default=None, gt=0, le=DAY_S, description="The longest the answer may take (seconds) and still pass."
    )
    timeout_s: float = Field(default=60, gt=0, le=DAY_S, description="Seconds before the request is given up.")
    tools: list[ToolSpec] | None = Field(
        default=None, min_length=1, max_length=128, description="Functions offered to the model ([[probes.tools]])."
    )
    tool_choice: str | None = Field(
        default=None, description="auto, required, or the name of one of tools (default auto)."
    )
    function: str | None = Field(
        default=None, description="The function the answer must call (tool-result: the one that was called)."
    )
    arguments: dict[str, object] | None = Field(
        default=None, description="tool-result: the arguments of the assistant's call."
    )
    tool_result: str | None = Field(default=None, description="tool-result: what the tool answered.")
    haystack_tokens: int | None = Field(
        default=None, ge=64, le=1 << 21, description="needle: about how many tokens of haystack to send."
    )
    depth: float | None = Field(
        default=None, ge=0, le=1, description="needle: where the fact is hidden (0 the start, 1 the end)."
    )
    seed: int | None = Field(
        default=None, ge=0, le=(1 << 63) - 1, description="needle, batch: the seed the generated text is made from."
    )
    requests: int | None = Field(default=None, ge=1, le=1024, description="batch: how many requests at once.")
    prefix_tokens: int | None = Field(
        default=None, ge=0, le=1 << 21, description="batch: about how many tokens of prefix the requests share."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ok(
            None
            if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v)
            else (f"probe name {v!r} must be letters, digits and '_.-' (it names the probe in reasons and logs)"),
            v,
        )

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return v if v is None else _ok(check_probe_url(v, "probes.base_url"), v.rstrip("/"))

    @field_validator("matches")
    @classmethod
    def _matches(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"probes.matches {v!r} is not a valid regular expression ({exc})") from None
        return v

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, v: dict[str, object] | None) -> dict[str, object] | None:
        return v if v is None else _ok(check_json_schema(v, "probes.json_schema"), v)

    @model_validator(mode="after")
    def _fits_kind(self) -> ProbeSpec:
        where = f"probe {self.name!r} of kind {self.kind!r}"
        reads = _KIND_FIELDS[self.kind]
        given = [k for k in _OPTIONAL_FIELDS if getattr(self, k) not in (None, False)]
        extra = [k for k in given if k not in reads]
        if self.max_tokens != 64 and "max_tokens" not in reads:
            extra.append("max_tokens")
        if extra:
            if self.kind == "models":
                why = "a models probe only lists the served models"
            else:
                takers = sorted(k for k, fields in _KIND_FIELDS.items() if set(extra) <= fields)
                why = f"kind {' or '.join(takers)} does" if 0 < len(takers) <= 3 else "remove it"
            raise ValueError(f"{where} does not read {', '.join(extra)} ({why})")
        if "prompt" in reads and self.kind != "batch" and not self.prompt:
            raise ValueError(f"{where} needs a prompt")
        names = [t.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: two tools share a name; give each its own")
        if self.kind in ("tools", "tool-result") and not names:
            raise ValueError(f"{where} needs tools ([[probes.tools]] with name and parameters)")
        if self.tool_choice is not None and self.tool_choice not in ("auto", "required", *names):
            raise ValueError(
                f"{where}: tool_choice {self.tool_choice!r} is not auto, required or one of the tools "
                f"({', '.join(names) or 'none given'})"
            )
        if names:
            if self.function is None and len(names) > 1 and self.tool_choice not in names:
                raise ValueError(
                    f"{where}: with several tools, say which one the answer must call (function = "
                    f"one of {', '.join(names)})"
                )
            if self.function is not None and self.function not in names:
                raise ValueError(f"{where}: function {self.function!r} is not one of its tools ({', '.join(names)})")
        elif self.function is not None:
            raise ValueError(f"{where}: function {self.function!r} needs tools to call it from")
        if self.kind == "tool-result":
            if self.tool_result is None or self.arguments is None:
                raise ValueError(
                    f"{where} needs arguments (the call the assistant made) and tool_result (what the tool answered)"
                )
            if self.contains is None and self.matches is None:
                raise ValueError(f"{where} needs contains or matches: a value of tool_result the answer must use")
            if self.contains is not None and self.contains not in self.tool_result:
                raise ValueError(
                    f"{where}: contains {self.contains!r} is not in tool_result, so it would not show "
                    "that the answer used the result"
                )
            if self.matches is not None and not re.search(self.matches, self.tool_result):
                raise ValueError(
                    f"{where}: matches /{self.matches}/ does not match tool_result, so it would not "
                    "show that the answer used the result"
                )
        if self.kind == "batch" and not self.prompt:
            raise ValueError(f"{where} needs a prompt ({{i}} in it is each request's number)")
        if self.stream and self.kind not in ("chat", "completion", "tools", "tool-result"):
            raise ValueError(f"{where} cannot stream; stream is for chat, completion, tools and tool-result")
        return self

    def tool(self, name: str | None) -> ToolSpec | None:
        return next((t for t in self.tools or () if t.name == name), None)

    @property
    def expected_call(self) -> str | None:
        """The function a ``tools`` (or tool ``batch``) answer must call."""
        if not self.tools:
            return None
        named = self.tool_choice if self.tool_choice not in (None, "auto", "required") else None
        return self.function or named or self.tools[0].name


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
        so is the reserve policy, a judgement of the lane, not part of it. So are the probes and the drain settings:
        they say how the reconciler checks and stops the lane, not what runs in it.
        """
        dump = self.model_dump(mode="json", exclude={"description", "gpu_reserve", "probes", "drain"})
        canon = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- manifests/*.yaml


class AssignmentSpec(_Strict):
    """One container that should run: a recipe on GPU slots."""

    recipe: str = Field(
        min_length=1,
        description="A recipe's name: configs/recipes/NAME.toml.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    gpus: list[str] = Field(
        min_length=1,
        description="The GPU slots it runs on (names from configs/host.yaml), as many as the recipe's "
        "tensor_parallel_size; a slot runs one recipe at a time.",
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": NAME_PATTERN}},
    )


class Manifest(_Strict):
    """manifests/NAME.yaml: the desired state of one host, what the operator edits."""

    host: str = Field(
        description="The host this manifest is for: the name in configs/host.yaml.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    assignments: list[AssignmentSpec] = Field(
        default_factory=list, description="One entry per container; a GPU slot not listed is free (none: all free)."
    )
    fallback: bool = Field(
        default=True,
        description="While a wanted lane's enter failed and waits in backoff, bring back the last converged "
        "topology on the slots it needed (false: leave them empty until the next attempt).",
    )


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
    # sha256 of each "${NAME}" value the recipes take (never the value): it goes into the spec hash.
    secret_digests: Mapping[str, str] = field(default_factory=dict)
    # The manifest's ``fallback``: whether a held lane's slots serve the last converged topology meanwhile.
    fallback: bool = True

    def slot_owner(self) -> dict[str, DesiredAssignment]:
        return {slot: a for a in self.assignments for slot in a.slots}

    def reserve_policy(self, recipe: str | None) -> str:
        """``report`` or ``enforce``: the recipe's own ``gpu_reserve.policy``, else the host's."""
        r = self.recipes.get(recipe or "")
        if r is not None and r.gpu_reserve.policy is not None:
            return r.gpu_reserve.policy
        return self.host.gpu_reserve.policy
