"""The promotion gate: kept qualification evidence judged against a gates mapping, as a pure function.

``evaluate(records, recipe_hash, gates)`` takes the evidence records of one recipe (``reconciler.store.evidence``),
the recipe's current hash and the gates (``preflight: pass``, ``ladder_tokens: N``, ``min_decode_tok_s``,
``min_prefill_tok_s``, ``max_ttft_s: {TOKENS: SECONDS}``, ``reserve_free_gib``, ``reload: proven``,
``min_spec_acceptance``, ``repeat: N``) and says which gates fail, each with its figure. Only runs of records whose
``recipe_hash`` is the current one count: an edited recipe is qualified again. The newest record of that hash is
judged; ``repeat: N`` asks for N passing runs in it.

Called by the promotion and the alias verdicts (once the manifest's aliases exist) and by ``reconciler evidence
RECIPE --report``'s decision. Imports nothing but the standard library and the base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.base.units import GIB

GATE_KEYS = (
    "preflight",
    "ladder_tokens",
    "min_decode_tok_s",
    "min_prefill_tok_s",
    "max_ttft_s",
    "reserve_free_gib",
    "reload",
    "min_spec_acceptance",
    "repeat",
)


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    failures: tuple[str, ...] = ()
    evidence: str | None = None  # the record judged (its file), None when none counts
    judged: tuple[str, ...] = field(default_factory=tuple)  # the gates looked at

    def summary(self) -> str:
        if self.passed:
            return "passes every gate"
        return "; ".join(self.failures)


def _runs(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in record.get("runs") or [] if isinstance(r, Mapping)]


def _rungs(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [x for x in run.get("ladder") or [] if isinstance(x, Mapping)]


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _gate_preflight(runs: Sequence[Mapping[str, Any]], want: object) -> list[str]:
    if want != "pass":
        return [f"preflight: {want!r} is no gate value (write preflight: pass)"]
    bad = [r for r in runs if not (r.get("preflight") or {}).get("ok")]
    return (
        [f"preflight: {len(bad)} of {len(runs)} run(s) did not pass it ({bad[0].get('why') or 'not run'})"]
        if bad
        else []
    )


def _gate_ladder_tokens(runs: Sequence[Mapping[str, Any]], want: float) -> list[str]:
    out = []
    for i, run in enumerate(runs, 1):
        reached = max((_num(x.get("prompt_tokens")) or 0 for x in _rungs(run) if not x.get("error")), default=0)
        if reached < want:
            out.append(f"ladder_tokens: run {i} reached {int(reached):,} prompt tokens; the gate is {int(want):,}")
    return out


def _gate_min(runs: Sequence[Mapping[str, Any]], key: str, gate: str, want: float) -> list[str]:
    out = []
    for i, run in enumerate(runs, 1):
        for rung in _rungs(run):
            got = _num(rung.get(key))
            if got is None:
                out.append(f"{gate}: run {i}, the {rung.get('target_tokens')} rung has no {key} figure")
            elif got < want:
                out.append(
                    f"{gate}: run {i}, the {rung.get('target_tokens')} rung measured {got:,.1f}; the gate is {want:g}"
                )
    return out


def _gate_ttft(runs: Sequence[Mapping[str, Any]], want: Mapping[Any, Any]) -> list[str]:
    out = []
    for tokens, seconds in sorted(((int(k), float(v)) for k, v in want.items())):
        for i, run in enumerate(runs, 1):
            rung = next((x for x in _rungs(run) if x.get("target_tokens") == tokens), None)
            got = _num(rung.get("ttft_s")) if rung else None
            if got is None:
                out.append(f"max_ttft_s: run {i} has no {tokens} rung with a first-visible TTFT")
            elif got > seconds:
                out.append(f"max_ttft_s: run {i}, the {tokens} rung's TTFT was {got:.2f} s; the gate is {seconds:g} s")
    return out


def _gate_reserve(runs: Sequence[Mapping[str, Any]], want_gib: float, cards: Sequence[str]) -> list[str]:
    out = []
    for i, run in enumerate(runs, 1):
        vram = run.get("vram") or {}
        for slot in cards or sorted(vram):
            low = vram.get(slot)
            if not isinstance(low, Mapping) or _num(low.get("min_free_bytes")) is None:
                out.append(f"reserve_free_gib: {slot} was not sampled in run {i} (per-card telemetry not sampled)")
                continue
            free = float(low["min_free_bytes"])
            if free < want_gib * GIB:
                during = low.get("during") or "between steps"
                during = f"the {during.removeprefix('rung ')} rung" if during.startswith("rung ") else during
                out.append(
                    f"reserve_free_gib: {slot} had {free / GIB:.2f} GiB free at its lowest, during {during}; "
                    f"the gate is {want_gib:g}"
                )
    return out


def _gate_reload(runs: Sequence[Mapping[str, Any]], want: object) -> list[str]:
    if want != "proven":
        return [f"reload: {want!r} is no gate value (write reload: proven)"]
    out = []
    for i, run in enumerate(runs, 1):
        rel = run.get("reload")
        if not isinstance(rel, Mapping):
            out.append(f"reload: run {i} did not run the reload proof (qualify --reload)")
        elif not rel.get("proven"):
            ext, moved = rel.get("external_hits_tokens") or {}, rel.get("cpu_to_gpu_bytes") or {}
            out.append(
                f"reload: run {i} did not prove it (external hits {ext.get('before')} -> {ext.get('after')}, "
                f"CPU-to-GPU bytes {moved.get('before')} -> {moved.get('after')})"
            )
    return out


def _gate_spec(runs: Sequence[Mapping[str, Any]], want: float) -> list[str]:
    out = []
    for i, run in enumerate(runs, 1):
        spec = run.get("spec")
        drafts = _num(spec.get("draft_tokens")) if isinstance(spec, Mapping) else None
        accepted = _num(spec.get("accepted_tokens")) if isinstance(spec, Mapping) else None
        got = accepted / drafts if drafts and accepted is not None else None
        if got is None:
            out.append(f"min_spec_acceptance: run {i} has no speculative decoding counters (not exported)")
        elif got < want:
            out.append(f"min_spec_acceptance: run {i} accepted {got:.1%} of draft tokens; the gate is {want:.1%}")
    return out


def _gate_repeat(runs: Sequence[Mapping[str, Any]], want: int) -> list[str]:
    passing = sum(1 for r in runs if r.get("status") == "passed")
    return [f"repeat: {passing} passing run(s) of this hash; the gate is {want}"] if passing < want else []


# How each gate of GATE_KEYS judges a record: (its runs, the gate's value, its cards' slots) -> the gate's failures.
_Judge = Callable[[Sequence[Mapping[str, Any]], Any, Sequence[str]], list[str]]
_GATES: Mapping[str, _Judge] = {
    "preflight": lambda runs, want, _cards: _gate_preflight(runs, want),
    "ladder_tokens": lambda runs, want, _cards: _gate_ladder_tokens(runs, float(want)),
    "min_decode_tok_s": lambda runs, want, _cards: _gate_min(runs, "decode_tok_s", "min_decode_tok_s", float(want)),
    "min_prefill_tok_s": lambda runs, want, _cards: _gate_min(runs, "prefill_tok_s", "min_prefill_tok_s", float(want)),
    "max_ttft_s": lambda runs, want, _cards: _gate_ttft(runs, want if isinstance(want, Mapping) else {}),
    "reserve_free_gib": lambda runs, want, cards: _gate_reserve(runs, float(want), cards),
    "reload": lambda runs, want, _cards: _gate_reload(runs, want),
    "min_spec_acceptance": lambda runs, want, _cards: _gate_spec(runs, float(want)),
    "repeat": lambda runs, want, _cards: _gate_repeat(runs, int(want)),
}


def _no_evidence(records: Sequence[Mapping[str, Any]], recipe_hash: str) -> str:
    """Why no record counts: none of this hash, and which hashes the records kept are of (an earlier recipe)."""
    others = sorted({str(r.get("recipe_hash")) for r in records if r.get("recipe_hash")})
    why = f"no evidence for recipe hash {recipe_hash}"
    if others:
        why += f" (evidence of {', '.join(others)} does not count: the recipe changed since; qualify it again)"
    return why


def evaluate(records: Sequence[Mapping[str, Any]], recipe_hash: str, gates: Mapping[str, Any]) -> GateVerdict:
    """The newest record of ``recipe_hash`` judged against ``gates``; every failed gate named with its figure."""
    unknown = sorted(set(gates) - set(GATE_KEYS))
    if unknown:
        return GateVerdict(False, tuple(f"{k}: no such gate (known: {', '.join(GATE_KEYS)})" for k in unknown))
    mine = [r for r in records if r.get("recipe_hash") == recipe_hash and not r.get("unreadable")]
    if not mine:
        return GateVerdict(False, (_no_evidence(records, recipe_hash),))
    record = max(mine, key=lambda r: float(r.get("started") or 0))
    runs = _runs(record)
    failures: list[str] = []
    failed_runs = [r for r in runs if r.get("status") != "passed"]
    if failed_runs or not runs:
        cause = str(failed_runs[0].get("why")) if failed_runs else "no run"
        failures.append(f"runs: {len(failed_runs)} of {len(runs)} run(s) failed ({cause})")
    cards = [str(c.get("slot")) for c in record.get("cards") or [] if isinstance(c, Mapping)]
    for key, want in gates.items():
        failures += _GATES[key](runs, want, cards)
    return GateVerdict(not failures, tuple(failures), str(record.get("file") or record.get("date")), tuple(gates))
