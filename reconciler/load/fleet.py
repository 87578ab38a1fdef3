"""A fleet file read and validated (``reconciler.model.fleet``): every problem with its file, line and fix."""

from __future__ import annotations

from pathlib import Path

from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.load.yaml_source import validate_yaml
from reconciler.model.fleet import FleetFile


def load_fleet(path: str | Path) -> FleetFile:
    p = Path(path)
    if not p.is_file():
        raise ConfigError([ConfigProblem(str(p), None, "no such fleet file: give --fleet FILE (hosts: name, url)")])
    fleet, _node = validate_yaml(p.parent, p, FleetFile, "a fleet file")
    return fleet
