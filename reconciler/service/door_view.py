"""The host as the front door (``reconciler door``) sees it: which lane serves which model name, and what each lane
is doing now, read without changing anything.

Each view loads the desired state as every command does (the root's files, or the commit in use of the git source:
so a switch is seen the moment the manifest says it) and asks each lane of every topology, on loopback, its health
and whether it sleeps (``HostIO.lanes``: the same reads the loop makes). The door holds, routes or refuses by the
states this gives; it writes nothing to the host except through the service's own calls (a demand switch is
``HostService.switch``, audited with the door as its caller).

States of a lane (docs/design.md, the front door): ``serving`` (its topology runs, healthy and awake), ``entering``
(its topology runs, not healthy yet), ``waking`` (its topology runs, still asleep), ``leaving`` (awake and healthy but
its topology no longer runs: it is about to sleep or leave; or a leave or a sleep of it has begun its drain, whoever
runs it, published through ``HostIO.lanes.taking_down``: a lane replaced in place or moved to other slots), ``asleep`` (on standby, asleep), ``standby`` (on standby,
not asleep yet or not answering), ``not-in-topology`` (no topology that runs or stands by has it), ``blocked`` (the
loop's last pass was blocked while its topology runs and it does not serve).

Called by ``reconciler.door`` (``door_view``, with its service's ``CallContext``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reconciler.apply.host_io import REAL_IO  # the door alone imports this module, and it reads the host
from reconciler.base.errors import ConfigError
from reconciler.model import DesiredAssignment, DesiredState, served_names
from reconciler.store.loop_state import read_loop_state

if TYPE_CHECKING:
    from reconciler.apply.host_io import HostIO
    from reconciler.service.context import CallContext

# States in which a request is held until the lane serves (else answered at once).
HOLDABLE = frozenset({"entering", "waking", "leaving", "asleep", "standby"})


@dataclass(frozen=True)
class LaneState:
    recipe: str
    state: str
    origin: str | None  # scheme://host:port of its OpenAI API (its health URL's origin); None: not known
    names: tuple[str, ...]  # the names its server answers to (the first is sent for an alias)
    topologies: tuple[str, ...]  # the named topologies that run it ("" for the one unnamed topology)
    why: str = ""


@dataclass(frozen=True)
class DoorView:
    """One look at the host for the door."""

    host: str
    topology: str | None
    lanes: Mapping[str, LaneState]
    names: Mapping[str, str]  # model name or alias -> recipe
    aliases: Mapping[str, str]  # alias -> recipe
    desired: DesiredState | None = None
    error: str = ""  # the files do not load (the last good view is kept by the door)
    blocked: str = ""  # the loop's last pass was blocked: its message
    # The topology the loop's last pass was made under, as the loop recorded it; ``pass_known`` False: a loop that
    # records none (the pass is then taken for the running topology's).
    pass_topology: str | None = None
    pass_known: bool = False
    extra: Mapping[str, object] = field(default_factory=dict)

    def recipe_of(self, name: str) -> str | None:
        return self.names.get(name)


def door_view(ctx: CallContext) -> DoorView:
    """What the door needs to know now, through its service's context (a ``ConfigError`` when the files do not
    load)."""
    desired = ctx.desired()
    io = ctx.io if ctx.io is not None else _real_io()
    loop = read_loop_state(desired.host.name) or {}
    last = loop.get("last_pass")
    blocked = (
        str(last.get("message") or "blocked") if isinstance(last, dict) and last.get("result") == "blocked" else ""
    )
    view = build_view(desired, io, blocked=blocked, leaving=io.lanes.taken_down(desired.host.name))
    if isinstance(last, dict) and "topology" in last:
        return dataclasses.replace(view, pass_topology=last["topology"], pass_known=True)
    return view


def _real_io() -> HostIO:
    return REAL_IO


def build_view(
    desired: DesiredState, io: HostIO, *, blocked: str = "", leaving: frozenset[str] = frozenset()
) -> DoorView:
    running = {a.recipe for a in desired.assignments}
    standby = {a.recipe for a in desired.standby}
    where: dict[str, list[str]] = {}
    every: dict[str, tuple[DesiredAssignment, ...]] = dict(desired.topologies) or {"": desired.assignments}
    for name, items in every.items():
        for a in items:
            where.setdefault(a.recipe, []).append(name)
    lanes: dict[str, LaneState] = {}
    names: dict[str, str] = {}
    for recipe_name in sorted(where):
        recipe = desired.recipes.get(recipe_name)
        if recipe is None:
            continue
        served = served_names(recipe)
        origin = recipe.api_origin()
        state, why = _state(recipe_name, origin, recipe.health.url, recipe.sleep_origin(), running, standby, io)
        if state != "serving" and recipe_name in running and blocked:
            state, why = "blocked", blocked
        elif state == "serving" and recipe_name in leaving:
            state, why = "leaving", "it is being taken down now (replaced, or moved to other slots)"
        lanes[recipe_name] = LaneState(recipe_name, state, origin, served, tuple(where[recipe_name]), why)
        for n in served:
            # Two topologies may each serve a name by another recipe: the running one's lane answers it.
            if n not in names or recipe_name in running:
                names[n] = recipe_name
    aliases = {alias: spec.recipe for alias, spec in desired.aliases.items() if spec.recipe in lanes}
    names.update(aliases)
    return DoorView(
        host=desired.host.name,
        topology=desired.topology,
        lanes=lanes,
        names=names,
        aliases=aliases,
        desired=desired,
        blocked=blocked,
    )


def _state(
    recipe: str,
    origin: str | None,
    health_url: str | None,
    sleep_origin: str | None,
    running: set[str],
    standby: set[str],
    io: HostIO,
) -> tuple[str, str]:
    if recipe not in running and recipe not in standby:
        if health_url is not None and io.lanes.health_ok(health_url):
            return "leaving", "its topology no longer runs: it is about to leave"
        return "not-in-topology", "no topology that runs or stands by has it"
    if origin is None or health_url is None:
        return ("serving" if recipe in running else "standby"), "no health URL: taken as it is"
    healthy = io.lanes.health_ok(health_url)
    sleeping = io.lanes.is_sleeping(sleep_origin) if sleep_origin and healthy else False
    asleep = sleeping is True
    if recipe in running:
        if not healthy:
            return "entering", "not healthy yet"
        if asleep or isinstance(sleeping, str):
            return "waking", "asleep: its topology runs, the loop wakes it"
        return "serving", ""
    if healthy and not asleep and not isinstance(sleeping, str):
        return "leaving", "its topology is on standby: it is about to sleep"
    return ("asleep", "asleep on standby") if asleep else ("standby", "on standby, not answering yet")


def load_error_view(exc: ConfigError) -> str:
    return "; ".join(str(p) for p in exc.problems[:3])
