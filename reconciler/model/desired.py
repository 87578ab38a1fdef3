"""The desired state the planner consumes: the validated files, each assignment as a recipe on an ordered tuple of
GPU slots with its hash and offload size, and the names an assignment's container goes by.

Built by ``reconciler.load.desired``; read by the planner, the apply layer, the loop and the service.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from reconciler.model.door import AliasSpec, DemandSpec
from reconciler.model.host import HostConfig
from reconciler.model.recipe import Recipe


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
    # The digest of each "${NAME}" value the recipes take, keyed by the install's own key (never the value, nor a
    # plain digest of it): it goes into the spec hash, which is a label anyone who inspects the container reads.
    secret_digests: Mapping[str, str] = field(default_factory=dict)
    # The plain sha256 of each: only to recognise a lane labelled by an earlier version (the planner accepts either,
    # so an upgrade recreates nothing); never written anywhere.
    legacy_secret_digests: Mapping[str, str] = field(default_factory=dict)
    # The manifest's ``fallback``: whether a held lane's slots serve the last converged topology meanwhile.
    fallback: bool = True
    # The manifest's named topology that runs (None: its assignments: are the one unnamed topology), and every named
    # one, each validated as the running one is; ``assignments`` are the running one's.
    topology: str | None = None
    topologies: Mapping[str, tuple[DesiredAssignment, ...]] = field(default_factory=dict)
    # The manifest's ``standby:`` topologies, and their lanes the running topology does not have (each once, in the
    # manifest's order): kept asleep beside the running ones (docs/design.md, sleeping lanes).
    standby_topologies: tuple[str, ...] = ()
    standby: tuple[DesiredAssignment, ...] = ()
    # The commit of the host's git source these manifests and recipes were read from (None: this root's own files).
    source_commit: str | None = None
    # The manifest's ``aliases:`` (each in its long form) and ``demand:``: what the front door routes and may switch.
    aliases: Mapping[str, AliasSpec] = field(default_factory=dict)
    demand: DemandSpec | None = None

    def sleeps(self, recipe: str | None) -> bool:
        """Whether a recipe's lanes have vLLM's sleep mode ([sleep])."""
        r = self.recipes.get(recipe or "")
        return r is not None and r.sleep is not None

    def slot_owner(self) -> dict[str, DesiredAssignment]:
        return {slot: a for a in self.assignments for slot in a.slots}

    def reserve_policy(self, recipe: str | None) -> str:
        """``report`` or ``enforce``: the recipe's own ``gpu_reserve.policy``, else the host's."""
        r = self.recipes.get(recipe or "")
        if r is not None and r.gpu_reserve.policy is not None:
            return r.gpu_reserve.policy
        return self.host.gpu_reserve.policy
