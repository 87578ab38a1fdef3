"""``source:`` of configs/host.yaml as pydantic types: a git repository the host's desired state is pulled from.

The repository's ``path`` is laid out like a root without its host file (``manifests/HOST.yaml`` and
``configs/recipes/*.toml``); the host file stays local, since it describes the machine. Read by
``reconciler.load.git_source`` (which runs the git CLI) and ``reconciler.service.sync`` (which fetches, validates and
waits for the canaries of ``after``).

Every value here reaches a git command line, so each is checked to be what it says before use: a URL of a transport
git can be held to (https, http, ssh, git, file, or ``user@host:path``), never one that runs a program (``ext::``) or
that git would read as an option (``-...``), and no credentials in it (they would be printed: use a credential helper
or an SSH key); a branch name git accepts; a path inside the repository. A plaintext transport (``http://``,
``git://``: anyone on the path can hand the host a commit of their own) is refused unless ``insecure_transport`` says
so.

Whoever can push to the repository chooses what runs as root on the host: ``allow`` (``SourceAllow``) is this host's
bound on it, kept in the host file, which never comes from git. ``reconciler.load.admission`` holds the recipes a
commit's manifest runs to it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from reconciler.model.rules import _VOLUME_NAME, ENV_NAME_PATTERN, NAME_PATTERN, _path_problem, check_name
from reconciler.model.strict import _ok, _pattern, _Strict

# The transports a source may use; git is also held to them on its command line (protocol.allow).
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")
# Those that neither authenticate the server nor protect what it sends: only with source.insecure_transport.
PLAINTEXT_SCHEMES = ("http", "git")
_SCP_RE = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9.-]*:(?!//)[^\s]+$")
_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_PATH_PART_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def check_git_url(v: str) -> str | None:
    """What is wrong with ``v`` as a source's git URL, or None."""
    if not v or v != v.strip() or any(c.isspace() or ord(c) < 32 for c in v):
        return "git: a URL without spaces or control characters"
    if v.startswith("-"):
        return f"git {v!r} starts with '-': git would read it as an option"
    if v.startswith("/"):
        return None  # a repository on this machine
    if "::" in v.split("/", 1)[0]:
        return f"git {v!r}: transports that run a program (ext::, fd::) are refused; use https, ssh, git or file"
    if "://" in v:
        try:
            u = urlsplit(v)
            u.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            return f"git {v!r} is not a URL: {exc}"
        if u.scheme not in GIT_SCHEMES:
            return f"git {v!r}: scheme {u.scheme!r} is not one of {', '.join(GIT_SCHEMES)}"
        if u.password is not None or (u.username and u.scheme in ("https", "http")):
            return "git: no credentials in the URL (they would be printed); use a credential helper or an SSH key"
        if u.query or u.fragment:
            return "git: no query or fragment in the URL (a token there would be printed); use a credential helper"
        if u.scheme != "file" and not u.hostname:
            return f"git {v!r}: the URL names no host"
        return None
    if _SCP_RE.match(v):
        return None
    return f"git {v!r}: give a URL (https://, ssh://, git://, file://), user@host:path, or an absolute path"


def check_git_ref(v: str) -> str | None:
    """What is wrong with ``v`` as a branch name, or None (git check-ref-format's rules that matter here)."""
    if not _REF_RE.match(v) or ".." in v or "//" in v or v.endswith(("/", ".", ".lock")) or "/." in v or "@{" in v:
        return f"ref {v!r} is not a branch name git accepts (letters, digits, . _ / -; no '..', no leading '-')"
    return None


def check_repo_path(v: str) -> str | None:
    """What is wrong with ``v`` as a directory inside the repository, or None ('.' is its top)."""
    if v == ".":
        return None
    parts = v.strip("/").split("/") if v.strip("/") else []
    if v.startswith("/") or not parts or any(not _PATH_PART_RE.match(p) or p in (".", "..") for p in parts):
        return f"path {v!r}: a directory inside the repository, like fleet or hosts/gpu (no '..', not absolute)"
    return None


def check_allowed_mount(entry: str) -> str | None:
    """What is wrong with ``entry`` of ``source.allow.mounts``, or None: ``/ABSOLUTE/PATH`` (that directory and
    everything under it), the same with ``:ro`` (only mounted read-only), or a named volume's name."""
    path, sep, mode = entry.partition(":")
    if sep and mode != "ro":
        return f"source.allow.mounts {entry!r}: only ':ro' may follow the path (mounted read-only)"
    if not path.startswith("/"):
        if sep or not _VOLUME_NAME.fullmatch(path):
            return (
                f"source.allow.mounts {entry!r}: an absolute directory (like /models or /models:ro), or a volume's name"
            )
        return None
    problem = _path_problem(path, "allowed")
    if problem:
        return f"source.allow.mounts: {problem}"
    if path == "/":
        return "source.allow.mounts '/': that is the host's whole filesystem; list the directories lanes need"
    return None


class SourceAllow(_Strict):
    """What the recipes a commit runs on this host may ask of it; the rest is refused like a file that does not
    validate. Each default allows what a serving lane needs and nothing more (docs/design.md, Many hosts)."""

    images: list[str] = Field(
        default_factory=lambda: ["*"],
        max_length=256,
        description="Images a recipe may run: shell-style patterns of the reference as written (fnmatch: * matches "
        "any characters, '/' included), like registry.example.com/vllm/*. Default: any image the engine already has "
        "(the tool never pulls one).",
        json_schema_extra={"items": {"type": "string", "minLength": 1, "pattern": r"^[^\s]+$"}},
    )
    mounts: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Host directories a recipe may bind-mount, each with everything under it: /ABSOLUTE/PATH, or "
        "/ABSOLUTE/PATH:ro for read-only mounts only; or the name of a volume. shm.dir is always allowed (the "
        "offload tmpfs). Default: none.",
        json_schema_extra={"items": {"type": "string", "minLength": 1}},
    )
    ipc_host: bool = Field(
        default=True,
        description='A recipe may share an IPC namespace beyond its own: the host\'s (ipc = "host", where native '
        "offload files land in the host's /dev/shm) or another container's (container:NAME). Default: true.",
    )
    network_host: bool = Field(
        default=False,
        description='A recipe may share a network namespace beyond its own: the host\'s (network = "host", every '
        "port and interface of the host, which a lane whose health URL is on loopback needs) or another "
        "container's (container:NAME). Default: false.",
    )
    env_from_secrets: list[str] = Field(
        default_factory=list,
        max_length=256,
        description='The secrets a recipe may take ("${NAME}" env values, from secrets.env_file or the '
        "reconciler's own environment), by name. Default: none.",
        json_schema_extra={"items": {"pattern": ENV_NAME_PATTERN}},
    )

    @field_validator("images")
    @classmethod
    def _images(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if not pattern or any(c.isspace() or ord(c) < 32 for c in pattern):
                raise ValueError(f"source.allow.images {pattern!r}: a pattern without spaces, like registry/vllm/*")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for entry in v:
            _ok(check_allowed_mount(entry), entry)
        return v

    @field_validator("env_from_secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(ENV_NAME_PATTERN, name):
                raise ValueError(f"source.allow.env_from_secrets {name!r}: a variable's name, like HF_TOKEN")
        return v


class SourceConfig(_Strict):
    """Where the host's manifests and recipes come from: a branch of a git repository, fetched on a timer."""

    git: str = Field(
        description="The repository: https://, ssh://, git://, file:// URL, user@host:path or an absolute path. "
        "No credentials in it: a credential helper or an SSH key of the running user."
    )
    ref: str = Field(default="main", description="The branch followed.")
    path: str = Field(
        default=".",
        description="The directory of the repository laid out like a root without its host file: "
        "PATH/manifests/HOST.yaml and PATH/configs/recipes/*.toml.",
    )
    interval_s: float = Field(default=60.0, ge=5, le=86400, description="How often the loop fetches (seconds).")
    timeout_s: float = Field(default=60.0, gt=0, le=3600, description="How long one fetch may take (seconds).")
    after: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Canary hosts: a new commit is applied here only once each of them reports it converged; a "
        "commit that leaves one blocked, failed or refused stops here. Each is a host of the fleet file.",
        json_schema_extra={"items": {"pattern": NAME_PATTERN}},
    )
    fleet: str | None = Field(
        default=None,
        description="The fleet file (hosts: name, url, token_file) where the hosts of 'after' are found; needed "
        "with 'after'.",
        json_schema_extra=_pattern(r"^/"),
    )
    allowed_signers: str | None = Field(
        default=None,
        description="Only commits signed with an SSH key of this file are taken (git's gpg.ssh.allowedSignersFile, "
        "as ssh-keygen -Y verify reads it: one 'PRINCIPAL [namespaces=\"git\"] KEY' a line); an unsigned commit, or "
        "one signed by another key, is refused. An absolute path, root's and not writable by others.",
        json_schema_extra=_pattern(r"^/"),
    )

    allow: SourceAllow = Field(
        default_factory=SourceAllow,
        description="What the recipes a commit runs here may ask of the host (images, mounts, namespaces, "
        "secrets); a commit whose recipes ask more is refused. Whoever can push to the repository chooses what runs "
        "as root here: this is the host's own bound on it.",
    )
    insecure_transport: bool = Field(
        default=False,
        description="Take commits over http:// or git://, which neither authenticate the server nor protect what "
        "it sends (anyone on the path can hand the host a commit). Default false: those URLs are refused; "
        "validate warns while this is true.",
    )

    @field_validator("git")
    @classmethod
    def _git(cls, v: str) -> str:
        return _ok(check_git_url(v), v)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return _ok(check_git_ref(v), v)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        problem = check_repo_path(v)
        return _ok(problem, v if v == "." else v.strip("/"))

    @field_validator("after")
    @classmethod
    def _after(cls, v: list[str]) -> list[str]:
        for name in v:
            problem = check_name(name, "a host of 'after'")
            if problem:
                raise ValueError(problem)
        if len(set(v)) != len(v):
            raise ValueError("after: each host once")
        return v

    @field_validator("fleet", "allowed_signers")
    @classmethod
    def _absolute(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and (not v.startswith("/") or any(c.isspace() or ord(c) < 32 for c in v)):
            raise ValueError(f"source.{info.field_name} must be an absolute path without spaces, got {v!r}")
        return v

    def warnings(self) -> list[str]:
        """What ``validate`` warns of while this source stands as it is: a risk the operator chose, or a guard left
        off."""
        out = []
        if self.plaintext():
            out.append(
                f"source.insecure_transport is true: commits of {self.git} come over a transport that neither "
                "authenticates the server nor protects what it sends; anyone on the path can choose what runs as root "
                "here. Use https:// or ssh://"
            )
        if self.allowed_signers is None:
            out.append(
                "source.allowed_signers is not set: any commit that reaches the branch is taken, and whoever can push "
                "to it chooses what runs as root here (within source.allow). Name an allowed-signers file of the "
                "keys that may sign"
            )
        return out

    def plaintext(self) -> bool:
        """Whether ``git`` names a transport that neither authenticates the server nor protects the commits."""
        return "://" in self.git and self.git.split("://", 1)[0] in PLAINTEXT_SCHEMES

    @model_validator(mode="after")
    def _plaintext(self) -> SourceConfig:
        if self.plaintext() and not self.insecure_transport:
            scheme = self.git.split("://", 1)[0]
            raise ValueError(
                f"source.git {self.git!r}: {scheme}:// neither authenticates the server nor protects what it sends, "
                "so anyone on the path could hand this host a commit (and with it what runs as root here). Use "
                "https:// or ssh://, or set source.insecure_transport: true to take that risk"
            )
        return self

    @model_validator(mode="after")
    def _after_needs_fleet(self) -> SourceConfig:
        if self.after and self.fleet is None:
            raise ValueError(
                "source.after names canary hosts: give source.fleet, the fleet file that says where each answers"
            )
        return self
