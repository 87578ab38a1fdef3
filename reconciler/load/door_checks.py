"""The front door's cross-checks of a manifest: every name a client may ask for leads to one lane.

Within one topology no two recipes may serve one name (the door could not tell which lane a request is for); an alias
names a recipe that exists, and is no name some recipe's server already answers to; ``demand:`` is refused on a host
whose desired state comes from git (the door's choice of topology would have to be a commit). Called by
``reconciler.load.desired``.
"""

from __future__ import annotations

import yaml

from reconciler.base.errors import ConfigProblem
from reconciler.load.yaml_source import yaml_line
from reconciler.model import DesiredAssignment, HostConfig, Manifest, Recipe, served_names


def door_problems(
    path: str,
    manifest: Manifest,
    node: yaml.Node | None,
    host: HostConfig,
    recipes: dict[str, Recipe],
    topologies: dict[str | None, list[DesiredAssignment]],
) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for name, lanes in topologies.items():
        by_name: dict[str, str] = {}
        for a in lanes:
            recipe = recipes.get(a.recipe)
            for served in served_names(recipe) if recipe is not None else ():
                other = by_name.setdefault(served, a.recipe)
                if other != a.recipe:
                    where = f"topology {name}" if name is not None else "assignments:"
                    key = ("topologies", name) if name is not None else ("assignments",)
                    problems.append(
                        ConfigProblem(
                            path,
                            yaml_line(node, key),
                            f"{where}: recipes {other!r} and {a.recipe!r} both serve the model name {served!r}, so "
                            "the front door cannot tell which lane a request for it is for: give one of them another "
                            "--served-model-name (or [model] served_names)",
                        )
                    )
    used = {a.recipe for lanes in topologies.values() for a in lanes}
    every_served = {n: r for r in sorted(used) if r in recipes for n in served_names(recipes[r])}
    for alias, target in manifest.alias_targets().items():
        line = yaml_line(node, ("aliases", alias))
        if target.recipe not in recipes:
            problems.append(
                ConfigProblem(
                    path,
                    line,
                    f"aliases.{alias}: recipe {target.recipe!r} does not exist: add "
                    f"configs/recipes/{target.recipe}.toml or name one of {sorted(recipes)}",
                )
            )
        elif target.recipe not in used:
            problems.append(
                ConfigProblem(
                    path,
                    line,
                    f"aliases.{alias}: recipe {target.recipe!r} runs in no topology of this manifest, so nothing "
                    "could answer it: name a recipe the manifest runs",
                )
            )
        if alias in every_served:
            problems.append(
                ConfigProblem(
                    path,
                    line,
                    f"aliases.{alias}: {alias!r} is already a name recipe {every_served[alias]!r} serves: an alias "
                    "may not hide a served name; choose another alias",
                )
            )
    if manifest.demand is not None and host.source is not None:
        problems.append(
            ConfigProblem(
                path,
                yaml_line(node, ("demand",)),
                "demand: this host's desired state comes from its git source (host.yaml source:), where the running "
                "topology is a commit's and the front door may not switch it: remove demand:, or run this host from "
                "a local root",
            )
        )
    return problems
