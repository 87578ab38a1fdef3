"""An enter: a lane brought up on its slots, and what it must prove before it counts as serving.

Preflight: the image is present, the lane's ports are free and nothing answers its health URL, the tmpfs has room
for its offload file (safety rules 6 and 7 of docs/design.md). Act: create (labelled in the same call, its token
recorded first: rule 9), start, wait for health, settle, run the ``preflight`` probes, check its slots and free
VRAM (``reconciler.apply.serving``, which a wake's proof shares). A failed enter keeps its stopped container for the
logs, reclaims its own unmapped offload file through the guard and frees the GPUs. ``EnterSteps`` runs it over the
action's context (``reconciler.apply.context``), for ``Applier`` (``reconciler.apply.applier``).
"""

from __future__ import annotations

import secrets

from reconciler.apply import pagecache
from reconciler.apply.context import ActionContext
from reconciler.apply.engine_ops import create_spec
from reconciler.apply.errors import ActionFailed, ActionRefused, Cancelled, Superseded
from reconciler.apply.port_checks import check_ports_free, ports_ours, require_ports_ours
from reconciler.apply.serving import check_enter, check_reserve, fail_enter, note_version, record_memory, run_probes
from reconciler.base.units import human_bytes
from reconciler.load.secrets import SecretError
from reconciler.load.secrets import resolve as resolve_secrets
from reconciler.model import Recipe
from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.observed import ENDED_STATES, LABEL_CREATE_TOKEN, Observed
from reconciler.plan.sleeping import awake_beside
from reconciler.store.state import ensure_install_id, mark_healthy, record_created, record_pending


class EnterSteps:
    """An enter over the action's context: preflight, create, start, wait for health, probes, postcondition; a failed
    one kept for its logs."""

    def __init__(self, ctx: ActionContext):
        self.ctx = ctx

    def enter(self, action: Action, observed: Observed) -> tuple[str, int]:
        assert action.recipe is not None
        recipe = self.ctx.desired.recipes[action.recipe]
        slots = action.gpus
        freed = 0
        if action.container_id:
            # A container of ours left waiting for its health check (an apply stopped meanwhile): finish the wait
            # on it rather than restart a model load. It was created and started already; nothing to preflight.
            cid = action.container_id
            self.ctx.progress.phase(action, "finishing: waiting again for the container left waiting")
            return self._bring_up(action, recipe, cid, start=False, freed=0)
        # Preflight: the image, then tmpfs room for the offload file (orphans reclaimed through the guard).
        self.ctx.progress.phase(action, "preflight")
        if not self.ctx.ops.image_present(recipe.container.image):
            raise ActionFailed(
                f"image {recipe.container.image} is not present on this host: pull or build it "
                f"(recipe {action.recipe}, container.image)"
            )
        check_ports_free(self.ctx, action, recipe)
        self._check_health_url_free(action, recipe)
        need = recipe.offload.capacity_bytes
        reserve = self.ctx.desired.host.shm.reserve_bytes if need else 0
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
        if self.ctx.cancel.is_set():
            raise Cancelled("stop requested before create; nothing created")
        self._check_beside_sleeping(action, observed)
        # Act: create (labelled in the same call, so an interrupt never leaves it unowned), start, wait for health.
        self.ctx.progress.phase(action, "starting: create")
        install_id = ensure_install_id(self.ctx.desired.host.name)
        refs = recipe.container.env_refs().values()
        try:
            values = resolve_secrets(self.ctx.desired.host.secrets.env_file, refs) if refs else None
        except SecretError as exc:
            raise ActionFailed(f"recipe {action.recipe}: secret env value {exc}") from None
        create = create_spec(self.ctx.desired, action.recipe, slots, install_id=install_id, secrets=values)
        # The proof of ownership: the create's token is recorded before the create (a lost answer still names the
        # container by its name and token), its id once the engine answers (docs/design.md, safety rule 9).
        token = secrets.token_hex(16)
        create["labels"] = {**create["labels"], LABEL_CREATE_TOKEN: token}
        host = self.ctx.desired.host.name
        with self.ctx.files_lock:
            record_pending(host, create["name"], token)
        cid = self.ctx.ops.create(create)
        with self.ctx.files_lock:
            record_created(host, cid, token=token)
        # Rule 1 once more with the container made, right before its start: the window in which a sleeping lane
        # beside it could wake itself unseen is the start call alone.
        try:
            self._check_beside_sleeping(action, observed)
        except ActionRefused:
            self.ctx.ops.remove(cid)  # created, never started: it held nothing
            raise
        return self._bring_up(action, recipe, cid, start=True, freed=freed)

    def _check_beside_sleeping(self, action: Action, observed: Observed) -> None:
        """Sleeping lanes rule 1 again right before a create beside sleeping lanes of ours: each still says it
        sleeps on a fresh observation (one may have woken itself by a restart since the plan)."""
        beside = [
            c.id
            for c in observed.containers
            if c.active and self.ctx.desired.sleeps(c.recipe) and set(c.slots) & set(action.gpus)
        ]
        if not beside:
            return
        why = awake_beside(self.ctx.desired, self.ctx.observe(), action.gpus)
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
                    self.ctx.progress.phase(action, "starting")
                    self.ctx.ops.start(cid)
                self._wait_healthy(action, cid, recipe)
                after = check_enter(self.ctx, action, cid)
            verdict = check_reserve(self.ctx, action, after)
        except ActionFailed as exc:
            fail_enter(self.ctx, action, cid, exc)
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine error once the container exists (a 5xx on inspect
            # after its retries): the same failed-enter path, so the container is stopped and kept, never left running
            # while the loop backs off and a fallback could be entered on its cards
            fail_enter(self.ctx, action, cid, ActionFailed(f"{type(exc).__name__}: {exc}"))
        # Only now does it count as satisfied: one left waiting by an interrupt is finished by the next pass.
        containers, docker_ok = self.ctx.observer.observe()
        with self.ctx.files_lock:
            mark_healthy(self.ctx.desired.host.name, cid, existing=[c.id for c in containers] if docker_ok.ok else None)
        if recipe.sleep is not None:
            record_memory(self.ctx, cid, "awake", after)
        note_version(self.ctx, recipe)
        detail = f"{action.container} healthy on {','.join(slots)}"
        if freed:
            detail += f" (reclaimed {human_bytes(freed)} of orphan offload files first)"
        if verdict.checked:
            detail += f"; free VRAM {verdict.message()}"
            if verdict.below:
                detail += " (gpu_reserve policy report: the lane stays)"
        under = self.ctx.figures().get("vram_under_load") or {}
        if under.get("below"):
            detail += f"; under its preflight's load {', '.join(under['below'])} fell below the reserve (policy report)"
        return detail, freed

    def _wait_healthy(self, action: Action, cid: str, recipe: Recipe) -> None:
        h = recipe.health
        t0 = self.ctx.io.clock.monotonic()
        running_since: float | None = None
        restarts: int | None = None
        while True:
            elapsed = self.ctx.io.clock.monotonic() - t0
            if self.ctx.cancel.is_set():
                raise Cancelled(f"stop requested while waiting for {action.container}; it keeps its labels")
            self._check_still_wanted(action)
            st = self.ctx.ops.inspect(cid).get("State") or {}
            if st.get("Status") in ENDED_STATES:
                raise ActionFailed(f"{action.container} exited with code {st.get('ExitCode')} during start")
            if st.get("Status") == "running":
                running_since = running_since or self.ctx.io.clock.monotonic()
                count = int(st.get("RestartCount") or 0)
                if restarts is not None and count != restarts:
                    running_since = self.ctx.io.clock.monotonic()
                restarts = count
                if h.url:
                    # Asked only once every listener on its ports is the container's own: a squatter is named,
                    # never asked (it would answer the health check and receive the probes' prompts).
                    if ports_ours(self.ctx, action, cid, recipe) and self.ctx.io.lanes.health_ok(h.url):
                        self._settle_after_health(action, cid, recipe, restarts)
                        require_ports_ours(self.ctx, action, cid, recipe)
                        run_probes(self.ctx, action, recipe)
                        return
                elif self.ctx.io.clock.monotonic() - running_since >= h.settle_s:
                    require_ports_ours(self.ctx, action, cid, recipe)
                    run_probes(self.ctx, action, recipe)
                    return
            if elapsed >= h.start_timeout_s:
                unknown = self.ctx.unknown_listeners.pop(cid, None)
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
            self.ctx.progress.phase(action, f"loading: {waiting}", elapsed=elapsed, timeout=h.start_timeout_s)
            self.ctx.io.clock.sleep(self.ctx.poll_s)

    def _check_still_wanted(self, action: Action) -> None:
        """At each health poll of an enter, in the loop: an edit made meanwhile that leaves its lane unwanted (a
        wrong recipe fixed a second later, a switch) abandons it now rather than at its start timeout. Cheap while
        nothing was edited (the loop's check compares a counter of file events)."""
        check = self.ctx.superseded
        if check is None or action.kind is not ActionKind.ENTER:
            return
        why = check(action)
        if why:
            raise Superseded(f"superseded while waiting for its health: {why}")

    def _check_health_url_free(self, action: Action, recipe: Recipe) -> None:
        """Preflight: nothing may answer the health URL before the container starts. If something does (a stale
        server on the port, another lane with host networking), a health check would pass for it and report a
        container healthy that dies moments later on "Address already in use"."""
        url = recipe.health.url
        if not url:
            return
        what = self.ctx.io.lanes.answer(url)
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
            st = self.ctx.ops.inspect(cid).get("State") or {}
            status = st.get("Status")
            if status != "running":
                how = f"exited with code {st.get('ExitCode')}" if status in ENDED_STATES else f"is {status}"
                raise ActionFailed(
                    f"{action.container} {how} {when}: what answered {h.url} was not (only) this container"
                )
            if restarts is not None and int(st.get("RestartCount") or 0) != restarts:
                raise ActionFailed(f"{action.container} restarted {when}")

        check("right after its health URL answered")
        t0 = self.ctx.io.clock.monotonic()
        while (elapsed := self.ctx.io.clock.monotonic() - t0) < h.settle_s:
            if self.ctx.cancel.is_set():
                raise Cancelled(f"stop requested while {action.container} settles; it keeps its labels")
            self.ctx.progress.phase(action, "health: answered, settling", elapsed=elapsed, timeout=h.settle_s)
            self.ctx.io.clock.sleep(min(self.ctx.poll_s, max(0.0, h.settle_s - elapsed)))
            check(f"within health.settle_s ({h.settle_s:g} s) after its health URL answered")
