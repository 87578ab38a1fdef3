"""What a commit of the host's git source may ask of the host: the recipes its manifest runs here held to
``source.allow`` of the host file (``reconciler.model.source.SourceAllow``), which never comes from git.

Whoever can push to the repository chooses the images, mounts and namespaces root's engine gives the lanes of every
host that follows it: a commit titled "routine bump" that bind-mounts ``/root`` or ``/etc`` writes there as uid 0.
This is the host's own bound on that. Each recipe of every topology of this host's manifest is judged (a recipe of
the repository that no topology here runs never runs here), and each thing it asks past the bound is a problem at
its line, named by the rule it broke (``source.allow.mounts`` ...), so the commit is refused like one whose files do
not validate (``reconciler.load.source_sync``) and the commit in use is kept. A local root (no ``source:``) is the
operator's own and is not judged here.

A recipe has no key for ``--privileged``, added capabilities or devices (GPUs come from the host file's slots):
asking for one is an unknown key, refused before this; ``tests/contract/test_admission.py`` fails when a key is added
to a recipe's container without a judgement here.

Called by ``reconciler.load.desired`` once the manifest is cross-checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from fnmatch import fnmatchcase
from pathlib import Path

from reconciler.base.errors import ConfigProblem
from reconciler.load.files import HOST_FILE
from reconciler.load.recipes import recipe_file, recipe_line
from reconciler.model import HostConfig, Recipe
from reconciler.model.source import SourceAllow

# Every key of a recipe's [container] and what judges it here (None: nothing it sets reaches the host beyond the
# container's own namespaces). The contract test holds this to the model's fields.
JUDGED = {
    "image": "source.allow.images",
    "command": None,  # runs inside the container, in its own namespaces
    "entrypoint": None,
    "env": "source.allow.env_from_secrets",
    "volumes": "source.allow.mounts",
    "ipc": "source.allow.ipc_host",
    "network": "source.allow.network_host",
    "init": None,
    "shm_size": None,  # the container's own /dev/shm
    "user": None,  # who runs inside the container: with no host mount or namespace granted, none of the host's
}


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def mount_problem(volume: str, allow: SourceAllow, shm_dir: str) -> str | None:
    """Why ``volume`` (HOST:CONTAINER[:MODE], checked by the recipe model) may not be mounted, or None.

    A host path must lie under a listed directory both as written and as the host resolves it now (a symlink under
    an allowed directory, planted by a lane that could write there, must not lead out of it); ``shm.dir``, the
    offload tmpfs the guard watches, is always allowed."""
    host, _, rest = volume.partition(":")
    mode = rest.partition(":")[2] or "rw"
    if not host.startswith("/"):
        if host in allow.mounts:
            return None
        return f"the volume {host!r}, which source.allow.mounts does not name"
    real = os.path.realpath(host)
    entries = [(shm_dir, False), *((e.removesuffix(":ro"), e.endswith(":ro")) for e in allow.mounts if e[:1] == "/")]
    read_only_only = False
    for top, ro in entries:
        if _under(host, top) and _under(real, os.path.realpath(top)):
            if not ro or mode == "ro":
                return None
            read_only_only = True
    if read_only_only:
        return f"{host} read-write, which source.allow.mounts allows read-only only (add :ro to the volume)"
    if real != host and any(_under(host, top) for top, _ in entries):
        return f"{host}, which leads to {real} on this host, outside every directory source.allow.mounts lists"
    listed = ", ".join(allow.mounts) or "none"
    return f"{host}, outside the directories source.allow.mounts lists ({listed}; shm.dir {shm_dir} is always allowed)"


def recipe_problems(files: Path, name: str, recipe: Recipe, host: HostConfig) -> list[ConfigProblem]:
    """Each thing recipe ``name`` asks past ``host.source.allow``, at its line, naming the rule."""
    assert host.source is not None
    allow = host.source.allow
    c = recipe.container
    out: list[ConfigProblem] = []

    def refuse(loc: tuple[str, ...], rule: str, what: str, fix: str) -> None:
        message = (
            f"{'.'.join(loc)}: {what}: refused by {rule} of {HOST_FILE} (a recipe from git may ask of this host only "
            f"what its host file allows). {fix}"
        )
        out.append(ConfigProblem(recipe_file(name), recipe_line(files, name, loc), message))

    if not any(fnmatchcase(c.image, p) for p in allow.images):
        refuse(
            ("container", "image"),
            "source.allow.images",
            f"image {c.image!r} matches none of {', '.join(allow.images) or 'no pattern'}",
            "Run an image the host allows, or add a pattern for it there",
        )
    for vol in c.volumes:
        why = mount_problem(vol, allow, host.shm.dir)
        if why is not None:
            refuse(
                ("container", "volumes"),
                "source.allow.mounts",
                f"{vol!r} mounts {why}",
                "Mount only what the host allows, or add the directory there if lanes of this host may have it",
            )
    for key, granted in (("ipc", allow.ipc_host), ("network", allow.network_host)):
        mode = getattr(c, key)
        if not granted and mode is not None and (mode == "host" or mode.startswith("container:")):
            whose = "the host's" if mode == "host" else f"container {mode.split(':', 1)[1]!r}'s"
            written = "" if key in recipe.container.model_fields_set else f" (the default when {key} is not written)"
            other = "private" if key == "ipc" else "bridge"
            refuse(
                ("container", key),
                f"source.allow.{key}_host",
                f"{key} = {mode!r}{written} shares {whose} {key} namespace",
                f'Give the recipe {key} = "{other}" or "none", or set source.allow.{key}_host: true there',
            )
    for key, var in c.env_refs().items():
        if var not in allow.env_from_secrets:
            refuse(
                ("container", "env", key),
                "source.allow.env_from_secrets",
                f"takes the secret ${{{var}}}, which source.allow.env_from_secrets does not name",
                "Name it there if lanes of this host may have it",
            )
    return out


def admission_problems(
    files: Path, host: HostConfig, recipes: dict[str, Recipe], used: Iterable[str]
) -> list[ConfigProblem]:
    """Every problem of the recipes ``used`` by this host's manifest against its ``source.allow``; none without a
    source."""
    if host.source is None:
        return []
    out: list[ConfigProblem] = []
    for name in sorted(set(used)):
        if name in recipes:
            out.extend(recipe_problems(files, name, recipes[name], host))
    return out
