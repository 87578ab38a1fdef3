"""The rules of single values in the operator's files, as small pure functions and as JSON Schema patterns.

Each ``check_*`` returns None when the value is acceptable, else one sentence saying what is wrong and how to fix
it. The file models' validators (``reconciler.model.host``, ``.recipe``, ``.probe_spec``) call them, the loader
calls ``check_name`` for a recipe's file name, and the shm guard calls the shm ones again before it deletes
anything. The ``*_PATTERN`` strings say the same rules as far as a regular expression can, for the published
schemas.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import urlsplit

NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}", re.ASCII)


def check_name(name: str, what: str) -> str | None:
    """A host, GPU slot or recipe name: it becomes part of container names and labels."""
    if _NAME.fullmatch(name):
        return None
    return f"{what} {name!r} must match [a-z0-9][a-z0-9._-]* (lowercase, at most 128 characters)"


# ---------------------------------------------------------------- the rules, as small pure functions

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


def check_probe_url(url: str, what: str) -> str | None:
    """A probe's or the drain's URL: the same rules as the health URL (http(s), loopback, no credentials)."""
    problem = check_health_url(url)
    return problem.replace("health.url", what) if problem else None


# ---------------------------------------------------------------- the same rules, as JSON Schema can say them
#
# For the published schemas (``reconciler schema``, schemas/): what an editor can check while the operator types.
# The check_* functions above stay the rules and give the messages; each pattern here says as much of its rule as
# a regular expression can, in the dialect JSON Schema names (ECMA-262; Python's re reads them alike, except that
# its '$' also matches before a final newline). tests/contract/test_schemas.py holds both to the bad-input corpus and lists
# the cases only the loader can tell.

_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_NO_CONTROL = r"^[^\x00-\x1f]*$"
_NO_NUL = r"^[^\x00]*$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
# What a client may call a model (a served name, an alias): no space or control character, at most 256 characters.
SERVED_NAME_PATTERN = r"^[^\s\x00-\x1f\x7f]{1,256}$"
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
