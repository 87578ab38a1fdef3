"""``reconciler promote ALIAS RECIPE`` (and ``POST /v1/promote``, MCP ``host_manage`` action ``promote``, which
stand on it): the recipe an alias of the manifest's ``aliases:`` names set to RECIPE, as ``switch`` sets the
topology (every other byte kept, ``load.alias_edit``; atomic, with the file's mode and owner; under the lock of the
host's manifest edits; refused when the file changed since it was read), only when the kept evidence for RECIPE's
current hash passes every gate of the alias (its long form's ``gates:``, judged by ``plan.gates.evaluate``).
Otherwise refused, naming each failed gate with its figure. Evidence of another hash never counts. Audited with its
caller and the evidence it rested on (or why it was refused). It changes the desired state only: the loop (or the
next ``apply``, or ``--wait``) converges it.

Called by ``reconciler.service.host_service.HostService.promote``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.base.fsafe import read_trusted, write_atomic
from reconciler.base.suggest import did_you_mean
from reconciler.load.alias_edit import AliasEditError, alias_recipe_of, set_alias_recipe
from reconciler.plan.gates import evaluate
from reconciler.store.evidence import records
from reconciler.store.lock import manifest_edit_lock

if TYPE_CHECKING:
    from reconciler.model import DesiredState
    from reconciler.service.host_service import HostService


class PromoteRefused(ReconcilerError):
    """The promotion was refused before the manifest was written: nothing changed."""

    code = "promote_refused"


@dataclass(frozen=True)
class PromoteResult:
    host: str
    manifest: str
    alias: str
    before: str
    after: str
    recipe_hash: str
    evidence: str | None
    gates: dict[str, Any]

    @property
    def changed(self) -> bool:
        return self.before != self.after

    @property
    def exit_code(self) -> int:
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "manifest": self.manifest,
            "alias": self.alias,
            "from": self.before,
            "recipe": self.after,
            "changed": self.changed,
            "recipe_hash": self.recipe_hash,
            "evidence": self.evidence,
            "gates": self.gates,
        }


def runs_somewhere(desired: DesiredState, recipe: str) -> bool:
    """Whether a topology (or the assignments) of the manifest runs ``recipe``: an alias must name one."""
    lanes = [a for group in desired.topologies.values() for a in group] + list(desired.assignments)
    return any(a.recipe == recipe for a in lanes)


def promote_alias(service: HostService, alias: str, recipe: str) -> PromoteResult:
    desired = service.desired()  # the files as they are must validate: a promotion never writes over a broken root
    host = desired.host.name

    def refused(why: str) -> PromoteRefused:
        service.record_refusal("promote", f"alias {alias} -> {recipe}: {why}", host=host)
        return PromoteRefused(f"promote {alias!r} to {recipe!r} refused: {why}; nothing changed")

    if desired.host.source is not None:
        raise refused(
            f"the manifest comes from the git source {desired.host.source.git} ({desired.host.source.ref}): promote "
            f"there, by a commit that sets aliases.{alias}'s recipe to {recipe}"
        )
    spec = desired.aliases.get(alias)
    if spec is None or desired.manifest_path is None:
        raise refused(
            f"{alias!r} is no alias of the manifest: " + did_you_mean(alias, desired.aliases, what="its aliases")
        )
    r = desired.recipes.get(recipe)
    if r is None:
        raise refused(
            f"no recipe {recipe!r} in configs/recipes/: " + did_you_mean(recipe, desired.recipes, what="its recipes")
        )
    if not runs_somewhere(desired, recipe):
        raise refused(f"no topology of the manifest runs {recipe!r}: add it to one first, so the alias can be served")
    recipe_hash = r.content_hash()
    verdict = evaluate(records(host, recipe), recipe_hash, spec.gates)
    if not verdict.passed:
        raise refused("challenger, no promotion: " + "; ".join(verdict.failures))
    path = Path(service.root) / desired.manifest_path
    read = read_trusted(path, what="the manifest")
    changed = f"{desired.manifest_path} changed while the promotion read it: run the promotion again"
    try:
        text = read.decode("utf-8")
        before = alias_recipe_of(text, alias)
        if before != spec.recipe:
            raise refused(changed)  # another edit (or a hand) wrote after it was validated
        if before == recipe:
            return PromoteResult(host, desired.manifest_path, alias, recipe, recipe, recipe_hash, verdict.evidence, {})
        edited = set_alias_recipe(text, alias, recipe)
    except (AliasEditError, UnicodeDecodeError) as exc:
        raise refused(f"{desired.manifest_path}: {exc}") from None
    try:
        with manifest_edit_lock(host):
            # Under the lock: the file holds exactly the bytes the edit was made from, or another edit came first.
            if read_trusted(path, what="the manifest") != read:
                raise refused(changed)
            st = os.stat(path)
            write_atomic(path, edited, mode=st.st_mode & 0o777)
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                os.chown(path, st.st_uid, st.st_gid)  # the operator's file stays the operator's
            service.record(
                "promote",
                target=alias,
                outcome="ok",
                reason=f"alias {alias}: {before} -> {recipe}; {verdict.summary()}",
                manifest=desired.manifest_path,
                recipe_hash=recipe_hash,
                evidence=verdict.evidence,
                gates=dict(spec.gates),
            )
    except TimeoutError as exc:
        raise refused(f"{exc}: run the promotion again") from None
    return PromoteResult(
        host, desired.manifest_path, alias, str(before), recipe, recipe_hash, verdict.evidence, dict(spec.gates)
    )
