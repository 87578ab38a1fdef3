"""An enter: a lane brought up on its slots, and what it must prove before it counts as serving.

Preflight: the image is present, the lane's ports are free and nothing answers its health URL, the tmpfs has room
for its offload file (safety rules 6 and 7 of docs/design.md). Act: create (labelled in the same call, its token
recorded first: rule 9), start, wait for health, settle, run the ``preflight`` probes, check its slots and free
VRAM. A failed enter keeps its stopped container for the logs, reclaims its own unmapped offload file through the
guard and frees the GPUs. Part of ``Applier`` (``reconciler.apply.applier``).
"""

from __future__ import annotations

import secrets
from typing import NoReturn

from reconciler.apply import pagecache
from reconciler.apply.engine_ops import create_spec
from reconciler.apply.errors import (
    ActionFailed,
    ActionRefused,
    BelowReserve,
    Cancelled,
    PortSquatted,
    ProbeFailed,
    Superseded,
)
from reconciler.apply.ports import PortChecks
from reconciler.base import direct_http
from reconciler.base.units import human_bytes
from reconciler.load.secrets import SecretError
from reconciler.load.secrets import resolve as resolve_secrets
from reconciler.model import Recipe
from reconciler.observe.gpu import slots_of_container, unattributable_slots
from reconciler.observe.lanes import parse_version
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.claims import slot_holders
from reconciler.plan.observed import ENDED_STATES, LABEL_CREATE_TOKEN, Observed
from reconciler.plan.sleeping import awake_beside
from reconciler.plan.vram import ReserveVerdict, enter_reserve_verdict
from reconciler.store.lane_memory import record_lane_memory
from reconciler.store.state import ensure_install_id, mark_healthy, record_created, record_pending


class EnterSteps(PortChecks):
    """An enter: preflight, create, start, wait for health, probes, postcondition; a failed one kept for its logs."""

    def enter(self, action: Action, observed: Observed) -> tuple[str, int]:
        assert action.recipe is not None
        recipe = self.desired.recipes[action.recipe]
        slots = action.gpus
        freed = 0
        if action.container_id:
            # A container of ours left waiting for its health check (an apply stopped meanwhile): finish the wait
            # on it rather than restart a model load. It was created and started already; nothing to preflight.
            cid = action.container_id
            self.progress.phase(action, "finishing: waiting again for the container left waiting")
            return self._bring_up(action, recipe, cid, start=False, freed=0)
        # Preflight: the image, then tmpfs room for the offload file (orphans reclaimed through the guard).
        self.progress.phase(action, "preflight")
        if not self.ops.image_present(recipe.container.image):
            raise ActionFailed(
                f"image {recipe.container.image} is not present on this host: pull or build it "
                f"(recipe {action.recipe}, container.image)"
            )
        self._check_ports_free(action, recipe)
        self._check_health_url_free(action, recipe)
        need = recipe.offload.capacity_bytes
        reserve = self.desired.host.shm.reserve_bytes if need else 0
        # Orphans were reclaimed by the plan's own reclaim action before any enter; none is removed here that the
        # plan did not list.
        if need and observed.shm.tmpfs.free_bytes < need + reserve:
            raise ActionRefused(
                f"tmpfs {observed.shm.dir} has {human_bytes(observed.shm.tmpfs.free_bytes)} free; recipe "
                f"{action.recipe} needs {human_bytes(need)} for its offload file"
                + (f" and shm.reserve_gib keeps {human_bytes(reserve)} free beyond it" if reserve else "")
                + " (see `reconciler shm status`)",
                reason="tmpfs_room",
            )
        if self.cancel.is_set():
            raise Cancelled("stop requested before create; nothing created")
        self._check_beside_sleeping(action, observed)
        # Act: create (labelled in the same call, so an interrupt never leaves it unowned), start, wait for health.
        self.progress.phase(action, "starting: create")
        install_id = ensure_install_id(self.desired.host.name)
        refs = recipe.container.env_refs().values()
        try:
            values = resolve_secrets(self.desired.host.secrets.env_file, refs) if refs else None
        except SecretError as exc:
            raise ActionFailed(f"recipe {action.recipe}: secret env value {exc}") from None
        create = create_spec(self.desired, action.recipe, slots, install_id=install_id, secrets=values)
        # The proof of ownership: the create's token is recorded before the create (a lost answer still names the
        # container by its name and token), its id once the engine answers (docs/design.md, safety rule 9).
        token = secrets.token_hex(16)
        create["labels"] = {**create["labels"], LABEL_CREATE_TOKEN: token}
        host = self.desired.host.name
        with self._files_lock:
            record_pending(host, create["name"], token)
        cid = self.ops.create(create)
        with self._files_lock:
            record_created(host, cid, token=token)
        # Rule 1 once more with the container made, right before its start: the window in which a sleeping lane
        # beside it could wake itself unseen is the start call alone.
        try:
            self._check_beside_sleeping(action, observed)
        except ActionRefused:
            self.ops.remove(cid)  # created, never started: it held nothing
            raise
        return self._bring_up(action, recipe, cid, start=True, freed=freed)

    def _check_beside_sleeping(self, action: Action, observed: Observed) -> None:
        """Sleeping lanes rule 1 again right before a create beside sleeping lanes of ours: each still says it
        sleeps on a fresh observation (one may have woken itself by a restart since the plan)."""
        beside = [
            c.id
            for c in observed.containers
            if c.active and self.desired.sleeps(c.recipe) and set(c.slots) & set(action.gpus)
        ]
        if not beside:
            return
        why = awake_beside(self.desired, self.observe(), action.gpus)
        if why:
            raise ActionRefused(f"enter of {action.container} refused: {why}", reason="lane_awake")

    def _bring_up(
        self,
        action: Action,
        recipe: Recipe,
        cid: str,
        *,
        start: bool,
        freed: int,
    ) -> tuple[str, int]:
        """Start (unless it runs already), wait for health, check, and record the container as healthy."""
        slots = action.gpus
        try:
            # From create to settled the engine loads its model through the page cache: no drop meanwhile.
            with pagecache.entering():
                if start:
                    self.progress.phase(action, "starting")
                    self.ops.start(cid)
                self._wait_healthy(action, cid, recipe)
                after = self._check_enter(action, cid)
            verdict = self.check_reserve(action, after)
        except ActionFailed as exc:
            self._fail_enter(action, cid, exc)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine error once the container exists (a 5xx on inspect
            # after its retries): the same failed-enter path, so the container is stopped and kept, never left running
            # while the loop backs off and a fallback could be entered on its cards
            self._fail_enter(action, cid, ActionFailed(f"{type(exc).__name__}: {exc}"))
        # Only now does it count as satisfied: one left waiting by an interrupt is finished by the next pass.
        containers, docker_ok = self.observer.observe()
        with self._files_lock:
            mark_healthy(self.desired.host.name, cid, existing=[c.id for c in containers] if docker_ok.ok else None)
        if recipe.sleep is not None:
            self._record_memory(cid, "awake", after)
        self._note_version(recipe)
        detail = f"{action.container} healthy on {','.join(slots)}"
        if freed:
            detail += f" (reclaimed {human_bytes(freed)} of orphan offload files first)"
        if verdict.checked:
            detail += f"; free VRAM {verdict.message()}"
            if verdict.below:
                detail += " (gpu_reserve policy report: the lane stays)"
        under = self._figures().get("vram_under_load") or {}
        if under.get("below"):
            detail += f"; under its preflight's load {', '.join(under['below'])} fell below the reserve (policy report)"
        return detail, freed

    def _record_memory(self, cid: str, how: str, observed: Observed) -> dict[str, int]:
        """What the lane's processes hold on each card now (NVML only), recorded for its next wake's check."""
        gpus = observed.gpus
        if gpus.telemetry != "nvml" or not gpus.source.ok:
            return {}
        held = {
            slot: sum(p.used_bytes or 0 for p in view.processes if p.container_id == cid)
            for slot, view in gpus.slots.items()
            if any(p.container_id == cid for p in view.processes)
        }
        existing = [x.id for x in observed.containers] if observed.docker.ok else None
        with self._files_lock:
            record_lane_memory(self.desired.host.name, cid, how, held, existing=existing)
        return held

    def _note_version(self, recipe: Recipe) -> None:
        """The lane's vLLM release (its GET /version), into the outcome and so the audit record; none when it does
        not say."""
        origin = recipe.api_origin()
        if origin is None:
            return
        try:
            answer = self.io.lanes.request(origin + "/version", None, 1.0)
        except direct_http.errors():
            return
        version = parse_version(answer.body) if answer.status == 200 else None
        if version:
            self._note("vllm_version", version)

    def check_reserve(self, action: Action, observed: Observed) -> ReserveVerdict:
        """The free VRAM of the enter's slots, sampled once its lane is healthy and settled, against their
        reserve. Under ``enforce`` a slot below it (or with no figure) raises ``BelowReserve``: the enter failed.
        Under ``report`` the verdict goes into the outcome and the lane stays."""
        verdict = enter_reserve_verdict(self.desired, action.recipe, observed.gpus, action.gpus)
        self._note("gpu_reserve", verdict.to_json())
        if verdict.failed:
            how = "end below the free-VRAM reserve" if verdict.below else "report no free-VRAM figure to check"
            raise BelowReserve(
                f"{action.container} is healthy but its GPUs {how} (gpu_reserve policy enforce): {verdict.message()}"
            )
        return verdict

    def _wait_healthy(self, action: Action, cid: str, recipe: Recipe) -> None:
        h = recipe.health
        t0 = self.io.clock.monotonic()
        running_since: float | None = None
        restarts: int | None = None
        while True:
            elapsed = self.io.clock.monotonic() - t0
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while waiting for {action.container}; it keeps its labels")
            self._check_still_wanted(action)
            st = self.ops.inspect(cid).get("State") or {}
            if st.get("Status") in ENDED_STATES:
                raise ActionFailed(f"{action.container} exited with code {st.get('ExitCode')} during start")
            if st.get("Status") == "running":
                running_since = running_since or self.io.clock.monotonic()
                count = int(st.get("RestartCount") or 0)
                if restarts is not None and count != restarts:
                    running_since = self.io.clock.monotonic()
                restarts = count
                if h.url:
                    # Asked only once every listener on its ports is the container's own: a squatter is named,
                    # never asked (it would answer the health check and receive the probes' prompts).
                    if self._ports_ours(action, cid, recipe) and self.io.lanes.health_ok(h.url):
                        self._settle_after_health(action, cid, recipe, restarts)
                        self._require_ports_ours(action, cid, recipe)
                        self._run_probes(action, recipe)
                        return
                elif self.io.clock.monotonic() - running_since >= h.settle_s:
                    self._require_ports_ours(action, cid, recipe)
                    self._run_probes(action, recipe)
                    return
            if elapsed >= h.start_timeout_s:
                unknown = self._unknown_listeners.pop(cid, None)
                raise ActionFailed(
                    f"{action.container} not healthy within {h.start_timeout_s:g} s "
                    f"({'GET ' + h.url if h.url else 'running for settle_s'}); raise health.start_timeout_s "
                    "in the recipe if it needs longer" + (f" ({unknown}; it was never asked)" if unknown else "")
                )
            # Without a health URL the lane is serving once it ran, not restarted, for settle_s: say that, not a
            # wait for a URL it does not have.
            waiting = (
                "waiting for its health URL"
                if h.url
                else f"no health URL: serving once running and not restarted for settle_s ({h.settle_s:g} s)"
            )
            self.progress.phase(action, f"loading: {waiting}", elapsed=elapsed, timeout=h.start_timeout_s)
            self.io.clock.sleep(self.poll_s)

    def _check_still_wanted(self, action: Action) -> None:
        """At each health poll of an enter, in the loop: an edit made meanwhile that leaves its lane unwanted (a
        wrong recipe fixed a second later, a switch) abandons it now rather than at its start timeout. Cheap while
        nothing was edited (the loop's check compares a counter of file events)."""
        check = self.superseded
        if check is None or action.kind is not ActionKind.ENTER:
            return
        why = check(action)
        if why:
            raise Superseded(f"superseded while waiting for its health: {why}")

    def _run_probes(self, action: Action, recipe: Recipe) -> None:
        """The recipe's ``preflight`` suite, once its health URL answered: each probe in order, the first that
        fails fails the enter (``ProbeFailed``: the reason names the probe and what came back). Meanwhile the free
        VRAM of its cards is sampled; under ``enforce`` a card whose lowest figure is below its reserve fails the
        enter too (``BelowReserve``, naming the card, the figure and the probe that was running then)."""
        # the start-up budget: a converged `reconciler apply` runs no probe (docs/performance.md, its commands table)
        from reconciler.apply.probes import ProbeSpec, run_suite
        from reconciler.store.probe_history import record_suite

        def before(probe: ProbeSpec, i: int, n: int) -> None:
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while probing {action.container}; it keeps its labels")
            self.progress.phase(action, f"probes: {probe.name} ({i + 1}/{n})", timeout=probe.timeout_s)

        assert action.recipe is not None
        run = run_suite(
            self.desired, action.recipe, "preflight", slots=action.gpus, before=before, stop_at_failure=True
        )
        self._note("probes", [r.to_json() for r in run.results])
        self._note("vram_under_load", run.vram.to_json())
        if run.planned:
            record_suite(self.desired.host.name, run.to_json())
        failed = run.first_failure
        if failed is not None:
            raise ProbeFailed(failed.reason())
        if run.vram.failed:
            how = "fell below the free-VRAM reserve" if run.vram.below else "gave no free-VRAM figure to check"
            raise BelowReserve(
                f"{action.container} passed its preflight probes, but under their load its GPUs {how} "
                f"(gpu_reserve policy enforce): {run.vram.message()}"
            )

    def _check_health_url_free(self, action: Action, recipe: Recipe) -> None:
        """Preflight: nothing may answer the health URL before the container starts. If something does (a stale
        server on the port, another lane with host networking), a health check would pass for it and report a
        container healthy that dies moments later on "Address already in use"."""
        url = recipe.health.url
        if not url:
            return
        what = self.io.lanes.answer(url)
        if what is not None:
            raise ActionFailed(
                f"health URL {url} of recipe {action.recipe} already answers ({what}) before {action.container} "
                "is started: something else serves on its port (a stale server, another lane with host "
                "networking), so its health check cannot tell the new engine from it. Stop what listens there, "
                "or give the recipe another port and health.url; nothing was created"
            )

    def _settle_after_health(self, action: Action, cid: str, recipe: Recipe, restarts: int | None) -> None:
        """After the health URL answered: the container must still be running then, and still after settle_s."""
        h = recipe.health

        def check(when: str) -> None:
            st = self.ops.inspect(cid).get("State") or {}
            status = st.get("Status")
            if status != "running":
                how = f"exited with code {st.get('ExitCode')}" if status in ENDED_STATES else f"is {status}"
                raise ActionFailed(
                    f"{action.container} {how} {when}: what answered {h.url} was not (only) this container"
                )
            if restarts is not None and int(st.get("RestartCount") or 0) != restarts:
                raise ActionFailed(f"{action.container} restarted {when}")

        check("right after its health URL answered")
        t0 = self.io.clock.monotonic()
        while (elapsed := self.io.clock.monotonic() - t0) < h.settle_s:
            if self.cancel.is_set():
                raise Cancelled(f"stop requested while {action.container} settles; it keeps its labels")
            self.progress.phase(action, "health: answered, settling", elapsed=elapsed, timeout=h.settle_s)
            self.io.clock.sleep(min(self.poll_s, max(0.0, h.settle_s - elapsed)))
            check(f"within health.settle_s ({h.settle_s:g} s) after its health URL answered")

    def _check_enter(self, action: Action, cid: str) -> Observed:
        """Postcondition: running and holding exactly its slots (by Docker, and by NVML where it is on).
        Returns that observation (its GPU figures are the enter's free-VRAM sample)."""
        observed = self.observe()
        mine = next((c for c in observed.containers if c.id == cid), None)
        if mine is None or not mine.active:
            raise ActionFailed(f"{action.container} is not running after it became healthy")
        held = {slot for slot, cs in slot_holders(self.desired, observed).items() if mine in cs}
        if held != set(action.gpus):
            raise ActionFailed(f"{action.container} holds slots {sorted(held)}, expected {list(action.gpus)}")
        if observed.gpus.telemetry == "nvml":
            if not observed.gpus.source.ok:
                raise ActionFailed(f"GPU telemetry unavailable after enter: {observed.gpus.source.detail}")
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

    def _fail_enter(self, action: Action, cid: str, exc: ActionFailed, *, what: str = "enter") -> NoReturn:
        """Keep the failed container for its logs, reclaim its unmapped shm, free the GPUs; then raise."""
        how = "superseded" if isinstance(exc, Superseded) else "failed"
        self.progress.phase(action, f"{how}: keeping the container, reclaiming its shm")
        logs = self.ops.logs_tail(cid)
        # Its own offload files: those its container is seen holding now, and no other process. The only ones this
        # failed enter reclaims (the guard still proves each unowned, twice). A file that merely appeared since its
        # create may be another program's: a crash before its container was seen mapping it leaves it to the next
        # plan, which reclaims it as an orphan once nothing can own it.
        now = self.observe()
        names = {c.name for c in now.containers if c.id == cid} | {cid, cid[:12]}
        its_files = [f.path for f in now.shm.held_only_by(names)]
        if action.kind is ActionKind.WAKE:  # its file existed when planned: only as the plan listed it on the wake
            its_files = [p for p in its_files if p in action.paths]
        try:
            self.ops.stop(cid, 5)
        except Exception:  # noqa: BLE001 - a stop that fails for good: kill it, and say so below if it still runs
            self.ops.kill(cid)
        try:
            kept = self.ops.preserve(cid, action.container or cid[:12])
        except Exception as err:  # noqa: BLE001 - the name stays taken; the next plan sees a stopped container of ours
            kept = f"{action.container or cid[:12]} (not renamed: {type(err).__name__}: {err})"
        self._prune_kept(action.container or cid[:12])
        freed_note = ""
        res = self._guarded_reclaim(only_paths=its_files, claimed=its_files)
        if res.reclaimed_bytes:
            freed_note = f"; reclaimed {res.reclaimed_bytes} bytes of its offload file"
        elif res.refused:
            freed_note = f"; its offload file was not reclaimed: {res.refused}"
        observed = self.observe()
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
