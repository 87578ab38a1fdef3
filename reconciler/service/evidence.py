"""``reconciler evidence [RECIPE] [--json] [--report]``: the kept qualification records, listed, or the newest of a
recipe rendered as Markdown in the field report's shape: the identity table, the functional results, the ladder
table, the reload proof, the decision against the gates, the caveats.

Called by ``reconciler.service.host_service.HostService.evidence``; the rendering (``render_report``) is pure and
tested against the record it renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.plan.gates import evaluate
from reconciler.store.evidence import records

if TYPE_CHECKING:
    from reconciler.model import DesiredState

LADDER_HEAD = ("Target", "Actual prompt", "Cached", "TTFO", "First-visible TTFT", "Effective prefill", "Decode", "E2E")


@dataclass(frozen=True)
class EvidenceResult:
    host: str
    recipe: str | None
    records: list[dict[str, Any]]
    current_hashes: dict[str, str]

    exit_code = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "recipe": self.recipe,
            "records": [
                {**r, "current": r.get("recipe_hash") == self.current_hashes.get(str(r.get("recipe")))}
                for r in self.records
            ],
        }


def list_evidence(desired: DesiredState, recipe: str | None) -> EvidenceResult:
    """The kept records of ``desired``'s host (of ``recipe``, or all), each marked whether it is of its recipe's
    current hash."""
    hashes = {name: r.content_hash() for name, r in desired.recipes.items()}
    return EvidenceResult(desired.host.name, recipe, records(desired.host.name, recipe), hashes)


def _n(x: object) -> str:
    return f"{int(x):,}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "not reported"


def _s(x: object, unit: str = " s", digits: int = 2) -> str:
    return f"{float(x):,.{digits}f}{unit}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "—"


def _k(tokens: object) -> str:
    return f"{int(tokens) // 1000}K" if isinstance(tokens, int) and tokens % 1000 == 0 else _n(tokens)


def _ratio(spec: Mapping[str, Any]) -> str:
    drafts, accepted = spec.get("draft_tokens"), spec.get("accepted_tokens")
    return f"{accepted / drafts:.1%}" if isinstance(drafts, int) and isinstance(accepted, int) and drafts else "—"


def ladder_rows(run: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The ladder table's rows, each figure as the report writes it."""
    return [
        (
            _k(x.get("target_tokens")),
            _n(x.get("prompt_tokens")),
            _n(x.get("cached_tokens")),
            _s(x.get("ttfo_s")),
            _s(x.get("ttft_s")),
            _s(x.get("prefill_tok_s"), " tok/s", 0),
            _s(x.get("decode_tok_s"), " tok/s", 1),
            _s(x.get("e2e_s")),
        )
        for x in run.get("ladder") or []
    ]


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---" for _ in head) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _reload_lines(rel: Mapping[str, Any] | None) -> list[str]:
    if not rel:
        return ["Not run (`reconciler qualify RECIPE --reload`)."]

    def pair(key: str) -> str:
        p = rel.get(key)
        return "not exported" if not isinstance(p, Mapping) else f"{_n(p.get('before'))} -> {_n(p.get('after'))}"

    replay = rel.get("replay") or {}
    seconds = rel.get("cpu_to_gpu_seconds")
    took = ""
    if isinstance(seconds, Mapping) and isinstance(seconds.get("after"), (int, float)):
        took = f" in {float(seconds['after']) - float(seconds.get('before') or 0):.3f} s"
    return [
        f"{len(rel.get('eviction_prompts') or [])} distinct {_n(rel.get('tokens'))}-token prompts after request zero: "
        f"{rel.get('evicted_because')}.",
        "",
        *_table(
            ("Counter", "Before replay", "After replay"),
            [
                (name, *(pair(key).split(" -> ") if " -> " in pair(key) else (pair(key), pair(key))))
                for name, key in (
                    ("Prefix queries (tokens)", "prefix_queries_tokens"),
                    ("GPU prefix hits (tokens)", "gpu_prefix_hits_tokens"),
                    ("External hits (tokens)", "external_hits_tokens"),
                    ("CPU-to-GPU bytes", "cpu_to_gpu_bytes"),
                )
            ],
        ),
        "",
        f"Replay: {_n(replay.get('prompt_tokens'))} prompt tokens, {_n(replay.get('cached_tokens'))} cached, "
        f"TTFO {_s(replay.get('ttfo_s'), ' s', 3)}, first-visible TTFT {_s(replay.get('ttft_s'), ' s', 3)}, "
        f"E2E {_s(replay.get('e2e_s'), ' s', 3)}; CPU-to-GPU transfer {pair('cpu_to_gpu_bytes')} bytes{took}.",
        f"Verdict: {'proven' if rel.get('proven') else 'not proven'} (external hits and CPU-to-GPU bytes must rise "
        "while GPU prefix hits stay).",
    ]


def render_report(record: Mapping[str, Any], *, current_hash: str | None, gates: Mapping[str, Any] | None) -> str:
    """One record as Markdown in the report's shape."""
    runs = list(record.get("runs") or [])
    lines = [
        f"# {record.get('recipe')} qualification",
        "",
        f"Capture date: {record.get('date')}  ",
        f"Status: {record.get('status')}  ",
        f"Host: {record.get('host')} ({record.get('machine')}), cards: "
        + ", ".join(
            f"{c.get('slot')} (uuid {c.get('uuid') or '—'}, index {c.get('index')})" for c in record.get("cards") or []
        ),
        "",
        "## Immutable identity",
        "",
        *_table(
            ("Component", "Pinned value"),
            [
                ("Recipe", str(record.get("recipe"))),
                (
                    "Recipe hash",
                    str(record.get("recipe_hash"))
                    + ("" if record.get("recipe_hash") == current_hash else " (not the recipe's current hash)"),
                ),
                ("Model", str(record.get("model"))),
                ("Model revision", str(record.get("revision") or "not pinned")),
                ("Image", str(record.get("image"))),
                ("Image digest", str(record.get("image_digest") or "unknown")),
                ("reconciler", str(record.get("reconciler_version"))),
            ],
        ),
        "",
        "## Functional results",
        "",
    ]
    for i, run in enumerate(runs, 1):
        pre = run.get("preflight") or {}
        probes = pre.get("probes") or []
        passed = sum(1 for p in probes if p.get("ok"))
        lines.append(
            f"- Run {i}: {run.get('status')}; preflight {passed}/{pre.get('planned', len(probes))} probe(s) passed"
            + (f" ({', '.join(p.get('name', '') for p in probes)})" if probes else "")
            + (f"; why: {run.get('why')}" if run.get("why") else "")
        )
    for i, run in enumerate(runs, 1):
        lines += ["", f"## Context ladder, run {i}", "", *_table(LADDER_HEAD, ladder_rows(run))]
        spec = run.get("spec")
        if isinstance(spec, Mapping):
            lines += [
                "",
                f"Speculative decoding accepted {_n(spec.get('accepted_tokens'))} of {_n(spec.get('draft_tokens'))} "
                f"draft tokens ({_ratio(spec)}).",
            ]
        vram = run.get("vram") or {}
        for slot, low in sorted(vram.items()):
            lines.append(
                f"- {slot}: {float(low['min_free_bytes']) / (1 << 30):.2f} GiB free at its lowest, during "
                f"{low.get('during') or 'between steps'}; reserve {float(low['reserve_bytes']) / (1 << 30):.2f} GiB"
                + (" (below it)" if low.get("below_reserve") else "")
            )
        lines += ["", f"## Reload proof, run {i}", "", *_reload_lines(run.get("reload"))]
    lines += ["", "## Decision against the gates", ""]
    if not gates:
        lines.append("No gates given: no decision.")
    else:
        verdict = evaluate([record], str(current_hash), gates)
        lines.append("passes every gate: promotion allowed" if verdict.passed else "challenger, no promotion:")
        lines += [f"- {f}" for f in verdict.failures]
    lines += ["", "## Caveats", "", *[f"- {c}" for c in record.get("caveats") or []]]
    return "\n".join(lines) + "\n"
