"""What a lane proves before it counts as serving, after an enter or a wake, and what a failed one leaves.

Functions over the action's context (``reconciler.apply.context``), shared by ``reconciler.apply.enter`` and
``.sleep``: the recipe's ``preflight`` probes (with the free VRAM sampled under their load), the postcondition that
the lane runs and holds exactly its slots, its free VRAM against the reserve, the memory it holds on each card (for
its next wake's check) and its vLLM release. A failed enter or wake keeps its stopped container for the logs,
reclaims its own unmapped offload file through the guard and frees the GPUs (``fail_enter``).
"""

from __future__ import annotations

from typing import NoReturn

from reconciler.apply.context import ActionContext
from reconciler.apply.errors import ActionFailed, BelowReserve, Cancelled, PortSquatted, ProbeFailed, Superseded
from reconciler.base import direct_http
from reconciler.model import Recipe
from reconciler.observe.gpu import slots_of_container, unattributable_slots
from reconciler.observe.lanes import parse_version
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.claims import slot_holders
from reconciler.plan.observed import Observed
from reconciler.plan.vram import ReserveVerdict, enter_reserve_verdict
from reconciler.store.lane_memory import record_lane_memory


def record_memory(ctx: ActionContext, cid: str, how: str, observed: Observed) -> dict[str, int]:
    """What the lane's processes hold on each card now (NVML only), recorded for its next wake's check."""
    gpus = observed.gpus
    if gpus.telemetry != "nvml" or not gpus.reading.ok:
        return {}
    held = {
        slot: sum(p.used_bytes or 0 for p in view.processes if p.container_id == cid)
        for slot, view in gpus.slots.items()
        if any(p.container_id == cid for p in view.processes)
    }
    existing = [x.id for x in observed.containers] if observed.docker.ok else None
    with ctx.files_lock:
        record_lane_memory(ctx.desired.host.name, cid, how, held, existing=existing)
    return held


def note_version(ctx: ActionContext, recipe: Recipe) -> None:
    """The lane's vLLM release (its GET /version), into the outcome and so the audit record; none when it does
    not say."""
    origin = recipe.api_origin()
    if origin is None:
        return
    try:
        answer = ctx.io.lanes.request(origin + "/version", None, 1.0)
    except direct_http.errors():
        return
    version = parse_version(answer.body) if answer.status == 200 else None
    if version:
        ctx.note("vllm_version", version)


def check_reserve(ctx: ActionContext, action: Action, observed: Observed) -> ReserveVerdict:
    """The free VRAM of the enter's slots, sampled once its lane is healthy and settled, against their
    reserve. Under ``enforce`` a slot below it (or with no figure) raises ``BelowReserve``: the enter failed.
    Under ``report`` the verdict goes into the outcome and the lane stays."""
    verdict = enter_reserve_verdict(ctx.desired, action.recipe, observed.gpus, action.gpus)
    ctx.note("gpu_reserve", verdict.to_json())
    if verdict.failed:
        how = "end below the free-VRAM reserve" if verdict.below else "report no free-VRAM figure to check"
        raise BelowReserve(
            f"{action.container} is healthy but its GPUs {how} (gpu_reserve policy enforce): {verdict.message()}"
        )
    return verdict


def run_probes(ctx: ActionContext, action: Action, recipe: Recipe) -> None:
    """The recipe's ``preflight`` suite, once its health URL answered: each probe in order, the first that
    fails fails the enter (``ProbeFailed``: the reason names the probe and what came back). Meanwhile the free
    VRAM of its cards is sampled; under ``enforce`` a card whose lowest figure is below its reserve fails the
    enter too (``BelowReserve``, naming the card, the figure and the probe that was running then)."""
    # the start-up budget: a converged `reconciler apply` runs no probe (docs/performance.md, its commands table)
    from reconciler.apply.probes import ProbeSpec, run_suite
    from reconciler.store.probe_history import record_suite

    def before(probe: ProbeSpec, i: int, n: int) -> None:
        if ctx.cancel.is_set():
            raise Cancelled(f"stop requested while probing {action.container}; it keeps its labels")
        ctx.progress.phase(action, f"probes: {probe.name} ({i + 1}/{n})", timeout=probe.timeout_s)

    assert action.recipe is not None
    run = run_suite(ctx.desired, action.recipe, "preflight", slots=action.gpus, before=before, stop_at_failure=True)
    ctx.note("probes", [r.to_json() for r in run.results])
    ctx.note("vram_under_load", run.vram.to_json())
    if run.planned:
        record_suite(ctx.desired.host.name, run.to_json())
    failed = run.first_failure
    if failed is not None:
        raise ProbeFailed(failed.reason())
    if run.vram.failed:
        how = "fell below the free-VRAM reserve" if run.vram.below else "gave no free-VRAM figure to check"
        raise BelowReserve(
            f"{action.container} passed its preflight probes, but under their load its GPUs {how} "
            f"(gpu_reserve policy enforce): {run.vram.message()}"
        )


def check_enter(ctx: ActionContext, action: Action, cid: str) -> Observed:
    """Postcondition: running and holding exactly its slots (by Docker, and by NVML where it is on).
    Returns that observation (its GPU figures are the enter's free-VRAM sample)."""
    observed = ctx.observe()
    mine = next((c for c in observed.containers if c.id == cid), None)
    if mine is None or not mine.active:
        raise ActionFailed(f"{action.container} is not running after it became healthy")
    held = {slot for slot, cs in slot_holders(ctx.desired, observed).items() if mine in cs}
    if held != set(action.gpus):
        raise ActionFailed(f"{action.container} holds slots {sorted(held)}, expected {list(action.gpus)}")
    if observed.gpus.telemetry == "nvml":
        if not observed.gpus.reading.ok:
            raise ActionFailed(f"GPU telemetry unavailable after enter: {observed.gpus.reading.detail}")
        on = set(slots_of_container(observed.gpus, cid))
        # A slot where NVML cannot attribute processes (WSL2) is not held against the container; a process of
        # it on a slot outside its own always is.
        blind = set(unattributable_slots(observed.gpus, set(action.gpus) - on))
        if on - set(action.gpus) or set(action.gpus) - on - blind:
            raise ActionFailed(
                f"{action.container} is healthy but NVML sees its processes on {sorted(on) or 'no GPU'}, "
                f"expected exactly {list(action.gpus)}"
            )
    return observed


def fail_enter(ctx: ActionContext, action: Action, cid: str, exc: ActionFailed, *, what: str = "enter") -> NoReturn:
    """Keep the failed container for its logs, reclaim its unmapped shm, free the GPUs; then raise."""
    how = "superseded" if isinstance(exc, Superseded) else "failed"
    ctx.progress.phase(action, f"{how}: keeping the container, reclaiming its shm")
    logs = ctx.ops.logs_tail(cid)
    # Its own offload files: those its container is seen holding now, and no other process. The only ones this
    # failed enter reclaims (the guard still proves each unowned, twice). A file that merely appeared since its
    # create may be another program's: a crash before its container was seen mapping it leaves it to the next
    # plan, which reclaims it as an orphan once nothing can own it.
    now = ctx.observe()
    names = {c.name for c in now.containers if c.id == cid} | {cid, cid[:12]}
    its_files = [f.path for f in now.shm.held_only_by(names)]
    if action.kind is ActionKind.WAKE:  # its file existed when planned: only as the plan listed it on the wake
        its_files = [p for p in its_files if p in action.paths]
    try:
        ctx.ops.stop(cid, 5)
    except Exception:  # noqa: BLE001 - a stop that fails for good: kill it, and say so below if it still runs
        ctx.ops.kill(cid)
    try:
        kept = ctx.ops.preserve(cid, action.container or cid[:12])
    except Exception as err:  # noqa: BLE001 - the name stays taken; the next plan sees a stopped container of ours
        kept = f"{action.container or cid[:12]} (not renamed: {type(err).__name__}: {err})"
    ctx.prune_kept(action.container or cid[:12])
    freed_note = ""
    res = ctx.guarded_reclaim(only_paths=its_files, claimed=its_files)
    if res.reclaimed_bytes:
        freed_note = f"; reclaimed {res.reclaimed_bytes} bytes of its offload file"
    elif res.refused:
        freed_note = f"; its offload file was not reclaimed: {res.refused}"
    observed = ctx.observe()
    still = [c.name for c in observed.containers if c.id == cid and c.active]
    cause = (
        exc.cause
        if isinstance(exc, (BelowReserve, ProbeFailed, PortSquatted, Superseded))
        else (_cause_from_logs(logs) or exc.cause)
    )
    ended = "abandoned" if isinstance(exc, Superseded) else "failed"
    msg = (
        f"{what} {action.recipe} on {','.join(action.gpus)} {ended}: {cause}. "
        f"Kept as {kept} (docker logs {kept}){freed_note}"
    )
    if still:
        msg += f"; WARNING: {still[0]} is still running"
    raise (Superseded if isinstance(exc, Superseded) else ActionFailed)(msg, detail=logs)


def _cause_from_logs(logs: str) -> str:
    """The line an operator needs first: the report's Errno 14, or the last error-looking line."""
    lines = [ln.strip() for ln in logs.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Errno 14" in ln or "Bad address" in ln:
            return f"{ln} (the offload mmap could not be prefaulted: the tmpfs is out of room)"
    for ln in reversed(lines):
        low = ln.lower()
        if "error" in low or "exception" in low or "fatal" in low:
            return ln
    return ""
