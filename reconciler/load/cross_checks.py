"""The files read against each other: a recipe's offload against shm.dir, the manifests against the host file, and
the host's manifest against the recipes, the GPU slots, the host's network and the tmpfs's room.

Called by ``reconciler.load.desired``; each check adds its problems to the list it is given, in file order.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from reconciler.base.errors import ConfigProblem
from reconciler.base.suggest import closest
from reconciler.base.units import human_bytes
from reconciler.load.files import HOST_FILE, RECIPES_DIR
from reconciler.load.problems import short
from reconciler.load.recipes import host_ports, recipe_file, recipe_line
from reconciler.load.tmpfs import REAL_TMPFS, TmpfsReads
from reconciler.load.yaml_source import yaml_line
from reconciler.model import (
    SLEEP_DEV_ENV,
    SLEEP_MODE_FLAG,
    AssignmentSpec,
    DesiredAssignment,
    HostConfig,
    Manifest,
    Recipe,
    offload_lands_in,
)


def offload_placement(root: Path, host: HostConfig, recipes: dict[str, Recipe], problems: list[ConfigProblem]) -> None:
    """Each recipe with offload enabled must put its offload files in shm.dir, where they are counted and guarded."""
    for name, recipe in sorted(recipes.items()):
        if recipe.offload.enabled and not offload_lands_in(recipe.container, host.shm.dir):
            problems.append(
                ConfigProblem(
                    recipe_file(name),
                    recipe_line(root, name, ("container", "volumes")),
                    f"recipe {name!r} has offload enabled, but its offload files would not land in shm.dir "
                    f"{host.shm.dir} ({HOST_FILE}), where they are counted and guarded: "
                    + (
                        'set ipc = "host" (the container then shares the host\'s /dev/shm)'
                        if host.shm.dir == "/dev/shm"
                        else f'add "{host.shm.dir}:{host.shm.dir}" to container.volumes and point the server\'s '
                        "offload directory at it"
                    ),
                )
            )


def manifests_of_host(
    host: HostConfig, manifests: list[tuple[str, Manifest, yaml.Node | None]], problems: list[ConfigProblem]
) -> list[tuple[str, Manifest, yaml.Node | None]]:
    """The manifests written for this host (one, when nothing is wrong); a problem for each manifest of another host
    and for a second one of this host."""
    mine = [(p, m, n) for p, m, n in manifests if m.host == host.name]
    for p, m, n in manifests:
        if m.host != host.name:
            problems.append(
                ConfigProblem(
                    p,
                    yaml_line(n, ("host",)),
                    f"host: manifest is for host {short(m.host)} but {HOST_FILE} names this host {host.name!r}. "
                    "Fix the name, or keep other hosts' manifests out of this root",
                )
            )
    if len(mine) > 1:
        problems.append(
            ConfigProblem(
                mine[1][0],
                yaml_line(mine[1][2], ("host",)),
                f"host: a second manifest for host {host.name!r} (the first is {mine[0][0]}); keep one document per host",
            )
        )
    return mine


def _check_slots(
    path: str,
    a: AssignmentSpec,
    i: int,
    topology: str | None,
    node: yaml.Node | None,
    host: HostConfig,
    given: dict[str, int],
    problems: list[ConfigProblem],
) -> None:
    """Each slot of assignment ``i`` is the host's and given to no other assignment of its topology."""
    label, at = _where(topology, i)
    for slot in a.gpus:
        if slot not in host.gpus:
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, (*at, "gpus")),
                    f"{label}.gpus: unknown GPU slot {short(slot)}; "
                    + (f"did you mean {guess}? " if (guess := closest(slot, host.gpus)) else "")
                    + f"slots of host {host.name!r}: "
                    f"{', '.join(host.gpus)} (defined under gpus: in {HOST_FILE})",
                )
            )
        elif slot in given and given[slot] != i:
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, (*at, "gpus")),
                    f"{label}.gpus: GPU slot {slot!r} is already given to {_where(topology, given[slot])[0]}; "
                    "a slot runs one recipe at a time. Remove it from one of them",
                )
            )
        else:
            given[slot] = i


def _where(topology: str | None, i: int) -> tuple[str, tuple[str | int, ...]]:
    """How a problem names assignment ``i`` of a topology, and its YAML path."""
    if topology is None:
        return f"assignments[{i}]", ("assignments", i)
    return f"topologies.{topology}[{i}]", ("topologies", topology, i)


def _port_clashes(
    path: str,
    items: list[AssignmentSpec],
    topology: str | None,
    node: yaml.Node | None,
    recipes: dict[str, Recipe],
    problems: list[ConfigProblem],
) -> None:
    """Two lanes of one manifest on the host's network that listen on (or are asked at) one port: the second
    cannot bind it, or its health check and probes would be answered by the first."""
    taken: dict[int, tuple[int, str, str]] = {}  # port -> (assignment, recipe, where its recipe says it)
    for i, a in enumerate(items):
        label, at = _where(topology, i)
        recipe = recipes.get(a.recipe)
        if recipe is None:
            continue
        mine: dict[int, str] = {}
        for port, where in host_ports(recipe):
            mine.setdefault(port, where)
        for port, where in mine.items():
            if port not in taken:
                taken[port] = (i, a.recipe, where)
                continue
            j, other, other_where = taken[port]
            fix = (
                "Give one recipe another port (its --port, health.url and probes), or a network other than host"
                if other != a.recipe
                else "A recipe on the host's network runs once at a time: give the second assignment a copy of the "
                "recipe with a port of its own (--port, health.url and probes), or the recipe a network other than host"
            )
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, (*at, "recipe")),
                    f"{label}.recipe: recipe {a.recipe!r} and {_where(topology, j)[0]}'s recipe {other!r} both "
                    f"listen on port {port} of the host's network ({where} in {recipe_file(a.recipe)}; {other_where} "
                    f"in {recipe_file(other)}): one of them could not bind it, or would have its health checked and "
                    f"its probes answered by the other. {fix}",
                )
            )
            break


def cross_check(
    path: str,
    manifest: Manifest,
    node: yaml.Node | None,
    host: HostConfig,
    recipes: dict[str, Recipe],
    problems: list[ConfigProblem],
    *,
    shm_size: int | None,
    shm_free: int | None = None,
    host_node: yaml.Node | None = None,
    tmpfs: TmpfsReads = REAL_TMPFS,
) -> dict[str | None, list[DesiredAssignment]]:
    """Every topology of the manifest checked against the host and the recipes (``None``: the unnamed one of
    ``assignments:``), each as the list of assignments it would run; with ``standby:``, each topology as it would run
    beside the sleeping lanes of the others."""
    out = {
        name: _check_topology(
            path,
            items,
            name,
            node,
            host,
            recipes,
            problems,
            shm_size=shm_size,
            shm_free=shm_free,
            host_node=host_node,
            tmpfs=tmpfs,
        )
        for name, items in manifest.named().items()
    }
    if manifest.standby:
        size = shm_size if shm_size is not None else tmpfs.size(host.shm.dir)
        _check_standby(path, manifest, node, host, recipes, out, problems, shm_size=size)
    return out


def _check_standby(
    path: str,
    manifest: Manifest,
    node: yaml.Node | None,
    host: HostConfig,
    recipes: dict[str, Recipe],
    topologies: dict[str | None, list[DesiredAssignment]],
    problems: list[ConfigProblem],
    *,
    shm_size: int | None,
) -> None:
    """docs/design.md, sleeping lanes: a lane of a standby topology that some other topology does not run sleeps
    while that one runs, so its recipe needs [sleep]; and whichever topology runs, it and the sleeping lanes of the
    others are on the host at once: their ports must differ and their offload files fit the tmpfs together."""
    every = set.intersection(*({a.key for a in lanes} for lanes in topologies.values()))
    for name in manifest.standby:
        for i, a in enumerate(topologies.get(name, [])):
            recipe = recipes.get(a.recipe)
            if a.key in every or recipe is None or recipe.sleep is not None:
                continue
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, ("topologies", name, i, "recipe")),
                    f"topologies.{name}[{i}].recipe: {name} is on standby, so its lane {a.key} sleeps while another "
                    f"topology runs, but recipe {a.recipe!r} has no [sleep]: add [sleep] (with {SLEEP_MODE_FLAG} and "
                    f'{SLEEP_DEV_ENV} = "1") to {recipe_file(a.recipe)}, or take {name} off standby:',
                )
            )
    said: set[str] = set()
    for running, lanes in topologies.items():
        asleep = [
            a
            for other in manifest.standby
            if other != running
            for a in topologies.get(other, [])
            if a.key not in {b.key for b in lanes}
        ]
        together = list({a.key: a for a in (*lanes, *asleep)}.values())
        for problem in _together_problems(running, together, host, recipes, shm_size):
            if problem not in said:
                said.add(problem)
                problems.append(ConfigProblem(path, yaml_line(node, ("standby",)), problem))


def _together_problems(
    running: str | None,
    lanes: list[DesiredAssignment],
    host: HostConfig,
    recipes: dict[str, Recipe],
    shm_size: int | None,
) -> list[str]:
    """What cannot be on the host at once: two lanes asked at one port, offload files beyond the tmpfs."""
    out: list[str] = []
    taken: dict[int, str] = {}
    for a in lanes:
        recipe = recipes.get(a.recipe)
        if recipe is None:
            continue
        for port in dict.fromkeys(port for port, _where in host_ports(recipe)):
            if port in taken and taken[port] != a.key:
                out.append(
                    f"standby: while {running} runs, {taken[port]} and {a.key} are both on the host (one of them "
                    f"asleep) and both listen on port {port}: give one recipe another port (its --port, health.url "
                    "and probes)"
                )
            taken.setdefault(port, a.key)
    need = sum(a.offload_bytes for a in lanes)
    reserve = host.shm.reserve_bytes
    if need and shm_size is not None and need + reserve > shm_size:
        out.append(
            f"standby: while {running} runs, its lanes and the sleeping ones keep offload files of "
            f"{human_bytes(need)} in all on {host.shm.dir} (a sleeping lane keeps its file mapped), and with "
            f"shm.reserve_gib ({human_bytes(reserve)}) that is more than the tmpfs's {human_bytes(shm_size)}: "
            "take a topology off standby, or give the tmpfs more room"
        )
    return out


def _check_topology(
    path: str,
    items: list[AssignmentSpec],
    topology: str | None,
    node: yaml.Node | None,
    host: HostConfig,
    recipes: dict[str, Recipe],
    problems: list[ConfigProblem],
    *,
    shm_size: int | None,
    shm_free: int | None = None,
    host_node: yaml.Node | None = None,
    tmpfs: TmpfsReads = REAL_TMPFS,
) -> list[DesiredAssignment]:
    out: list[DesiredAssignment] = []
    given: dict[str, int] = {}
    for i, a in enumerate(items):
        label, at = _where(topology, i)
        line = yaml_line(node, at)
        recipe = recipes.get(a.recipe)
        if recipe is None:
            guess = closest(a.recipe, recipes)
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, (*at, "recipe")),
                    f"{label}.recipe: unknown recipe {short(a.recipe)}; "
                    + (f"did you mean {guess}? " if guess else "")
                    + f"known recipes: {', '.join(sorted(recipes)) or 'none'} "
                    f"(each is a file in {RECIPES_DIR}/NAME.toml)",
                )
            )
        _check_slots(path, a, i, topology, node, host, given, problems)
        if len(set(a.gpus)) != len(a.gpus):
            problems.append(ConfigProblem(path, line, f"{label}.gpus: a slot is listed twice"))
        if recipe is not None and len(a.gpus) != recipe.tensor_parallel_size:
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, (*at, "gpus")),
                    f"{label}.gpus: recipe {a.recipe!r} ({recipe_file(a.recipe)}) has tensor_parallel_size = "
                    f"{recipe.tensor_parallel_size} and needs exactly that many GPU slots, got {len(a.gpus)}",
                )
            )
        if recipe is not None:
            out.append(
                DesiredAssignment(
                    recipe=a.recipe,
                    slots=tuple(a.gpus),
                    recipe_hash=recipe.content_hash(),
                    offload_bytes=recipe.offload.capacity_bytes,
                )
            )
    _port_clashes(path, items, topology, node, recipes, problems)
    need = sum(a.offload_bytes for a in out)
    if need:
        size = shm_size if shm_size is not None else tmpfs.size(host.shm.dir)
        free = shm_free if shm_free is not None else (None if shm_size is not None else tmpfs.free(host.shm.dir))
        reserve = host.shm.reserve_bytes
        if size is None:
            problems.append(
                ConfigProblem(
                    HOST_FILE,
                    yaml_line(host_node, ("shm", "dir")),
                    f"shm.dir: {host.shm.dir} does not exist; offload recipes need it",
                )
            )
        elif need + reserve > size:
            lanes = [a for a in out if a.offload_bytes]
            each = ", ".join(f"{a.recipe} ({human_bytes(a.offload_bytes)})" for a in lanes)
            free_now = f", {human_bytes(free)} of it free now" if free is not None else ""
            problems.append(
                ConfigProblem(
                    path,
                    yaml_line(node, ("assignments",) if topology is None else ("topologies", topology)),
                    f"{'assignments' if topology is None else f'topologies.{topology}'}: the offload lanes need more room than the tmpfs at {host.shm.dir} has: "
                    f"their capacities ({each}) add up to {human_bytes(need)}, and with shm.reserve_gib "
                    f"({human_bytes(reserve)}, kept free in {HOST_FILE}) that is {human_bytes(need + reserve)}, "
                    f"but the tmpfs is {human_bytes(size)}{free_now}. Assign fewer or smaller offload lanes "
                    f"(offload.capacity_gib in {', '.join(recipe_file(a.recipe) for a in lanes)}), lower "
                    "shm.reserve_gib, or give the tmpfs more room",
                )
            )
    return out
