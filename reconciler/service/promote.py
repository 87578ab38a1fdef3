"""``reconciler promote ALIAS RECIPE`` (and ``POST /v1/promote``, MCP ``host_manage`` action ``promote``, which
stand on it): the recipe an alias of the manifest's ``aliases:`` names set to RECIPE, as ``switch`` sets the
topology (every other byte kept, ``load.alias_edit``; in the one frame of the manifest's edits,
``service.manifest_edit``: atomic, with the file's mode and owner, under the lock of the host's manifest edits,
refused when the file changed since it was read), only when the kept evidence for RECIPE's
current hash passes every gate of the alias (its long form's ``gates:``, judged by ``plan.gates.evaluate``).
Otherwise refused, naming each failed gate with its figure. Evidence of another hash never counts. Audited with its
caller and the evidence it rested on (or why it was refused). It changes the desired state only: the loop (or the
next ``apply``, or ``--wait``) converges it.

Called by ``reconciler.service.host_service.HostService.promote``, with its ``CallContext``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.base.suggest import did_you_mean
from reconciler.load.alias_edit import AliasEditError, alias_recipe_of, set_alias_recipe
from reconciler.plan.gates import evaluate
from reconciler.service.manifest_edit import edit_manifest
from reconciler.store.evidence import records

if TYPE_CHECKING:
    from reconciler.model import DesiredState
    from reconciler.service.context import CallContext


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


def promote_alias(ctx: CallContext, alias: str, recipe: str) -> PromoteResult:
    desired = ctx.desired()  # the files as they are must validate: a promotion never writes over a broken root
    host = desired.host.name

    def refused(why: str) -> PromoteRefused:
        ctx.record_refusal("promote", f"alias {alias} -> {recipe}: {why}", host=host)
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
    manifest = desired.manifest_path

    def done(before: str | None) -> None:
        ctx.record(
            host,
            "promote",
            target=alias,
            outcome="ok",
            reason=f"alias {alias}: {before} -> {recipe}; {verdict.summary()}",
            manifest=manifest,
            recipe_hash=recipe_hash,
            evidence=verdict.evidence,
            gates=dict(spec.gates),
        )

    before = edit_manifest(
        ctx,
        host,
        manifest,
        value_of=lambda text: alias_recipe_of(text, alias),
        validated=spec.recipe,
        wanted=recipe,
        edit=lambda text: set_alias_recipe(text, alias, recipe),
        errors=(AliasEditError,),
        refused=refused,
        name="promotion",
        done=done,
    )
    if before == recipe:
        return PromoteResult(host, manifest, alias, recipe, recipe, recipe_hash, verdict.evidence, {})
    return PromoteResult(host, manifest, alias, str(before), recipe, recipe_hash, verdict.evidence, dict(spec.gates))
