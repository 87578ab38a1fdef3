"""Human output for plan and status: pure functions from values to text.

Called by the CLI. Colour only when writing to a terminal (and NO_COLOR is unset); plain text when piped.
"""

from __future__ import annotations

import contextlib
import pwd
import time
from typing import Any

from reconciler.base.errors import ConfigProblem, one_line
from reconciler.base.units import clip, human_bytes, iso_time
from reconciler.cli.style import Style
from reconciler.model import container_name
from reconciler.plan.actions import Action, ActionKind, Plan
from reconciler.plan.observed import Observed
from reconciler.plan.verdict import acting, decide
from reconciler.service.words import audit_what, blocked_advice

_SIGN = {
    ActionKind.LEAVE: "-",
    ActionKind.RECLAIM: "~",
    ActionKind.ENTER: "+",
    ActionKind.PRUNE: "x",
    ActionKind.SLEEP: "z",
    ActionKind.WAKE: "^",
}


def _action_line(a: Action, s: Style) -> list[str]:
    sign = _SIGN[a.kind]
    paint = {
        ActionKind.LEAVE: s.red,
        ActionKind.RECLAIM: s.yellow,
        ActionKind.ENTER: s.green,
        ActionKind.PRUNE: s.dim,
        ActionKind.SLEEP: s.yellow,
        ActionKind.WAKE: s.green,
    }[a.kind]
    if a.kind is ActionKind.PRUNE:
        return [paint(f"{sign} prune   {a.container}"), f"      why: {a.reason}"]
    if a.kind is ActionKind.RECLAIM:
        head = f"{sign} reclaim {len(a.paths)} orphan offload file(s), {human_bytes(a.bytes)}"
        lines = [paint(head), f"      why: {a.reason}"]
        lines += [f"      {p!r}" if "\n" in p else f"      {p}" for p in a.paths]
        return lines
    slots = ",".join(a.gpus) or "no GPU slot"
    head = f"{sign} {a.kind.value:<7} {a.recipe or '?'} on {slots}"
    extra = []
    if a.container:
        extra.append(f"container {a.container}")
    if a.kind is ActionKind.ENTER and a.bytes:
        extra.append(f"offload {human_bytes(a.bytes)}")
    tail = f"  ({', '.join(extra)})" if extra else ""
    return [paint(head) + s.dim(tail), f"      why: {a.reason}"]


def source_word(observed: Observed, name: str) -> str:
    """How one source did, in a header: ``ok``, ``unavailable: …``, or ``n/a`` for GPU telemetry on a host that
    has none (``gpu_telemetry: none``): nothing was read, so nothing can be "ok"."""
    if name == "gpu" and observed.gpus.telemetry == "none":
        return "n/a"
    return observed.readings[name].render()


def _problems(plan: Plan) -> int:
    """The blockers an operator must act on: a lane of ours kept serving where a blocked lane would go is said as
    such (``kept_serving``), never counted as a problem of its own."""
    kept = set(plan.kept_serving)
    return sum(1 for b in plan.blockers if b.holder not in kept) or len(plan.blockers)


def _plan_lines(plan: Plan, s: Style) -> list[str]:
    """One line per lane as it stays, per step, per blocker, per held lane and per fallback."""
    out: list[str] = []
    kept = set(plan.kept_serving)
    out.extend(s.dim(f"  = {name} matches its assignment") for name in plan.satisfied if name not in kept)
    out.extend(s.yellow(f"  = {name} keeps serving: what would replace it is blocked") for name in plan.kept_serving)
    for a in plan.actions:
        out.extend("  " + line for line in _action_line(a, s))
    out.extend(s.red(f"  ! blocked {b.recipe} on {','.join(b.gpus)}: {b.reason}") for b in plan.blockers)
    out.extend(s.yellow(f"  … held {h.recipe} on {','.join(h.gpus)}: {h.reason}") for h in plan.held)
    out.extend(s.yellow(f"  ↺ {f.text}") for f in plan.fallbacks)
    return out


def render_plan(plan: Plan, observed: Observed | None, s: Style) -> str:
    out: list[str] = []
    if observed is not None:
        src = ", ".join(f"{n} {source_word(observed, n)}" for n in observed.readings)
        out.append(s.bold(f"host {plan.host}") + f"  ({src})")
    if plan.unavailable:
        out.append(
            s.red(f"cannot plan completely: {', '.join(plan.unavailable)} unavailable")
            + " - nothing that needs it will be changed"
        )
    out.extend(_plan_lines(plan, s))
    counts = {k: sum(1 for a in plan.actions if a.kind is k) for k in ActionKind}
    refusal = plan.apply_refusal  # the applier's own decision: a plan never promises what apply refuses
    if plan.actions and refusal is not None:
        lead = f"Blocked: {_problems(plan)} problem(s); apply" if plan.blocked else "Apply"
        out.append(
            s.red(
                f"{lead} refuses all {len(plan.actions)} action(s) above and changes nothing: {refusal} "
                "(a pass acts only on a whole view of the host). Fix the source named above, then plan again."
            )
        )
        if plan.blocked:
            out.extend("  " + line for line in blocked_advice(plan))
    elif plan.blocked:
        if plan.actions:
            out.append(
                s.red(
                    f"Blocked: {_problems(plan)} problem(s); apply runs the {len(plan.actions)} action(s) above "
                    "and leaves the blocked slots as they are."
                )
            )
        else:
            out.append(s.red(f"Blocked: {_problems(plan)} problem(s); apply would change nothing."))
        out.extend("  " + line for line in blocked_advice(plan))
    elif plan.actions:
        out.append(
            s.bold(
                f"Plan: {counts[ActionKind.ENTER]} to enter, {counts[ActionKind.LEAVE]} to leave, "
                f"{counts[ActionKind.RECLAIM]} reclaim"
                + (f", {counts[ActionKind.SLEEP]} to sleep" if counts[ActionKind.SLEEP] else "")
                + (f", {counts[ActionKind.WAKE]} to wake" if counts[ActionKind.WAKE] else "")
                + (f", {counts[ActionKind.PRUNE]} to prune." if counts[ActionKind.PRUNE] else ".")
            )
        )
    elif not plan.unavailable and not plan.held:
        out.append(s.green("No changes: the host matches the manifest."))
    return "\n".join(out)


# ---------------------------------------------------------------- status


def _whose(c: dict[str, Any]) -> str:
    if c["owner"] == "ours":
        state = ", asleep" if c.get("sleeping") else ", awake" if c.get("sleeping") is False else ""
        return f"managed {c['recipe'] or ''}" + ("" if c.get("healthy", True) else ", never healthy") + state
    if c["owner"] == "legacy":
        return f"not adopted: {c['recipe'] or 'no recipe'}; `reconciler adopt {c['name']}`"
    if c["owner"] == "copied":
        return (
            f"not created by this install (copied labels): {c['recipe'] or 'no recipe'}; `reconciler adopt {c['name']}`"
        )
    return "unmanaged"


def render_status(data: dict[str, Any], s: Style) -> str:
    out = _status_head(data, s)
    out.append("")
    out.append(s.bold("GPU slots"))
    versions = {c["name"]: (c.get("vllm") or {}).get("version") for c in data["containers"]}
    out.extend(_slot_line(slot, v, s, versions) for slot, v in data["slots"].items())
    out.append("")
    out.extend(_shm_lines(data, s))
    out.extend(_preserved_lines(data, s))
    out.extend(_suite_lines(data, s))
    out.extend(_loop_lines(data, s))
    out.extend(_door_lines(data, s))
    for f in data["plan"].get("fallbacks") or ():
        out.append(s.yellow(f"  ↺ {f['text']}"))
    out.extend(render_aliases(data.get("aliases") or [], s))
    out.append("")
    out.append(_verdict_line(data, s))
    return "\n".join(out)


def render_aliases(aliases: list[dict[str, Any]], s: Style) -> list[str]:
    """Each alias, its recipe and the verdict of its evidence against the alias's gates (each failed gate with its
    figure below it): ``plan`` and ``status``."""
    if not aliases:
        return []
    out = ["", s.bold("aliases")]
    for a in aliases:
        line = f"  {a['alias']} -> {a['recipe']}: {a['verdict']}"
        out.append(s.green(line) if a["verdict"] == "promoted" else s.yellow(line))
        out += [f"    {f}" for f in a.get("failures") or () if a["verdict"] != "promoted"]
    return out


def _status_head(data: dict[str, Any], s: Style) -> list[str]:
    """The host, its files' validity, GPU telemetry and the sources that failed."""
    install = data.get("install_id")
    out = [
        s.bold(f"host {data['host']}")
        + f"  (manifest {data['manifest'] or 'invalid'}; install id {install[:12] + '…' if install else 'none yet: the first apply makes one'})"
    ]
    err = data.get("error")
    if err and err.get("code") == "config_invalid":
        out.append(s.red(f"files invalid: {err['message']}"))
        out.extend(s.red(f"  {ConfigProblem(p['path'], p['line'], p['message'])}") for p in err["problems"])
        out.append(s.yellow(f"desired below: {data.get('desired_from')}"))
    if data.get("source"):
        out.extend(render_source(data["source"]))
    out.append(f"GPU telemetry {data['gpu_telemetry']}: {data['gpu_source']}")
    reports = data.get("gpu_driver_reports") or {}
    if data["gpu_telemetry"] == "nvml":
        missing = [
            what
            for key, what in (("process_memory", "per-process memory"), ("utilization", "utilisation"))
            if reports.get(key) == "not reported"
        ]
        if missing:
            out.append(s.yellow(f"  {' and '.join(missing)}: not reported by this driver"))
    bad = {k: v for k, v in data["sources"].items() if v != "ok" and not v.startswith("ok")}
    if bad:
        out.append(s.red("sources: " + ", ".join(f"{k} {v}" for k, v in bad.items())))
    return out


def _slot_line(slot: str, v: dict[str, Any], s: Style, versions: dict[str, str | None] | None = None) -> str:
    """One GPU slot: what the manifest wants there, what holds it now (with the vLLM release its server gives),
    and its card."""
    held = [
        f"{c['name']} ({_whose(c)}, {c['state']}"
        + (f", vLLM {(versions or {})[c['name']]}" if (versions or {}).get(c["name"]) else "")
        + ")"
        for c in v["containers"]
    ]
    held += [
        f"pid {p['pid']} "
        + (clip(p["command"], 60) if p["command"] else "(not found in this /proc: another pid namespace, or gone)")
        + f" ({'memory n/a' if p['used_bytes'] is None else human_bytes(p['used_bytes'])}"
        + (f", in {p['container']}" if p["container"] else ", no container")
        + ")"
        for p in v["processes"]
    ]
    held += [
        f"pid {n['pid']} holds {n['node']} open ({clip(n['command'], 60) or 'command unknown'}"
        + (f", in {n['container']})" if n["container"] else ", no container)")
        for n in v.get("node_holders") or ()
    ]
    if v.get("unlisted_used_bytes"):
        held.append(f"{human_bytes(v['unlisted_used_bytes'])} in use and no visible process")
    if v.get("asleep_bytes"):
        held.append(f"{human_bytes(v['asleep_bytes'])} kept by sleeping lanes")
    if held:
        now = "; ".join(held) + (
            s.yellow(f" (and unknown: {', '.join(v['unknown'])} unavailable)") if v["unknown"] else ""
        )
    elif v["free"] is None:
        now = s.yellow(f"unknown ({', '.join(v['unknown'])} unavailable)")
    else:
        now = s.dim("free")
    want = v["desired"] or "free"
    return f"  {slot:<16} want {want:<24} has {now}  [{_card_text(v, s)}]"


def _card_text(v: dict[str, Any], s: Style) -> str:
    """A slot's card: its index and UUID, memory in use and free against the reserve, or that it is missing."""
    gpu = f"gpu {v['index'] if v['index'] is not None else '?'}"
    if v["uuid"]:
        gpu += f" {v['uuid']}"
    if v["memory_total_bytes"]:
        gpu += f", {human_bytes(v['memory_used_bytes'])} / {human_bytes(v['memory_total_bytes'])}"
    if v.get("memory_free_bytes") is not None:
        gpu += f", {human_bytes(v['memory_free_bytes'])} free"
        if v.get("below_reserve"):
            gpu += s.red(f", BELOW RESERVE {human_bytes(v['reserve_bytes'])} ({v.get('reserve_policy')})")
        else:
            gpu += f", reserve {human_bytes(v['reserve_bytes'])}"
    if v["missing"]:
        gpu += s.red(f" MISSING: {v['error']}" if v["error"] else " MISSING")
    return gpu


def _shm_lines(data: dict[str, Any], s: Style) -> list[str]:
    shm = data["shm"]
    t = shm["tmpfs"]
    f = shm["files"]
    out = [
        s.bold("offload shm")
        + f"  {shm['dir']}: {human_bytes(t['free_bytes'])} free of {human_bytes(t['size_bytes'])}",
        f"  owned {f['owned']['count']} ({human_bytes(f['owned']['bytes'])}), "
        f"orphan {f['orphan']['count']} ({human_bytes(f['orphan']['bytes'])}), "
        f"blocked {f['blocked']['count']} ({human_bytes(f['blocked']['bytes'])}), "
        f"deleted but mapped {human_bytes(shm['deleted_mapped_bytes'])}",
    ]
    if not data["sources"].get("proc", "ok").startswith("ok"):
        out.append(s.yellow("  owners unknown: proc unavailable, so no file counts as orphan and none is reclaimed"))
    return out


def _preserved_lines(data: dict[str, Any], s: Style) -> list[str]:
    preserved = [c for c in data["containers"] if c["preserved"]]
    if not preserved:
        return []
    out = ["", s.bold("kept failed containers") + " (logs: docker logs NAME)"]
    out.extend(f"  {c['name']} {c['recipe']} exit {c['exit_code']}" for c in preserved)
    return out


def _suite_lines(data: dict[str, Any], s: Style) -> list[str]:
    """The last run of each probe suite, its first failure, and the lowest free VRAM under its load."""
    suites = data.get("probe_suites") or {}
    if not suites:
        return []
    out = ["", s.bold("probe suites") + " (last run of each; reconciler probe RECIPE --suite S)"]
    # A recipe the manifest no longer runs keeps its last runs, marked old: they say nothing of a lane serving now.
    wanted = {v.get("desired") for v in (data.get("slots") or {}).values()}
    wanted |= {a.get("recipe") for a in data.get("standby") or ()}
    for recipe, runs in suites.items():
        old = "" if recipe in wanted else " (old: the manifest runs no lane of it now)"
        for suite, run in runs.items():
            line = (
                f"  {recipe} {suite}: {run.get('passed', 0)}/{run.get('planned', 0)} passed at "
                f"{iso_time(float(run.get('started') or 0))}{old}"
            )
            failed = [p for p in run.get("probes") or () if not p.get("ok")]
            failing = line + f"; {failed[0]['name']}: {clip(failed[0]['detail'], 120)}" if failed else line
            out.append(s.red(failing) if failed and not old else failing)
            under = run.get("vram_under_load") or {}
            for slot, low in (under.get("slots") or {}).items():
                during = f"during {low['probe']!r}" if low.get("probe") else "between probes"
                text = (
                    f"    {slot}: lowest {human_bytes(low['min_free_bytes'])} free under load, {during}, "
                    f"reserve {human_bytes(low['reserve_bytes'])}"
                )
                out.append(s.red(text + f" BELOW ({under.get('policy')})") if low.get("below_reserve") else text)
    return out


def _door_lines(data: dict[str, Any], s: Style) -> list[str]:
    """The front door's models, when a door runs: each name's lane state, held requests and last request."""
    door = data.get("door")
    if not isinstance(door, dict):
        return []
    out = ["", s.bold("front door") + f"  pid {door.get('pid')}"]
    for name, m in sorted((door.get("models") or {}).items()):
        last = m.get("last_request")
        line = (
            f"  {clip(str(name), 60)} -> {clip(str(m.get('recipe')), 60)}: {m.get('state')}, "
            f"last request {iso_time(last) if isinstance(last, int | float) else 'never'}"
        )
        if m.get("queue"):
            line += f", {m['queue']} held (oldest {m.get('held_s', 0):.1f} s)"
            out.append(s.yellow(line))
        else:
            out.append(line)
    return out


def _loop_lines(data: dict[str, Any], s: Style) -> list[str]:
    loop = data.get("loop")
    if not loop:
        return []
    last = loop.get("last_pass") or {}
    out = [
        "",
        s.bold("loop") + f"  pid {loop['pid']}, {loop.get('passes', 0)} passes, last: {last.get('result', '-')}",
    ]
    listener = loop.get("listener")
    if isinstance(listener, dict) and listener.get("bound") is False:
        holder = f"; held by {listener['holder']}" if listener.get("holder") else ""
        out.append(
            s.red(
                f"  listener {listener.get('addr')} NOT BOUND since {iso_time(listener.get('since') or 0)} "
                f"({listener.get('error')}{holder}): no /metrics, /healthz, API or page; the loop reconciles "
                f"meanwhile and binds again (attempt {listener.get('attempts')}, next in {listener.get('retry_in_s')} s)"
            )
        )
    elif isinstance(listener, dict):
        out.append(f"  listener {listener.get('addr')} serving")
    serving = set((data.get("plan") or {}).get("satisfied") or ())
    for key, e in (loop.get("backoff") or {}).items():
        due = float(e["until"]) <= time.time()
        if due and _lane_container(key) in serving:
            continue  # its wait is over and the lane serves: what is left is the loop's count, not news
        when = "due now" if due else f"at {iso_time(e['until'])}"
        out.append(
            s.yellow(
                f"  backoff {key}: {e['failures']} failed enter(s), next try {when}; "
                f"last error: {clip(e['last_error'], 160)}"
            )
        )
    return out


def _lane_container(key: str) -> str:
    """The container name of an assignment key (``omni@dark-compute-b``)."""
    recipe, _, slots = key.partition("@")
    return container_name(recipe, slots.split("+"))


def _verdict_line(data: dict[str, Any], s: Style) -> str:
    """Whether the host matches the manifest, and if not, why: the verdict every view gives
    (``reconciler.plan.verdict``), in the command line's words (its exit code says the same)."""
    plan = data["plan"]
    word = (data.get("verdict") or {}).get("word") or decide(data).word
    if word == "invalid":
        what = "matches" if data["converged"] else "does not match"
        return s.red(
            f"files invalid (exit 1): the host {what} the last valid desired state above; "
            "fix the files (`reconciler validate`)"
        )
    if word == "converged":
        return s.green("converged: the host matches the manifest")
    if word == "unavailable":
        down = plan["unavailable"] or sorted(n for n, v in (data.get("sources") or {}).items() if v != "ok")
        return s.red(
            f"unknown: {', '.join(down)} unavailable, so whether the host matches the manifest cannot be told (exit 1)"
        )
    n = len(plan["actions"])
    state = "blocked" if word == "blocked" else f"{n} action(s) pending"
    if word == "held":
        waiting = ", ".join(f"{h['recipe']} on {','.join(h['gpus'])}" for h in plan["held"])
        state = f"{waiting} held in backoff" + (", a fallback serves meanwhile" if plan.get("fallbacks") else "")
    elif word == "converging" and (now := acting(data)):
        state = f"the running loop is acting ({', '.join(now)})"
    return s.yellow(f"not converged: {state} (run `reconciler plan` for details)")


# ---------------------------------------------------------------- audit


# Outcomes that are not a success: the row then says what went wrong (the action's own error), not why it was
# planned.
def _audit_by(r: dict[str, Any]) -> str:
    """The BY column: the front-end and its caller; for a caller the listener knows by its socket's owner (a refused,
    unauthenticated request: its ``who`` is its address), that user too, as ``uid N (NAME)``."""
    who = str(r.get("who") or "")
    peer = str(r.get("peer") or "")
    if peer.startswith("uid ") and peer[4:].isdigit() and peer not in who:
        with contextlib.suppress(KeyError):  # a uid with no name: the number says it
            peer += f" ({pwd.getpwuid(int(peer[4:])).pw_name})"
        who = f"{who}, {peer}" if who else peer
    return one_line(str(r.get("front") or "?") + (f" ({who})" if who else ""))


def render_audit(records: list[dict[str, Any]]) -> str:
    """``reconciler audit``: one row per record under a header, columns aligned, times in ISO 8601 with the zone,
    and for a failure its own error (the record's ``detail``), not the reason it was planned."""
    head = ("TIME", "BY", "ACTION", "OUTCOME", "SECONDS", "FREED", "WHAT")
    rows = []
    for r in records:
        secs = r.get("seconds")
        freed = r.get("bytes_freed")
        rows.append(
            (
                iso_time(float(r.get("time") or 0)),
                _audit_by(r),
                str(r.get("action") or "?"),
                str(r.get("outcome") or "?"),
                f"{secs:.1f}" if isinstance(secs, (int, float)) else "-",
                human_bytes(freed) if isinstance(freed, int) and freed else "-",
                one_line(audit_what(r)),
            )
        )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head) - 1)]
    right = {4}  # numbers align on the right
    lines = []
    for row in [head, *rows]:
        # the last column is not padded: it has no width, so zip stops before it
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def render_source(src: dict[str, Any], *, taken: bool | None = None, before: str | None = None) -> list[str]:
    """The git source's lines, as ``sync`` and ``status`` show them."""
    commit = (src.get("commit") or "none")[:12]
    head = f"source {src.get('url')} {src.get('ref')}" + ("" if src.get("path") in (None, ".") else f" {src['path']}")
    if taken:
        lines = [f"{head}: commit {(before or 'none')[:12]} -> {commit} taken; the loop converges it"]
    else:
        lines = [f"{head}: commit {commit} in use ({src.get('state')})"]
    if src.get("error"):
        lines.append(f"  fetch failed: {src['error']}")
    refused = src.get("refused")
    if isinstance(refused, dict):
        lines.append(f"  refused commit {str(refused.get('commit'))[:12]}: its files do not validate")
        lines.extend(f"    {p}" for p in refused.get("problems") or ())
    waiting = src.get("waiting")
    if isinstance(waiting, dict):
        lines.append(f"  commit {str(waiting.get('commit'))[:12]} waits for its canaries:")
        lines.extend(f"    {h}: {why}" for h, why in sorted((waiting.get("canaries") or {}).items()))
    stopped = src.get("stopped")
    if isinstance(stopped, dict):
        lines.append(
            f"  commit {str(stopped.get('commit'))[:12]} stopped: {stopped.get('why')}; push a fix or a revert"
        )
    return lines
