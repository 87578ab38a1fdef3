"""A sleep and a wake: vLLM's sleep mode driven on a lane's own loopback origin (docs/design.md, sleeping lanes).

A sleep drains the lane first (rule 5: ``POST /sleep`` is never sent with requests in flight), asks it to sleep at
its recipe's level and waits until the lane itself says it sleeps (``GET /is_sleeping``); then what it still holds on
each card is recorded (rule 2). A lane that will not sleep (its drain timed out, the call failed, it never said so
within ``sleep.timeout_s``) is left instead: stopped like any leave, its own offload file reclaimed (rule 6) where
the plan listed it on the sleep.

A wake first checks rule 1 again on a fresh observation: every other lane on its cards asleep by its own answer, no
process but the sleeping lanes' on them, and with NVML the memory the wake takes free beyond the reserve; else it
is refused and nothing is called. Then ``POST /wake_up`` (level 2: the weights, ``collective_rpc reload_weights``,
then the KV cache), the lane's own word that it is awake, its health URL and its ``preflight`` probes. A wake that
fails is a failed enter of that lane (kept stopped for its logs, its offload file reclaimed where the plan listed it
on the wake, entered cold by a later
pass after its backoff). ``SleepSteps`` runs both over the action's context (``reconciler.apply.context``), for
``Applier`` (``reconciler.apply.applier``); ``check_wake`` is rule 1's check on a given observation.
"""

from __future__ import annotations

from typing import Any

from reconciler.apply.context import ActionContext
from reconciler.apply.drain import drain, taking_down
from reconciler.apply.errors import ActionFailed, ActionRefused, Cancelled
from reconciler.apply.lane_http import body_text, quote
from reconciler.apply.leave import leave
from reconciler.apply.serving import check_enter, check_reserve, fail_enter, note_version, record_memory, run_probes
from reconciler.base import direct_http
from reconciler.base.units import human_bytes
from reconciler.model import DesiredState, Recipe, SleepSpec
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.claims import is_ours, slot_holders
from reconciler.plan.observed import ContainerView, Observed
from reconciler.plan.sleeping import holders_text, wake_memory_problems


class _WontSleep(Exception):
    """Why a lane did not go to sleep."""


class SleepSteps:
    """The sleep and the wake of a lane whose recipe has [sleep], over the action's context."""

    def __init__(self, ctx: ActionContext):
        self.ctx = ctx

    def sleep_lane(self, action: Action, observed: Observed) -> tuple[str, int]:
        recipe, spec, origin = self._sleep_mode(action)
        c = self._lane(action, observed)
        t0 = self.ctx.io.clock.monotonic()
        try:
            with taking_down(self.ctx, action):
                drained = drain(self.ctx, action, c, recipe, observed)
                record = self.ctx.figures().get("drain") or {}
                if record.get("timed_out"):
                    raise _WontSleep(f"{drained}; it is never put to sleep with requests in flight")
                if self.ctx.cancel.is_set():
                    raise Cancelled(f"stop requested before {c.name} was put to sleep; it still runs, awake")
                self.ctx.progress.phase(action, f"sleeping (level {spec.level})", timeout=spec.timeout_s)
                self._call(origin, f"/sleep?level={spec.level}", None, spec, _WontSleep)
                self._await_state(action, origin, spec, asleep=True, error=_WontSleep)
        except _WontSleep as exc:
            left = self._leave_instead(action, c, observed)
            raise ActionFailed(f"{c.name} would not sleep ({exc}): left (stopped) instead; {left}") from None
        seconds = self.ctx.io.clock.monotonic() - t0
        now = self.ctx.observe()
        held = record_memory(self.ctx, c.id, "asleep", now)
        kept = f"; it still holds {_per_slot(held)}" if held else ""
        self.ctx.note("sleep", {"level": spec.level, "seconds": round(seconds, 3), "asleep_bytes": held})
        return f"{drained}; {c.name} asleep (level {spec.level}) in {seconds:.1f} s{kept}", 0

    def wake_lane(self, action: Action, observed: Observed) -> tuple[str, int]:
        recipe, spec, origin = self._sleep_mode(action)
        now = self.ctx.observe()
        c = self._lane(action, now)
        check_wake(self.ctx.desired, c, now)
        t0 = self.ctx.io.clock.monotonic()
        try:
            self.ctx.progress.phase(action, "waking", timeout=spec.timeout_s)
            if spec.level == 1:
                self._call(origin, "/wake_up", None, spec, ActionFailed)
            else:
                self._call(origin, "/wake_up?tags=weights", None, spec, ActionFailed)
                self.ctx.progress.phase(action, "waking: reloading the weights", timeout=spec.timeout_s)
                self._call(origin, "/collective_rpc", {"method": "reload_weights"}, spec, ActionFailed)
                self._call(origin, "/wake_up?tags=kv_cache", None, spec, ActionFailed)
            self._await_state(action, origin, spec, asleep=False, error=ActionFailed)
            self._resume(origin, spec)
            if recipe.health.url and not self.ctx.io.lanes.health_ok(recipe.health.url):
                raise ActionFailed(f"{c.name} is awake but its health URL {recipe.health.url} does not answer 200")
            woke = self.ctx.io.clock.monotonic() - t0
            run_probes(self.ctx, action, recipe)
            after = check_enter(self.ctx, action, c.id)
            verdict = check_reserve(self.ctx, action, after)
        except ActionFailed as exc:
            fail_enter(self.ctx, action, c.id, exc, what="wake")
        record_memory(self.ctx, c.id, "awake", after)
        note_version(self.ctx, recipe)
        self.ctx.note("wake", {"level": spec.level, "seconds": round(woke, 3)})
        detail = f"{c.name} awake (level {spec.level}) in {woke:.1f} s and passed its preflight probes"
        if verdict.checked:
            detail += f"; free VRAM {verdict.message()}"
        return detail, 0

    def _sleep_mode(self, action: Action) -> tuple[Recipe, SleepSpec, str]:
        recipe = self.ctx.desired.recipes.get(action.recipe or "")
        origin = recipe.sleep_origin() if recipe is not None else None
        if recipe is None or recipe.sleep is None or origin is None:
            raise ActionFailed(
                f"recipe {action.recipe} has no [sleep] (or no health.url): {action.kind.value} not done"
            )
        return recipe, recipe.sleep, origin

    def _lane(self, action: Action, observed: Observed) -> ContainerView:
        c = next((x for x in observed.containers if x.id == action.container_id), None)
        if c is None or c.state != "running":
            raise ActionFailed(f"{action.container} is not running: nothing to {action.kind.value}")
        return c

    def _call(self, origin: str, path: str, payload: dict[str, Any] | None, spec: SleepSpec, error: type) -> None:
        """POST to the lane's own origin; anything but a 200 raises ``error`` quoting the answer."""
        try:
            answer = self.ctx.io.lanes.request(origin + path, payload if payload is not None else {}, spec.timeout_s)
        except direct_http.errors() as exc:
            raise error(f"POST {path}: {type(exc).__name__}: {exc}") from None
        if answer.status != 200:
            raise error(f"POST {path} answered {answer.status} {quote(body_text(answer.body))}")

    def _resume(self, origin: str, spec: SleepSpec) -> None:
        """Admit requests again where its sleep's drain paused the server (``POST /resume``; a 404: none offered)."""
        try:
            answer = self.ctx.io.lanes.request(origin + "/resume", {}, spec.timeout_s)
        except direct_http.errors() as exc:
            raise ActionFailed(f"POST /resume: {type(exc).__name__}: {exc}") from None
        if answer.status not in (200, 404, 405):
            raise ActionFailed(f"POST /resume answered {answer.status} {quote(body_text(answer.body))}")

    def _await_state(self, action: Action, origin: str, spec: SleepSpec, *, asleep: bool, error: type) -> None:
        """Until the lane itself says it sleeps (or is awake), at most ``sleep.timeout_s``."""
        t0 = self.ctx.io.clock.monotonic()
        while True:
            answer = self.ctx.io.lanes.is_sleeping(origin)
            if answer is asleep:
                return
            elapsed = self.ctx.io.clock.monotonic() - t0
            if elapsed >= spec.timeout_s:
                said = answer if isinstance(answer, str) else f"it says is_sleeping {str(answer).lower()}"
                want = "asleep" if asleep else "awake"
                raise error(f"not {want} within sleep.timeout_s ({spec.timeout_s:g} s): {said}")
            if self.ctx.cancel.is_set():
                raise Cancelled(f"stop requested while {action.container} was {'put to sleep' if asleep else 'woken'}")
            self.ctx.io.clock.sleep(min(self.ctx.poll_s, 0.05))

    def _leave_instead(self, action: Action, c: ContainerView, observed: Observed) -> str:
        """Rule 6: a lane that will not sleep is stopped as a leave, with the offload files only it holds of those its
        plan listed for the sleep (safety rule 13); a file it took since is left to the next plan. Its view is the
        host now, or where the engine's list does not answer now, the one the sleep was planned on (``observed``):
        the lane is the container the sleep just asked, never taken for gone by a list that failed."""
        now = self.ctx.observe()
        if not now.docker.ok:
            now = observed
        paths = tuple(f.path for f in now.shm.held_only_by(c.names) if f.path in action.paths)
        instead = Action(
            kind=ActionKind.LEAVE,
            reason=f"{c.name} would not sleep: left instead",
            recipe=c.recipe,
            gpus=c.slots,
            container=c.name,
            container_id=c.id,
            recipe_hash=c.recipe_hash,
            offload=action.offload,
            paths=paths,
        )
        try:
            detail, _ = leave(self.ctx, instead, now)
        except ActionFailed as exc:
            return f"its leave failed too: {exc.cause}"
        return detail


def check_wake(desired: DesiredState, c: ContainerView, now: Observed) -> None:
    """Rule 1, again right before a wake's call: on the lane's cards nothing else is awake or holds the memory."""
    host = desired.host.name
    for slot, cs in slot_holders(desired, now).items():
        if slot not in c.slots:
            continue
        for x in cs:
            if x.id == c.id:
                continue
            if not is_ours(x, host, now.ownership):
                raise ActionRefused(
                    f"wake of {c.name} refused: container {x.name} ({x.id[:12]}), not managed by this tool, holds "
                    f"GPU slot {slot}",
                    reason="gpu_held",
                )
            if now.sleeping.get(x.id) is not True:
                raise ActionRefused(
                    f"wake of {c.name} refused: {x.name} on GPU slot {slot} does not say it sleeps (GET "
                    "/is_sleeping); two lanes are never awake on one card",
                    reason="lane_awake",
                )
    asleep = {x.id for x in now.containers if now.sleeping.get(x.id) is True}
    for slot in c.slots:
        view = now.gpus.slots.get(slot)
        # A pid of another pid namespace (WSL2), which /proc cannot tie to a container, on a card this lane of
        # ours claims is most likely its own or a sleeping lane's, as the planner takes it (slot_problems).
        others = [
            p
            for p in (view.processes if view else ())
            if p.container_id not in (c.id, *asleep) and (p.resolved or p.container_id is not None)
        ]
        if others:
            raise ActionRefused(
                f"wake of {c.name} refused: GPU slot {slot} is used by another process, {holders_text(others, now)}",
                reason="gpu_held",
            )
    problems = wake_memory_problems(c, desired, now, ())
    if problems:
        raise ActionRefused(f"wake of {c.name} refused: {problems[0][0]}", reason="lane_awake")


def _per_slot(held: dict[str, int]) -> str:
    return ", ".join(f"{human_bytes(b)} on {slot}" for slot, b in held.items())
