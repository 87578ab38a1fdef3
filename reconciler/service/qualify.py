"""``reconciler qualify RECIPE``: the report's qualification as one command, against the recipe's running, awake lane
(refused otherwise, naming the switch that would run it; it never enters or switches on its own). Each run: the
recipe's preflight suite, the context ladder (one cold request per rung), with ``reload`` the offload reload proof,
speculative decoding's drafts and accepted tokens, and with NVML every card of the lane sampled throughout. The
record is kept as evidence (``reconciler.store.evidence``), a failed run too, and audited.

Called by ``reconciler.service.host_service.HostService.qualify``, with its ``CallContext``. What each figure means: docs/design.md,
"Qualification".
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler import __version__
from reconciler.apply.ladder import measured, new_seed, run_reload, run_rung
from reconciler.apply.lane_counters import source_of
from reconciler.apply.probes import run_suite
from reconciler.base.errors import ReconcilerError
from reconciler.load.recipes import served_names
from reconciler.model import DesiredState
from reconciler.observe.containers import EngineObserver
from reconciler.observe.gpu import MemoryReader
from reconciler.plan.observed import LABEL_HOST
from reconciler.plan.vram import LoadLow, VramSampler
from reconciler.store.evidence import keep

if TYPE_CHECKING:
    from reconciler.apply.host_io import HostIO
    from reconciler.service.context import CallContext

DEFAULT_LADDER = (125000, 192000, 250000)
SINGLE_REQUEST = "single-request capacity evidence, not concurrency proof"
NOT_SAMPLED = "per-card telemetry not sampled (gpu_telemetry none, or NVML failed)"


class QualifyRefused(ReconcilerError):
    """The qualification was refused before any request: the lane does not run awake, or the arguments are wrong."""

    code = "qualify_refused"


@dataclass(frozen=True)
class QualifyResult:
    record: dict[str, Any]
    path: str

    @property
    def ok(self) -> bool:
        return bool(self.record["runs"]) and all(r["status"] == "passed" for r in self.record["runs"])

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {**self.record, "file": self.path}


def _not_running(desired: DesiredState, recipe: str, why: str) -> str:
    """The refusal, naming what would run the recipe's lane."""
    named = [name for name, lanes in desired.topologies.items() if any(a.recipe == recipe for a in lanes)]
    if desired.topology in named:
        fix = "the manifest runs it already: `reconciler apply` brings it up"
    elif named:
        fix = f"`reconciler switch {named[0]}` would run it" + (
            f" (or {', '.join(named[1:])})" if len(named) > 1 else ""
        )
    elif any(a.recipe == recipe for a in desired.assignments):
        fix = "the manifest runs it already: `reconciler apply` brings it up"
    else:
        fix = "no topology of the manifest runs it: add it to one, then `reconciler switch` to it"
    return f"recipe {recipe!r} {why}; qualify never enters or switches on its own: {fix}"


def _lane(io: HostIO | None, desired: DesiredState, recipe: str) -> tuple[list[Any], str | None, EngineObserver]:
    obs = EngineObserver.for_host(desired.host)
    containers, source = obs.observe()
    if not source.ok:
        raise QualifyRefused(
            f"the engine does not answer ({source.detail}): no lane of {recipe!r} can be proven to run"
        )
    mine = [
        c
        for c in containers
        if c.recipe == recipe and c.state == "running" and not c.preserved and c.label(LABEL_HOST) == desired.host.name
    ]
    if not mine:
        raise QualifyRefused(_not_running(desired, recipe, "has no running lane on this host"))
    r = desired.recipes[recipe]
    origin = r.api_origin()
    if r.sleep is not None and origin:
        from reconciler.apply.host_io import REAL_IO  # the start-up budget: only a qualify asks a lane

        asleep = (io or REAL_IO).lanes.is_sleeping(origin)
        if asleep is True:
            raise QualifyRefused(_not_running(desired, recipe, "is asleep"))
    digest = None
    with contextlib.suppress(Exception):  # the digest is identity, not a gate: missing, it is said as unknown
        digest = obs.engine.inspect_container(mine[0].id).get("Image")
    return mine, digest, obs


def _cards(desired: DesiredState, slots: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for s in slots:
        g = desired.host.gpus.get(s)
        out.append({"slot": s, "index": getattr(g, "index", None), "uuid": getattr(g, "uuid", None)})
    return out


def _reader(desired: DesiredState, slots: Sequence[str], stack: contextlib.ExitStack) -> Callable[[], Any] | None:
    if desired.host.gpu_telemetry != "nvml" or not slots:
        return None
    try:
        return stack.enter_context(MemoryReader(desired.host, slots))
    except Exception as exc:  # noqa: BLE001 - NVML missing or failing: every sample fails, said as such
        why = f"NVML: {type(exc).__name__}: {exc}"

        def read() -> Any:
            raise RuntimeError(why)

        return read


def _vram(lows: Sequence[tuple[LoadLow, float]]) -> dict[str, dict[str, Any]]:
    """Each slot's lowest free figure over the run (preflight probes and rungs alike), when and during what."""
    best: dict[str, tuple[LoadLow, float]] = {}
    for low, wall in lows:
        if low.slot not in best or low.free_bytes < best[low.slot][0].free_bytes:
            best[low.slot] = (low, wall)
    return {
        slot: {
            "min_free_bytes": low.free_bytes,
            "total_bytes": low.total_bytes,
            "reserve_bytes": low.reserve_bytes,
            "below_reserve": low.below_reserve,
            "during": low.probe,
            "at": round(wall + low.at_s, 3),
            "samples": low.samples,
        }
        for slot, (low, wall) in sorted(best.items())
    }


def one_run(
    desired: DesiredState, recipe: str, slots: tuple[str, ...], *, ladder: Sequence[int], reload: bool
) -> dict[str, Any]:
    """One whole sequence: preflight, the ladder, the reload proof; never raises (a failure is the run's why)."""
    r = desired.recipes[recipe]
    base, metrics_url, model = r.api_origin() or "", r.drain_metrics_url(), served_names(r)[0]
    run: dict[str, Any] = {
        "started": round(time.time(), 3),
        "status": "passed",
        "why": None,
        "ladder": [],
        "reload": None,
    }
    lows: list[tuple[LoadLow, float]] = []
    try:
        pre = run_suite(desired, recipe, "preflight", slots=slots)
        run["preflight"] = {"ok": pre.ok, "planned": pre.planned, "probes": [p.to_json() for p in pre.results]}
        lows += [(low, pre.started) for low in pre.vram.slots]
        if not pre.ok:
            failed = pre.first_failure
            run["status"], run["why"] = "failed", failed.reason() if failed else "the preflight suite did not finish"
            return run
        with contextlib.ExitStack() as stack:
            sampler = VramSampler(_reader(desired, slots, stack))
            wall = time.time()

            def whole() -> None:
                with sampler:
                    for target in ladder:
                        sampler.running(f"rung {target}")
                        rung = run_rung(base, model, metrics_url, target=target, seed=new_seed())
                        run["ladder"].append(rung)
                        if rung["error"]:
                            run["status"], run["why"] = "failed", f"the {target} rung: {rung['error']}"
                            return
                    if reload:
                        sampler.running("reload")
                        tokens = min(ladder) if ladder else 32000
                        run["reload"] = run_reload(base, model, metrics_url, tokens=tokens, seed=new_seed())

            _, counters = measured(metrics_url, whole)
            lows += [(low, wall) for low in sampler.lows(desired.host).values()]
            run["vram_sampled"] = sampler.sampling and not sampler.errors
            run["vram_errors"] = list(sampler.errors)
        run["spec"] = _spec(counters.to_json()["values"], counters.moved)
    except Exception as exc:  # noqa: BLE001 - a run that broke keeps its record, marked failed, with why
        run["status"], run["why"] = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        run["vram"] = _vram(lows)
        run["seconds"] = round(time.time() - run["started"], 3)
    return run


def _spec(values: dict[str, Any], moved: Callable[[str], float | None]) -> dict[str, Any] | None:
    drafts, accepted = moved("spec_draft_tokens"), moved("spec_accepted_tokens")
    if drafts is None or accepted is None:
        return None
    return {
        "draft_tokens": int(drafts),
        "accepted_tokens": int(accepted),
        "acceptance": round(accepted / drafts, 4) if drafts else None,
        "source": [source_of("spec_draft_tokens"), source_of("spec_accepted_tokens")],
    }


def _caveats(desired: DesiredState, runs: Sequence[dict[str, Any]]) -> list[str]:
    out = [SINGLE_REQUEST]
    if desired.host.gpu_telemetry != "nvml" or any(not r.get("vram_sampled", False) for r in runs):
        out.append(NOT_SAMPLED)
    missing: set[str] = set()
    for run in runs:
        for rung in run["ladder"]:
            missing |= set(rung["counters"]["not_exported"])
            if rung.get("cached_tokens") is None and rung.get("prompt_tokens") is not None:
                missing.add("usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details)")
        if run.get("reload"):
            missing |= set(run["reload"]["counters"]["not_exported"])
            if "does not say" in str(run["reload"]["evicted_because"]):
                out.append("reload: the GPU tier's size is not exported, so its eviction rests on the replay alone")
    out += [f"counter not exported: {name}" for name in sorted(missing)]
    return out


def parse_ladder(text: str) -> tuple[int, ...]:
    """``125000,192000,250000``: rungs of 1,000 to 10,000,000 tokens, each once."""
    try:
        rungs = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise QualifyRefused(f"--ladder {text!r}: comma-separated token counts, e.g. 125000,192000,250000") from None
    if not rungs or len(set(rungs)) != len(rungs) or not all(1000 <= x <= 10_000_000 for x in rungs):
        raise QualifyRefused(f"--ladder {text!r}: distinct token counts between 1000 and 10000000, e.g. 32000,64000")
    return rungs


def make_record(
    desired: DesiredState,
    recipe: str,
    runs: Sequence[dict[str, Any]],
    *,
    containers: Sequence[str],
    digest: str | None,
    slots: Sequence[str],
    ladder: Sequence[int],
    reload: bool,
) -> dict[str, Any]:
    """The evidence record of ``runs`` of ``recipe`` (its immutable identity, the host, the cards, the caveats)."""
    r = desired.recipes[recipe]
    return {
        "recipe": recipe,
        "recipe_hash": r.content_hash(),
        "image": r.container.image,
        "image_digest": digest,
        "model": r.model.id,
        "revision": r.model.revision,
        "host": desired.host.name,
        "machine": socket.gethostname(),
        "containers": list(containers),
        "cards": _cards(desired, slots),
        "started": runs[0]["started"],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(runs[0]["started"])),
        "reconciler_version": __version__,
        "ladder_targets": list(ladder),
        "reload_asked": reload,
        "repeat": len(runs),
        "runs": list(runs),
        "status": "passed" if all(x["status"] == "passed" for x in runs) else "failed",
        "caveats": _caveats(desired, runs),
    }


def run_qualify(
    ctx: CallContext, recipe: str, *, ladder: Sequence[int] = DEFAULT_LADDER, reload: bool = False, repeat: int = 1
) -> QualifyResult:
    if not 1 <= repeat <= 20:
        raise QualifyRefused(f"--repeat {repeat}: between 1 and 20 runs")
    desired = ctx.desired()
    r = desired.recipes.get(recipe)
    if r is None:
        raise QualifyRefused(f"no recipe {recipe!r} in configs/recipes/ (known: {', '.join(sorted(desired.recipes))})")
    mine, digest, _obs = _lane(ctx.io, desired, recipe)
    slots = tuple(dict.fromkeys(s for c in mine for s in c.slots if s in desired.host.gpus))
    runs = [one_run(desired, recipe, slots, ladder=ladder, reload=reload) for _ in range(repeat)]
    record = make_record(desired, recipe, runs, containers=[c.name for c in mine], digest=digest, slots=slots,
                         ladder=ladder, reload=reload)  # fmt: skip
    path = keep(desired.host.name, record)
    failed = next((x for x in runs if x["status"] != "passed"), None)
    ctx.record(
        desired.host.name,
        "qualify",
        target=recipe,
        outcome="ok" if failed is None else "failed",
        reason=failed["why"] if failed else f"{repeat} run(s) passed; evidence {path.name}",
        recipe_hash=record["recipe_hash"],
        evidence=str(path),
    )
    return QualifyResult(record, str(path))
