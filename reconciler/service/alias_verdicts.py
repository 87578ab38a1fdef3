"""Each alias of the manifest, the recipe it names and the verdict of that recipe's kept evidence against the
alias's gates, as ``plan``, ``status`` (text and ``--json``) and the page show it: ``promoted`` (the newest record of
the recipe's current hash passes every gate), ``challenger, no promotion: GATE, ...`` (it fails the gates named), or
``not qualified`` (no record of the current hash: never qualified, or edited since).

Read-only: the evidence kept under the state directory (``store.evidence``), judged by ``plan.gates.evaluate``.
Called by ``service.planning``, ``service.status`` and ``service.promote``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reconciler.plan.gates import GATE_KEYS, GateVerdict, evaluate
from reconciler.store.evidence import records

if TYPE_CHECKING:
    from reconciler.model import DesiredState

PROMOTED, NOT_QUALIFIED, CHALLENGER = "promoted", "not qualified", "challenger, no promotion"


def judge(desired: DesiredState, recipe: str, gates: dict[str, Any]) -> tuple[GateVerdict, bool]:
    """The verdict of ``recipe``'s evidence against ``gates``, and whether any record of its current hash is kept."""
    r = desired.recipes.get(recipe)
    if r is None:
        return GateVerdict(False, (f"no recipe {recipe!r}",)), False
    recipe_hash = r.content_hash()
    kept = records(desired.host.name, recipe)
    qualified = any(x.get("recipe_hash") == recipe_hash and not x.get("unreadable") for x in kept)
    return evaluate(kept, recipe_hash, gates), qualified


def _failed_gates(verdict: GateVerdict) -> list[str]:
    named = [f.split(":", 1)[0] for f in verdict.failures]
    out = list(dict.fromkeys(n if n in GATE_KEYS else "runs" for n in named))
    return out or ["runs"]


def alias_verdicts(desired: DesiredState) -> list[dict[str, Any]]:
    """One entry per alias, in the manifest's order: ``alias``, ``recipe``, ``verdict``, ``gates``, ``failures`` (each
    failed gate with its figure) and ``evidence`` (the record judged)."""
    out = []
    for alias, spec in desired.aliases.items():
        try:
            verdict, qualified = judge(desired, spec.recipe, dict(spec.gates))
        except Exception as exc:  # noqa: BLE001 - an unreadable evidence directory is said, never a failed status
            verdict, qualified = GateVerdict(False, (f"evidence unreadable: {exc}",)), False
        if verdict.passed:
            word = PROMOTED
        elif not qualified:
            word = NOT_QUALIFIED
        else:
            word = f"{CHALLENGER}: {', '.join(_failed_gates(verdict))}"
        out.append(
            {
                "alias": alias,
                "recipe": spec.recipe,
                "verdict": word,
                "gates": dict(spec.gates),
                "failures": list(verdict.failures),
                "evidence": verdict.evidence if qualified else None,
            }
        )
    return out
