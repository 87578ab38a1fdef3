"""configs/host.yaml read into ``HostConfig``, with shm.dir checked to be an existing tmpfs mount point.

``load_host(root)`` serves the shm commands; ``reconciler.load.desired`` reads it with its YAML node (for the lines
of later problems) through ``load_host_file``.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.load.files import HOST_FILE, check_root, rel_path
from reconciler.load.tmpfs import REAL_TMPFS, TmpfsReads
from reconciler.load.yaml_source import validate_yaml, yaml_line
from reconciler.model import HostConfig


def load_host_file(r: Path, tmpfs: TmpfsReads = REAL_TMPFS) -> tuple[HostConfig, yaml.Node | None]:
    """The host file of a root already checked, and its YAML node (where later problems find their lines)."""
    path = r / HOST_FILE
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            [ConfigProblem(rel_path(r, path), None, f"file not found: is --root {r} the directory holding configs/?")]
        )
    host, node = validate_yaml(r, path, HostConfig, "the host file")
    problem = tmpfs.mount_problem(host.shm.dir)
    if problem:
        raise ConfigError([ConfigProblem(HOST_FILE, yaml_line(node, ("shm", "dir")), problem)])
    return host, node


def load_host(root: str | os.PathLike[str], tmpfs: TmpfsReads = REAL_TMPFS) -> HostConfig:
    """The host file, validated, with shm.dir checked to be an existing tmpfs mount point."""
    check_root(Path(root))
    return load_host_file(Path(root), tmpfs)[0]
