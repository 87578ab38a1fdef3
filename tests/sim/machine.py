"""The stateful test: hypothesis drives the simulated host through edits, faults and time, with the project's real
loader, planner, apply layer and loop on top, and checks the invariants after every step.

Invariants (docs/design.md, safety rule 11): (a) never two containers running on one physical card because of the
tool; (b) nothing this install did not create is stopped, removed, renamed or killed; (c) no file mapped or held by a
live process, and nothing outside shm.dir + pattern, is unlinked, and the /proc scan (which the world changes while
it reads: forks, exits, mappings handed down by fork, reused pids) never misses a holder that held its file all
through it: the kernel's write lease, the last gate, is modelled from the truth and must never be the only thing
that kept a file; (d) ``apply`` of a shown plan does nothing outside
it, and an approval (a saved plan, a prompt) made under one commit of a git source never runs under another that
changed what the host reads: stale, it writes nothing and says the source moved, naming both commits; (e) no exception escapes a pass; (f) once faults stop, the host converges or is blocked by something that is
really there, within a bounded number of passes; (g) no fallback starts while a container of the held lane runs
(a fallback's start is judged by (a)); (j) no plan the tool makes stops (leaves or puts to sleep) a live lane on a
card a blocked action of the same plan wanted (blockers are scoped to their slots; sleeping lanes rule 8); (k) two
switches at once lose no update (safety rule 8's lock of the manifest's edits): none writes over a topology it did
not read, the file holds the last winner's topology with every other byte kept, and each is audited as it ended;
(l) and (m), the front door's (``sim.door``): nothing sent to a lane that is not healthy and awake or whose drain
began before the door's last look, and no demand switch to a topology seen blocked or within min_dwell_s. Sleeping lanes (docs/design.md, rules 1-6), by the world's truth: (1) no two
lanes of ours awake on one card, and no wake beside one; (2) no wake onto a card something foreign uses, or into
memory that is not free when the tool could know it; (3) status never calls a sleeping lane awake; (4) no unlink of a
sleeping lane's offload file is tried; (5) no POST /sleep with requests in flight its drain never saw idle; (6) a
lane whose sleep or wake failed is stopped (left, or a failed enter) by the end of the pass.
"""

from __future__ import annotations

import io
import re
from collections import deque
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sim.door_steps import DoorSteps, door_starts
from sim.seams import installed
from sim.world import GIB, LIVE_STATES, World

SLOTS = ("dark-compute-a", "dark-compute-b")
RECIPES = {
    # name: (tensor parallel size, offload GiB, port)
    "omni": (1, 0, 18001),
    "small": (1, 4, 18002),
    "big": (2, 8, 18003),
    "medium": (1, 2, 18004),
    # Recipes with [sleep] (vLLM's sleep mode), each on a port of its own: the lanes of standby topologies.
    "sleepa": (1, 0, 18011),
    "sleepb": (1, 0, 18012),
    "sleepbig": (2, 0, 18013),
    "sleepoff": (1, 2, 18014),
}
# The [sleep] level of each recipe that has one (sleepoff with native offload: allow_with_offload).
SLEEP_LEVELS = {"sleepa": 1, "sleepb": 2, "sleepbig": 2, "sleepoff": 1}
TOPOLOGIES = {
    "empty": [],
    "split": [("omni", ["dark-compute-b"])],
    "split2": [("omni", ["dark-compute-b"]), ("small", ["dark-compute-a"])],
    "swapped": [("small", ["dark-compute-b"]), ("omni", ["dark-compute-a"])],
    "exclusive": [("big", ["dark-compute-a", "dark-compute-b"])],
    "exclusive-rev": [("big", ["dark-compute-b", "dark-compute-a"])],
    "swapped-omni-a": [("omni", ["dark-compute-a"])],
    # Two native-offload lanes side by side: when one leaves or dies, its file must go while the other serves.
    "two-offload": [("small", ["dark-compute-a"]), ("medium", ["dark-compute-b"])],
    "one-offload": [("small", ["dark-compute-a"])],
}
# Manifests of named topologies (topologies:, topology:, standby:): name -> (topologies, standby). A switch between
# them is the operator's ``reconciler switch`` (or an edit of topology:), a step like any other.
NAMED = {
    "standby": (
        {
            "split": [("sleepa", ["dark-compute-a"]), ("sleepb", ["dark-compute-b"])],
            "exclusive": [("sleepbig", ["dark-compute-a", "dark-compute-b"])],
            "solo": [("sleepa", ["dark-compute-a"])],
        },
        ["split", "exclusive"],
    ),
    "standby-offload": (
        {
            "split": [("sleepoff", ["dark-compute-a"]), ("sleepb", ["dark-compute-b"])],
            "exclusive": [("sleepbig", ["dark-compute-a", "dark-compute-b"])],
            "solo": [("sleepa", ["dark-compute-a"])],
        },
        ["split", "exclusive"],
    ),
    # Only the exclusive lane on standby: the split's lane leaves on a switch, the big one sleeps beside it.
    "standby-half": (
        {
            "split": [("omni", ["dark-compute-b"])],
            "exclusive": [("sleepbig", ["dark-compute-a", "dark-compute-b"])],
            "solo": [("omni", ["dark-compute-a"])],
        },
        ["exclusive"],
    ),
}
# How the two slots name their cards: by index, by UUID, mixed, or (a host error) both naming card 0.
HOST_SHAPES = ("index", "uuid", "mixed", "alias-index-uuid", "alias-uuid-case")
LIVENESS_PASSES = 8
# One run in GIT_SHARE + 1 follows a git source (each commit and fetch runs git's processes: a run that follows one
# costs some ten of the others; tests/sim/test_sim.py runs a budget of them alone). -1: every run.
GIT_SHARE = [int(__import__("os").environ.get("SIM_GIT_SHARE", "47"))]

# Steps taken by every machine in this process (the soak's counter).
STEPS = [0]


def budget(examples: int) -> Any:
    """Hypothesis's settings for a derandomised budget of ``examples`` runs of a machine, 50 steps each (CI's)."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples,
        stateful_step_count=50,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def run_every_time(machine: type[RuleBasedStateMachine], share: list[int], examples: int) -> None:
    """A derandomised budget of ``examples`` runs of ``machine`` (50 steps each) with the drawn share ``share`` (a
    ``*_SHARE`` list: one run in ``share[0] + 1``) forced to every run, restored after."""
    from hypothesis.stateful import run_state_machine_as_test

    kept = share[0]
    share[0] = -1
    try:
        run_state_machine_as_test(machine, settings=budget(examples))
    finally:
        share[0] = kept


class _Sink(io.TextIOBase):
    """The loop's log: the last lines only (shown with a failure), never the whole run's."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=60)

    def write(self, s: str) -> int:
        if s.strip():
            self.lines.append(s.rstrip())
        return len(s)


class HostMachine(DoorSteps, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self._ctx: Any = None
        self.loop: Any = None
        self.sink = _Sink()
        self.topology = "empty"
        self.edits = {r: 0 for r in RECIPES}
        self.images = {r: "sim-vllm:1" for r in RECIPES}  # the image each recipe names
        # What a commit of the git source changes in a recipe beside its image: its regression probe and its drain.
        self.probes = {r: 0 for r in RECIPES}
        self.drains = {r: 20 for r in RECIPES}
        # The host's git source, when it follows one (its manifests and recipes then live in the repository's work
        # tree, ``self.tree``, and land as commits); else the root's own files.
        self.source: Any = None
        self.tree = Path()
        self.steps_since_adopt_check = 0
        self.stale_words: list[str] = []  # the changes the last saved plan's apply found
        self.races = 0  # switches_race's calls, naming each racer's caller in the audit trail
        # Plans a second terminal saved (``plan --out FILE``), as their files hold them, newest last.
        self.saved: deque[dict[str, Any]] = deque(maxlen=4)
        # An interactive ``apply`` whose prompt waits for its answer while the host goes on.
        self.prompt: Any = None
        # Containers a second terminal's ``adopt`` made this install's: ours from then on, for the checker too.
        self.adopted: set[str] = set()
        # The tool ran in the last step (a pass, an apply), and its stop was requested during it.
        self.tool_ran = False
        self.interrupted = False

    # ------------------------------------------------------------ set-up and files

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        shape=st.sampled_from(HOST_SHAPES),
        gpu_requests=st.booleans(),
        wsl2=st.booleans(),
        tmpfs_gib=st.sampled_from([10.0, 14.0, 20.0]),
        telemetry=st.sampled_from(["nvml", "nvml", "none"]),
        podman=st.booleans(),
        nvml_hides_identity=st.booleans(),
        # Desired state from a git source in a share of the runs (GIT_SHARE).
        git=st.deferred(
            lambda: st.sampled_from([False] * GIT_SHARE[0] + [True]) if GIT_SHARE[0] >= 0 else st.just(True)
        ),
        # The front door open from the start in a share of the runs (sim.door.DOOR_SHARE); the others may open it.
        door=st.deferred(door_starts),
    )
    def setup(
        self,
        seed: int,
        shape: str,
        gpu_requests: bool,
        wsl2: bool,
        tmpfs_gib: float,
        telemetry: str = "nvml",
        podman: bool = False,
        nvml_hides_identity: bool = False,
        git: bool = False,
        door: Any = None,
    ) -> None:
        self.world = World(seed, tmpfs_gib=tmpfs_gib, wsl2=wsl2)
        self.world.podman = podman
        self.world.nvml_hides_identity = nvml_hides_identity
        self.world.behaviour = {}
        self.world.ports = {r: port for r, (_, _, port) in RECIPES.items()}
        self.shape = shape
        self._ctx = installed(self.world)
        state = self._ctx.__enter__()
        self.root = Path(state) / "root"
        (self.root / "configs" / "recipes").mkdir(parents=True)
        (self.root / "manifests").mkdir()
        self.tree = self.root
        if git:
            from sim.source import SimSource

            self.source = SimSource(Path(state) / "repo")
            self.tree = self.source.path
        # Without telemetry only the engine says who holds a card (the loader refuses slots named by index and UUID
        # side by side then: nothing could tell whether they are one card).
        if shape in ("mixed", "alias-index-uuid"):
            telemetry = "nvml"
        self.telemetry = telemetry
        self.world.telemetry = telemetry
        self._write_host(shape, gpu_requests, telemetry)
        for r in RECIPES:
            self._write_recipe(r)
        self._write_manifest("empty")
        self._publish("the recipes, and no lane yet")
        self._new_loop()
        self._sync()
        self._open_door(door)

    def _write_host(self, shape: str, gpu_requests: bool, telemetry: str = "nvml") -> None:
        w = self.world
        assert w is not None
        u0, u1 = w.cards[0].uuid, w.cards[1].uuid
        slots = {
            "index": ({"index": 0}, {"index": 1}),
            "uuid": ({"uuid": u0}, {"uuid": u1}),
            "mixed": ({"uuid": u0}, {"index": 1}),
            "alias-index-uuid": ({"uuid": u0}, {"index": 0}),
            "alias-uuid-case": ({"uuid": u0}, {"uuid": "GPU-" + u0[4:].upper()}),
        }[shape]
        gpus = "\n".join(
            f"  {s}: {{{', '.join(f'{k}: {v}' for k, v in g.items())}}}" for s, g in zip(SLOTS, slots, strict=True)
        )
        (self.root / "configs" / "host.yaml").write_text(
            f"name: sim\ngpus:\n{gpus}\ngpu_telemetry: {telemetry}\n"
            f"docker: {{url: 'unix:///sim/docker.sock', gpu_requests: {str(gpu_requests).lower()}, keep_failed: 2}}\n"
            "shm: {dir: /dev/shm, confirm_interval_s: 2.0, reserve_gib: 1, ignore_uninspectable_pids: [1]}\n"
            "gpu_reserve: {free_gib: 3.0, policy: report, idle_used_gib: 1.0}\n"
            + (
                # The loop's own fetch once a day of the world's clock (and at a new loop's first pass); a second
                # terminal's sync at any step.
                f"source: {{git: '{self.source.path}', ref: main, path: ., interval_s: 86400, "
                "allow: {network_host: true}}\n"
                if self.source is not None
                else ""
            )
        )

    def _write_recipe(self, name: str) -> None:
        tp, offload, port = RECIPES[name]
        level = SLEEP_LEVELS.get(name)
        flag, dev = (', "--enable-sleep-mode"', ', VLLM_SERVER_DEV_MODE = "1"') if level else ("", "")
        text = (
            f'description = "simulated {name}"\ntensor_parallel_size = {tp}\n'
            f'[model]\nid = "sim/{name}"\n'
            f'[container]\nimage = "{self.images[name]}"\ncommand = ["vllm", "serve", "sim/{name}"{flag}]\n'
            f'env = {{SIM_OFFLOAD_BYTES = "{int(offload * GIB)}", SIM_BOOT_S = "3", SIM_EDIT = "{self.edits[name]}"'
            f"{dev}}}\n"
            f"[offload]\nenabled = {'true' if offload else 'false'}\ncapacity_gib = {offload}\n"
            f'[health]\nurl = "http://127.0.0.1:{port}/health"\nsettle_s = 1\nstart_timeout_s = 30\n'
            f"[stop]\ntimeout_s = 10\n[drain]\ntimeout_s = {self.drains[name]}\n"
            '[[probes]]\nname = "smoke"\nsuite = "regression"\n'
            f'prompt = "Reply with the single word: ready ({self.probes[name]})"\n'
        )
        if level:
            # sleepoff: the simulated image is taken as requalified for sleep with native offload (vLLM #45268).
            text += f"[sleep]\nlevel = {level}\ntimeout_s = 5\n" + ("allow_with_offload = true\n" if offload else "")
        (self.tree / "configs" / "recipes" / f"{name}.toml").write_text(text)

    def _write_manifest(self, topology: str) -> None:
        lines = ["host: sim", "assignments:" + (" []" if not TOPOLOGIES[topology] else "")]
        for recipe, slots in TOPOLOGIES[topology]:
            lines.append(f"  - {{recipe: {recipe}, gpus: [{', '.join(slots)}]}}")
        (self.tree / "manifests" / "sim.yaml").write_text("\n".join(lines) + "\n")
        self.topology = topology

    def _write_named(self, name: str, topology: str) -> None:
        topologies, standby = NAMED[name]
        lines = ["host: sim", f"topology: {topology}", "topologies:"]
        for t, lanes in topologies.items():
            lines.append(f"  {t}:")
            for recipe, slots in lanes:
                lines.append(f"    - {{recipe: {recipe}, gpus: [{', '.join(slots)}]}}")
        lines.append(f"standby: [{', '.join(standby)}]")
        (self.tree / "manifests" / "sim.yaml").write_text("\n".join(lines) + "\n")
        self.topology = f"{name}:{topology}"

    def _publish(self, message: str) -> None:
        """The operator's edits land where the host reads them: at once for a root's own files; as a commit of the
        git source (taken by the host at its next fetch) when it follows one."""
        if self.source is not None:
            self.source.commit(message)

    def _sync(self) -> None:
        """``reconciler sync`` in a second terminal: the source fetched now, its newest commit taken when it validates
        (a broken one is refused and the commit in use kept). Only when a commit landed since the last sync: a fetch
        that finds nothing new is git's processes for nothing."""
        if self.source is None or self.source.synced == self.source.commits:
            return
        self.source.synced = self.source.commits
        from reconciler.base.errors import ReconcilerError
        from reconciler.load.git_source import GitError
        from reconciler.service import Caller, HostService

        try:
            HostService(str(self.root), caller=Caller("cli", "second terminal"), io=self.world.io).sync()
        except GitError as exc:
            self.world.violate(f"(e) reconciler sync of a local repository failed: {exc}")
        except ReconcilerError:
            return  # the host file itself is refused (two slots on one card): said, and nothing is fetched

    def _commit_in_use(self) -> str | None:
        """The commit of the git source the host reads now (None without a source, or before the first)."""
        if self.source is None:
            return None
        from reconciler.store.source import read_source_record

        return read_source_record("sim").commit

    def _new_loop(self) -> None:
        from reconciler.loop import Loop
        from reconciler.loop.backoff import Backoff
        from reconciler.loop.log import Log

        w = self.world
        assert w is not None
        self.loop = Loop(str(self.root), log=Log(stream=self.sink), backoff=Backoff(clock=lambda: w.wall()), io=w.io)

    def teardown(self) -> None:
        self._close_door()
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None

    # ------------------------------------------------------------ the operator

    def plan_json(self) -> dict[str, Any]:
        """What ``reconciler plan --json`` prints for the simulated host now."""
        from reconciler.apply.applier import Applier
        from reconciler.load.desired import load_desired
        from sim.seams import sim_observer

        desired = load_desired(str(self.root), tmpfs=self.world.io.tmpfs)
        applier = Applier(
            desired, observer=sim_observer(self.world, desired.host.docker.url), connect=False, io=self.world.io
        )
        return applier.plan_now()[1].to_json()

    @rule(topology=st.sampled_from(sorted(TOPOLOGIES)))
    def edit_manifest(self, topology: str) -> None:
        self._write_manifest(topology)
        self._publish(f"topology {topology}")

    @rule(name=st.sampled_from(sorted(NAMED)), topology=st.sampled_from(["split", "exclusive"]))
    def edit_manifest_named(self, name: str, topology: str) -> None:
        """A manifest of named topologies, some on standby (their lanes kept asleep while another runs)."""
        self._write_named(name, topology)
        self._publish(f"named topologies {name}, {topology} running")

    @precondition(lambda self: self.world is not None)
    @rule(topology=st.sampled_from(["split", "exclusive", "solo", "nope"]))
    def operator_switches(self, topology: str) -> None:
        """``reconciler switch NAME``: the service rewrites topology: alone (an unknown name or a manifest without
        named topologies refused, nothing written); the loop converges it."""
        from reconciler.base.errors import ReconcilerError
        from reconciler.service import Caller, HostService

        try:
            HostService(str(self.root), caller=Caller("cli", "operator"), io=self.world.io).switch(topology)
        except ReconcilerError:
            return
        if ":" in self.topology:
            self.topology = f"{self.topology.split(':')[0]}:{topology}"

    @precondition(lambda self: self.world is not None and self.source is None and ":" in self.topology)
    @rule(
        asked=st.tuples(*[st.sampled_from(["split", "exclusive", "solo"])] * 2),
        seed=st.integers(0, 2**32 - 1),
    )
    def switches_race(self, asked: tuple[str, str], seed: int) -> None:
        """Two ``reconciler switch`` calls at once (two terminals, the API and MCP: each the service's switch), run as
        two actions of one group that take turns at their seams (the manifest edit lock's taking and holding), in an
        order ``seed`` draws. Safety rule 8's lock of the manifest's edits: of two that read the same bytes and asked
        for different topologies one wins and the other is refused as changed; the file holds the last winner's
        topology with every other byte kept; each is audited as it ended (a switch to the topology in force writes
        nothing and is not audited)."""
        import random

        from reconciler.base.errors import ReconcilerError
        from reconciler.service import Caller, HostService
        from reconciler.store.audit import audit_log

        w = self.world
        path = self.root / "manifests" / "sim.yaml"
        before_bytes = path.read_text()
        self.races += 1
        who = [f"racer {self.races}.{i}" for i in (0, 1)]
        w.sched.rng = random.Random(seed)
        ended: list[Any] = [None, None]

        def switch(i: int) -> None:
            svc = HostService(str(self.root), caller=Caller("api" if i else "cli", who[i]), io=w.io)
            try:
                ended[i] = svc.switch(asked[i])
            except ReconcilerError as exc:  # refused (SwitchRefused, audited), or the files do not load
                ended[i] = exc

        try:
            w.sched.run([lambda: switch(0), lambda: switch(1)])
        except Exception as exc:  # noqa: BLE001 - invariant (e)
            w.violate(f"(e) {type(exc).__name__} escaped a switch: {exc}")
            return
        records = [r for r in audit_log("sim").read() if r.get("who") in who]
        self._judge_switches(ended, before_bytes, path.read_text(), records)

    def _judge_switches(self, ended: list[Any], before: str, after: str, records: list[dict[str, Any]]) -> None:
        """Invariant (k): two switches at once lose no update and are audited as they ended."""
        import re

        w = self.world
        m = re.search(r"^topology: (\S+)$", before, re.M)
        if m is None:
            return  # not a manifest of named topologies (both refused: judged by the audit below)
        now = m.group(1)
        writes = [r for r in ended if not isinstance(r, Exception) and r.changed]
        # The writes chain: each switched from the topology the one before it set (none wrote over what it did not see).
        for r in sorted(writes, key=lambda r: r.before != now):
            if r.before != now:
                w.violate(f"(k) a switch wrote {r.before} -> {r.after} over {now}, which it did not see: {ended}")
                return
            now = r.after
        if len({r.before for r in writes}) < len(writes):
            w.violate(f"(k) two switches from the same bytes both won: {ended}")
        expected = before if not writes else re.sub(r"^topology: \S+$", f"topology: {now}", before, count=1, flags=re.M)
        if after != expected:
            w.violate(
                f"(k) the manifest after the switches is not the winner's topology with every other byte kept:\n{after}"
            )
        oks = sorted(r["reason"] for r in records if r.get("action") == "switch" and r.get("outcome") == "ok")
        refused = [r for r in records if r.get("action") == "switch" and r.get("outcome") == "refused"]
        if oks != sorted(f"topology {r.before} -> {r.after}" for r in writes):
            w.violate(f"(k) the switches that wrote are not audited as they ended: {oks} for {ended}")
        from reconciler.service.switch import SwitchRefused

        if len(refused) != sum(isinstance(r, SwitchRefused) for r in ended):
            w.violate(f"(k) the switches refused are not each audited as refused: {refused} for {ended}")
        if ":" in self.topology:
            self.topology = f"{self.topology.split(':')[0]}:{now}"

    @precondition(lambda self: self.world is not None and self.source is not None)
    @rule(
        change=st.sampled_from(["probe", "drain", "image", "topology", "nothing"]),
        recipe=st.sampled_from(sorted(RECIPES)),
        topology=st.sampled_from(sorted(TOPOLOGIES)),
        synced=st.booleans(),
    )
    def source_commit_lands(self, change: str, recipe: str, topology: str, synced: bool) -> None:
        """A commit lands on the git source the host follows, changing one thing the host reads (a recipe's probe,
        its drain, its image, the manifest's topology) or nothing it reads; taken at once by a second terminal's
        ``reconciler sync`` or at the loop's next fetch. Between a plan shown or saved and its approval it makes the
        approval stale: invariant (d) judges that nothing of it runs."""
        if change == "probe":
            self.probes[recipe] += 1
        elif change == "drain":
            self.drains[recipe] = 20 if self.drains[recipe] != 20 else 25
        elif change == "image":
            self.images[recipe] = "sim-missing:1" if self.images[recipe] == "sim-vllm:1" else "sim-vllm:1"
        if change == "topology":
            self._write_manifest(topology)
        elif change != "nothing":
            self._write_recipe(recipe)
        self._publish(f"{change} of {recipe if change != 'topology' else topology}")
        if synced:
            self._sync()

    @precondition(lambda self: self.world is not None and self.source is not None)
    @rule()
    def second_terminal_syncs(self) -> None:
        """``reconciler sync``: the newest commit of the source taken now."""
        self._sync()

    @rule(how=st.sampled_from(["yaml", "unknown-recipe", "slot"]))
    def break_manifest(self, how: str) -> None:
        text = {
            "yaml": "host: sim\nassignments: [\n",
            "unknown-recipe": "host: sim\nassignments:\n  - {recipe: nope, gpus: [dark-compute-a]}\n",
            "slot": "host: sim\nassignments:\n  - {recipe: omni, gpus: [dark-compute-z]}\n",
        }[how]
        (self.tree / "manifests" / "sim.yaml").write_text(text)
        self._publish(f"a broken manifest ({how})")
        self.topology = "broken"

    @rule(recipe=st.sampled_from(sorted(RECIPES)))
    def edit_recipe(self, recipe: str) -> None:
        self.edits[recipe] += 1
        self._write_recipe(recipe)
        self._publish(f"recipe {recipe} edited")

    @rule(recipe=st.sampled_from(sorted(RECIPES)))
    def break_recipe(self, recipe: str) -> None:
        """A bad edit of a recipe (a TOML error): the loop keeps the last valid desired state."""
        path = self.tree / "configs" / "recipes" / f"{recipe}.toml"
        path.write_text(path.read_text() + "\n[offload\n")
        self._publish(f"a broken recipe {recipe}")
        self.topology = "broken"

    @rule(pick=st.integers(0, 7), excused=st.booleans())
    def process_cannot_be_inspected(self, pick: int, excused: bool) -> None:
        """A process whose maps and fds even root cannot read: the /proc source fails closed, unless its pid is the
        one the host file excuses (pid 1)."""
        from sim.world import Proc

        w = self.world
        if excused:
            w.add_proc(Proc(1, "/sbin/init", inspectable=False))
        else:
            w.add_proc(Proc(w.new_pid(), "python reader.py", inspectable=False))

    @rule(recipe=st.sampled_from(sorted(RECIPES)), behaviour=st.sampled_from(["ok", "ok", "crash", "hang"]))
    def recipe_behaves(self, recipe: str, behaviour: str) -> None:
        self.world.behaviour[recipe] = behaviour

    @rule(recipe=st.sampled_from(sorted(RECIPES)), slow=st.booleans())
    def recipe_stops_slowly(self, recipe: str, slow: bool) -> None:
        """The recipe's engine ignores SIGTERM (a worker stuck in a CUDA call): each stop of its containers started
        from now on takes longer than the stop timeout, and the engine kills it at the timeout."""
        w = self.world
        (w.slow_stop.add if slow else w.slow_stop.discard)(recipe)
        for c in w.containers.values():
            if c.ours and c.labels.get("io.reconciler.recipe") == recipe:
                c.slow_stop = slow

    # ------------------------------------------------------------ sleeping lanes (vLLM's sleep mode)

    @rule(
        fault=st.sampled_from(["sleep_error", "sleep_never", "sleep_interrupted", "wake_error", "wake_never"]),
        p=st.sampled_from([0.0, 0.3, 1.0]),
    )
    def sleep_fault(self, fault: str, p: float) -> None:
        """The lanes' sleep mode fails on demand: a sleep answered 500, one never confirmed, one interrupted by its
        engine restarting mid-sleep; a wake answered 500 (half woken), one never confirmed."""
        self.world.sleep_faults[fault] = p

    @rule(pick=st.integers(0, 7), n=st.integers(1, 4), seconds=st.sampled_from([2.0, 8.0, 100000.0]))
    def clients_send_requests(self, pick: int, n: int, seconds: float) -> None:
        """Clients send requests to an awake lane, answered in ``seconds`` (100000: stuck, longer than any drain)."""
        w = self.world
        lanes = sorted((c for c in w.containers.values() if c.ours and c.state == "running"), key=lambda c: c.name)
        if lanes:
            w.requests_arrive(lanes[pick % len(lanes)], n, seconds)

    @rule(pick=st.integers(0, 7), during=st.integers(-1, 4))
    def sleeping_lane_restarts(self, pick: int, during: int) -> None:
        """A sleeping lane's container restarts and wakes itself (vLLM keeps no sleep across a restart): now, or
        during the next pass, after ``during`` of its waits (between its sleeps and its wakes)."""
        w = self.world

        def restart(world: World) -> None:
            asleep = sorted((c for c in world.containers.values() if c.ours and c.asleep), key=lambda c: c.name)
            if asleep:
                world.restart_lane(asleep[pick % len(asleep)])

        if during < 0:
            restart(w)
            return
        count = [0]

        def once(world: World) -> None:
            count[0] += 1
            if count[0] > during:
                world.on_sleep.remove(once)
                restart(world)

        w.on_sleep.append(once)

    @rule(seconds=st.sampled_from([-86400.0, -3600.0, -30.0, 30.0, 3600.0, 86400.0]))
    def wall_clock_jumps(self, seconds: float) -> None:
        """The wall clock is stepped (NTP, ``date -s``, a VM resumed) while the monotonic clock runs on."""
        self.world.wall_offset += seconds

    @rule(seed=st.integers(0, 2**32 - 1))
    def actions_interleave(self, seed: int) -> None:
        """Draw the order in which the next groups' actions take turns at their seams afresh."""
        import random

        self.world.sched.rng = random.Random(seed)

    @precondition(lambda self: self.world is not None)
    @rule(pick=st.integers(0, 7))
    def second_terminal_adopts(self, pick: int) -> None:
        """``reconciler adopt NAME`` in a second terminal, of a container that carries this host's labels but is not
        this install's (a legacy one, a copy): the tool refuses another install's or a foreign one; one it adopts is
        this install's from then on (the tool may stop and remove it, and the checker treats it as ours). A container
        that shares a card with a lane is left out: adopting it would make two of ours share a card by fiat."""
        from reconciler.base.errors import ReconcilerError
        from reconciler.service import Caller, HostService

        w = self.world
        ours_cards = {i for c in w.containers.values() if c.ours and c.state in LIVE_STATES for i in w.cards_of(c)}
        cands = sorted(
            (
                c
                for c in w.containers.values()
                if not c.ours
                and c.labels.get("io.reconciler.host") == "sim"
                and not (c.state in LIVE_STATES and w.cards_of(c) & ours_cards)
            ),
            key=lambda c: c.name,
        )
        if not cands:
            return
        c = cands[pick % len(cands)]
        try:
            result = HostService(str(self.root), caller=Caller("cli", "second terminal"), io=self.world.io).adopt(
                [c.name]
            )
        except ReconcilerError:
            return
        for a in result.adopted:
            adopted = w.containers.get(a["id"])
            if adopted is None:
                continue
            if adopted.labels.get("io.reconciler.install") not in (None, w.install_id):
                w.violate(f"(b) adopt took {adopted.name}, which carries another install's id")
            adopted.ours = True
            self.adopted.add(adopted.id)

    # ------------------------------------------------------------ the host on its own

    @rule(pick=st.integers(0, 7), code=st.sampled_from([0, 1, 137]))
    def container_dies(self, pick: int, code: int) -> None:
        running = [c for c in self.world.containers.values() if c.state == "running"]
        if running:
            self.world._exit(running[pick % len(running)], code)

    @rule(pick=st.integers(0, 7), state=st.sampled_from(["paused", "restarting"]))
    def container_stalls(self, pick: int, state: str) -> None:
        running = [c for c in self.world.containers.values() if c.state == "running" and c.ours]
        if running:
            running[pick % len(running)].state = state

    @rule(pick=st.integers(0, 7), grace=st.sampled_from([5.0, 30.0, 120.0]))
    def operator_stops_slowly(self, pick: int, grace: float) -> None:
        """`podman stop -t GRACE` by someone else, in progress: Podman's API says "stopping" while the processes
        still run (and hold their cards and files) until they exit at the end of the grace period."""
        w = self.world
        running = [c for c in w.containers.values() if c.state == "running"]
        if running:
            c = running[pick % len(running)]
            c.state, c.stops_at = "stopping", w.now + grace

    @rule(
        card=st.integers(0, 1),
        by=st.sampled_from(
            [
                *("index", "uuid", "uuid-upper", "none", "device-node", "cdi", "privileged", "mig-uuid", "mig-index"),
                *("cgroup-rule-mknod", "cgroup-rule-dev", "cgroup-rule-bound", "cgroup-rule-alone"),
            ]
        ),
        kind=st.sampled_from(["foreign", "named-like-ours", "other-install", "legacy", "image-labels", "copied"]),
        running=st.booleans(),
        idle=st.booleans(),
    )
    def foreign_container(self, card: int, by: str, kind: str, running: bool, idle: bool = False) -> None:
        """A container this install did not create. It names its card by index or UUID (a GPU request), by a CDI
        name, by its device node (docker run --device /dev/nvidiaN), by a MIG device (UUID or i:j), is privileged
        (every card), or has a device cgroup rule for the cards' major (with CAP_MKNOD to make a node, /dev bound in,
        a card's node bound in, or none of them: no card); an idle one runs nothing on its card, so only the engine
        says it holds it."""
        w = self.world
        c = w.cards[card]
        ids = {
            "index": [str(c.index)],
            "uuid": [c.uuid],
            "uuid-upper": [c.uuid.upper()],
            "mig-uuid": [c.migs[0]],
            "mig-index": [f"{c.index}:0"],
        }.get(by, [])
        devices = {"device-node": [f"/dev/nvidia{c.minor}"], "cdi": [f"nvidia.com/gpu={c.index}"]}.get(by, [])
        labels: dict[str, str] = {}
        name = f"squatter-{len(w.containers)}"
        if kind == "named-like-ours":
            recipe, slots = TOPOLOGIES["split"][0]
            name = f"reconciler-{recipe}-{'-'.join(slots)}"
        elif kind in ("other-install", "legacy", "image-labels"):
            labels = {
                "io.reconciler.managed": "true",
                "io.reconciler.host": "sim",
                "io.reconciler.recipe": "omni",
                "io.reconciler.slots": SLOTS[card],
            }
            if kind == "other-install":
                labels["io.reconciler.install"] = "f" * 32
            if kind == "image-labels" and w.install_id:
                labels["io.reconciler.install"] = w.install_id
            name = f"reconciler-omni-{SLOTS[card]}-failed-20260101-00000{len(w.containers) % 10}"
        if kind == "copied":
            # A copy of one of this install's containers made from its `docker inspect` (runlike, a generated compose
            # file): every label, this install's id and create token included, and the same GPU; another name (the
            # lane's is taken), or a kept failed container's.
            mine = sorted((c for c in w.containers.values() if c.ours), key=lambda c: c.name)
            if not mine:
                return
            src = mine[card % len(mine)]
            labels = dict(src.labels)
            ids, devices = list(src.device_ids), []
            env = {k: v for k, v in src.env.items() if k == "NVIDIA_VISIBLE_DEVICES"}
            stamp = f"2026010{len(w.containers) % 10}-000000"
            name = f"{src.name}-copy-{len(w.containers)}" if running else f"{src.name}-failed-{stamp}"
        else:
            env = {}
        if any(x.name == name for x in w.containers.values()):
            return
        rule = {
            "cgroup-rule-mknod": {},
            "cgroup-rule-dev": {"binds": ["/dev:/dev"], "cap_drop": ["MKNOD"]},
            "cgroup-rule-bound": {"binds": [f"/dev/nvidia{c.minor}:/dev/nvidia{c.minor}"], "cap_drop": ["MKNOD"]},
            "cgroup-rule-alone": {"cap_drop": ["MKNOD"]},
        }.get(by)
        f = w.foreign(
            name,
            device_ids=ids,
            devices=devices,
            cgroup_rules=["c 195:* rmw"] if rule is not None else [],
            **(rule or {}),
            privileged=by == "privileged",
            idle=idle,
            labels=labels,
            env=env,
            state="running" if running else "exited",
        )
        if kind == "image-labels":
            f.image = "sim-labelled:1"
            w.images["sim-labelled:1"] = dict(labels)

    @rule(holds_file=st.booleans())
    def foreign_offload_container(self, holds_file: bool) -> None:
        """Someone else's vLLM with native offload (its flags in its command), on no card of ours: it may be making
        its file at any time, so it keeps every unowned file but those a stopped container of ours was the only one
        seen holding."""
        from sim.world import Proc

        w = self.world
        name = f"someone-vllm-{len(w.containers)}"
        c = w.foreign(name, state="exited")
        c.command = ["vllm", "serve", "x", "--kv-offloading-size", "1", "--kv-offloading-backend", "native"]
        c.state, c.started_at = "running", w.now
        maps: set[int] = set()
        if holds_file and w.free_bytes() >= GIB:
            maps = {w.add_file(GIB, maker=f"container:{c.id}").inode}
        w.add_proc(Proc(w.new_pid(), f"{name} main", container=c.id, maps=maps))

    @rule(pick=st.integers(0, 7))
    def operator_removes_foreign(self, pick: int) -> None:
        foreign = [c for c in self.world.containers.values() if not c.ours]
        if foreign:
            c = foreign[pick % len(foreign)]
            self.world._exit(c, 0)
            del self.world.containers[c.id]

    @rule(card=st.integers(0, 1), hidden=st.booleans())
    def foreign_gpu_process(self, card: int, hidden: bool) -> None:
        w = self.world
        if hidden:
            w.cards[card].hidden_used = 6 * GIB
        else:
            from sim.world import Proc

            w.add_proc(
                Proc(w.new_pid(), "python train.py", gpu=w.cards[card].uuid, gpu_mem=None if w.wsl2 else 4 * GIB)
            )

    @rule(card=st.integers(0, 1), where=st.sampled_from(["host", "container"]))
    def card_node_opened(self, card: int, where: str) -> None:
        """A process opens a card's node and holds it, with no CUDA context (NVML lists it nowhere): on the host, or
        in a foreign container whose configuration gives it no card (it made the node with mknod)."""
        from sim.world import Proc

        w = self.world
        box = None
        if where == "container":
            box = w.foreign(f"node-holder-{len(w.containers)}", idle=True)
        w.add_proc(Proc(w.new_pid(), "python warm.py", container=box.id if box else None, nodes={w.cards[card].minor}))

    @rule(card=st.integers(0, 1), gib=st.sampled_from([40, 70]))
    def freed_memory_taken(self, card: int, gib: int) -> None:
        """Something NVML lists no process for (another pid namespace, a MIG peer) takes the memory sleeping lanes
        gave back: a wake there would not find what it takes (the tool knows it from each lane's recorded
        footprint and the card's free memory)."""
        self.world.cards[card].hidden_used = gib * GIB

    @rule()
    def foreign_gpu_processes_end(self) -> None:
        w = self.world
        for card in w.cards:
            card.hidden_used = 0
        for pid in [p.pid for p in w.procs.values() if p.container is None and (p.gpu or p.nodes)]:
            w.end_proc(pid)

    @rule(gib=st.sampled_from([1, 3, 8]))
    def orphan_appears(self, gib: int) -> None:
        self.world.add_file(gib * GIB)

    @rule(pick=st.integers(0, 7), via=st.sampled_from(["map", "fd"]), now=st.booleans())
    def process_takes_file(self, pick: int, via: str, now: bool) -> None:
        """A process maps or opens an offload file: now, or between the guard's two inspections."""

        def take(w: World) -> None:
            files = sorted(w.files.values(), key=lambda f: f.name)
            if not files:
                return
            f = files[pick % len(files)]
            from sim.world import Proc

            w.add_proc(
                Proc(
                    w.new_pid(),
                    "python reader.py",
                    maps={f.inode} if via == "map" else set(),
                    fds={f.inode} if via == "fd" else set(),
                )
            )

        if now:
            take(self.world)
        else:

            def once(w: World) -> None:
                w.on_sleep.remove(once)
                take(w)

            self.world.on_sleep.append(once)

    @rule(now=st.booleans())
    def readers_exit(self, now: bool) -> None:
        """The readers end: now, or between the guard's two inspections."""

        def end(w: World) -> None:
            for pid in [p.pid for p in w.procs.values() if p.cmd == "python reader.py"]:
                w.end_proc(pid)

        if now:
            end(self.world)
        else:

            def once(w: World) -> None:
                w.on_sleep.remove(once)
                end(w)

            self.world.on_sleep.append(once)

    @rule(pick=st.integers(0, 7), every=st.sampled_from([1, 2, 5]), reuse=st.booleans())
    def fork_chain_maps_file(self, pick: int, every: int, reuse: bool) -> None:
        """A prefork recycler (or a daemonising double fork, over and over) maps an offload file and, while /proc is
        scanned, forks a child that inherits the mapping and exits, every ``every`` reads of a process: the file is
        held without a break by a pid the scan's first listing never showed; with ``reuse`` the new pid may be a
        number an exited process had (a wrapped pid space)."""
        from sim.world import Proc

        w = self.world
        files = sorted(w.files.values(), key=lambda f: f.name)
        if not files:
            return
        w.pid_reuse = w.pid_reuse or reuse
        head = [w.add_proc(Proc(w.new_pid(), "python reader.py", maps={files[pick % len(files)].inode})).pid]
        reads = [0]

        def hand_down(world: World) -> None:
            if head[0] not in world.procs:
                world.scan_hooks.remove(hand_down)  # the chain ended (the readers exited)
                return
            reads[0] += 1
            if reads[0] % every == 0:
                child = world.fork_handoff(head[0])
                if child is not None:
                    head[0] = child.pid

        # Handing down at every read (one chain every read, or several together), it is never read before its next
        # fork: no listing settles, and the scan rightly stays incomplete (fail closed) while a chain runs.
        hand_down.chain = True  # type: ignore[attr-defined]
        w.scan_hooks.append(hand_down)

    @rule(pick=st.integers(0, 7))
    def processes_come_and_go_during_scans(self, pick: int) -> None:
        """Short-lived processes start and exit while /proc is scanned (a build, a cron job), now and then holding
        an offload file for a moment."""
        from sim.world import Proc

        w = self.world
        born: list[int] = []

        def churn(world: World) -> None:
            if len(born) > 40:
                world.scan_hooks.remove(churn)
                for pid in born:
                    world.end_proc(pid)
                return
            if born and world.rng.random() < 0.5:
                world.end_proc(born.pop(0))
            files = sorted(world.files.values(), key=lambda f: f.name)
            maps = {files[(pick + len(born)) % len(files)].inode} if files and world.rng.random() < 0.3 else set()
            born.append(world.add_proc(Proc(world.new_pid(), "sh -c true", maps=maps)).pid)

        w.scan_hooks.append(churn)

    @rule(held=st.booleans(), now=st.booleans(), gib=st.sampled_from([1, 2]))
    def other_program_writes_pattern_file(self, held: bool, now: bool, gib: int) -> None:
        """A program that is no container of this tool writes a file matching shm.pattern: now, or while the tool
        waits (an enter's health wait); it keeps it open (``held``) or closes it and leaves it."""
        from sim.world import Proc

        def write(w: World) -> None:
            if w.free_bytes() < gib * GIB:
                return
            f = w.add_file(gib * GIB, maker="program:writer")
            if held:
                w.add_proc(Proc(w.new_pid(), "python reader.py", fds={f.inode}))

        if now:
            write(self.world)
        else:

            def once(w: World) -> None:
                w.on_sleep.remove(once)
                write(w)

            self.world.on_sleep.append(once)

    @rule(
        method=st.sampled_from(["list", "inspect", "create", "start", "stop", "remove", "rename", "ping"]),
        p=st.sampled_from([0.0, 0.3, 1.0]),
        lost=st.booleans(),
    )
    def engine_fault(self, method: str, p: float, lost: bool) -> None:
        (self.world.lost if lost else self.world.faults)[method] = p

    @rule(down=st.booleans())
    def engine_down(self, down: bool) -> None:
        self.world.engine_down = down

    @rule(down=st.booleans())
    def nvml_down(self, down: bool) -> None:
        self.world.nvml_down = down

    @rule(card=st.integers(0, 1), present=st.booleans())
    def card_presence(self, card: int, present: bool) -> None:
        self.world.cards[card].present = present

    # ------------------------------------------------------------ an enter's knowable failures

    @rule(recipe=st.sampled_from(sorted(RECIPES)), missing=st.booleans())
    def recipe_names_an_image(self, recipe: str, missing: bool) -> None:
        """The operator points a recipe at an image the engine does not have (or back at one it has)."""
        self.images[recipe] = "sim-missing:1" if missing else "sim-vllm:1"
        self.edits[recipe] += 1
        self._write_recipe(recipe)
        self._publish(f"recipe {recipe} runs {self.images[recipe]}")

    @rule(present=st.booleans())
    def missing_image_pulled(self, present: bool) -> None:
        w = self.world
        assert w is not None
        if present:
            w.images.setdefault("sim-missing:1", {})
        elif not any(c.image == "sim-missing:1" for c in w.containers.values()):
            w.images.pop("sim-missing:1", None)

    @rule(present=st.booleans())
    def engine_gpu_runtime(self, present: bool) -> None:
        """NVIDIA's container toolkit installed on the engine, or not (matters under docker.gpu_requests)."""
        self.world.gpu_runtime = present

    @rule(recipe=st.sampled_from(sorted(RECIPES)), listening=st.booleans())
    def port_squatter(self, recipe: str, listening: bool) -> None:
        """A process outside any container listens on a recipe's port (a stale server), or stops."""
        port = RECIPES[recipe][2]
        if listening:
            self.world.squatted_ports.add(port)
        else:
            self.world.squatted_ports.discard(port)

    def _knowable_failures(self, result: Any) -> None:
        """Invariant (h): no enter fails for what the plan could know before it (its image missing, the engine
        without GPU runtime, its port taken): such an enter is blocked, and nothing is stopped for it."""
        if result is None:
            return
        for o in result.outcomes:
            if o.action.kind.value == "enter" and o.result in ("failed", "refused"):
                for why in ("is not present on this host", "already answers", "could not select device driver"):
                    if why in o.detail:
                        self.world.violate(f"(h) enter {o.action.key} failed for a knowable failure: {o.detail}")

    @rule(seconds=st.sampled_from([1.0, 5.0, 30.0, 400.0]))
    def time_passes(self, seconds: float) -> None:
        self.world.advance(seconds)

    # ------------------------------------------------------------ the tool

    def _pass(self) -> Any:
        self.tool_ran = True
        live = self._live_ids()
        try:
            result = self.loop.cycle({"resync"})
        except Exception as exc:  # noqa: BLE001 - invariant (e): nothing escapes a pass
            self.world.violate(f"(e) {type(exc).__name__} escaped a pass: {exc}")
            return None
        self._door_saw_pass(self.loop)
        self._knowable_failures(result)
        if result is not None:
            self._judge_darkening(result.plan, live)
        return result

    def _live_ids(self) -> set[str]:
        """The ids of the containers that serve or could (live states, not asleep) by the world's truth now."""
        return {c.id for c in self.world.containers.values() if c.state in LIVE_STATES and not c.asleep}

    def _judge_darkening(self, plan: Any, live: set[str]) -> None:
        """Invariant (j), sleeping lanes rule 8: a plan the tool made stops (leaves or puts to
        sleep) no lane that was live when it was made on a card a blocked action of the same plan wanted: such a
        lane keeps serving, since what would replace it there cannot run."""
        from reconciler.plan.actions import ActionKind

        blocked = {s for b in plan.blockers for s in b.gpus}
        for a in plan.actions:
            if a.kind not in (ActionKind.LEAVE, ActionKind.SLEEP) or not a.container_id:
                continue
            if not any(i.startswith(a.container_id) or a.container_id.startswith(i) for i in live):
                continue
            if set(a.gpus) & blocked:
                causes = "; ".join(f"{b.recipe}@{'+'.join(b.gpus)}" for b in plan.blockers if set(b.gpus) & set(a.gpus))
                self.world.violate(
                    f"(j) the plan darkens {a.container} ({a.kind.value} on {','.join(a.gpus)}) for an action that "
                    f"cannot run: {causes} is blocked"
                )

    @rule()
    def loop_pass(self) -> None:
        self._pass()

    @rule()
    def loop_restarts(self) -> None:
        self._new_loop()

    @rule(after_sleeps=st.integers(0, 6))
    def apply_interrupted(self, after_sleeps: int) -> None:
        """A pass whose stop is requested after a few of its waits (SIGTERM during an apply)."""
        w = self.world
        count = [0]

        def hook(_w: World) -> None:
            count[0] += 1
            if count[0] > after_sleeps:
                self.loop.cancel.set()

        w.on_sleep.append(hook)
        try:
            self._pass()
        finally:
            self.interrupted = self.loop.cancel.is_set()
            w.on_sleep.remove(hook)
            self.loop.cancel.clear()

    @rule()
    def cli_apply(self) -> None:
        """``reconciler apply`` as the command runs it: the plan shown, approved, and only that plan run."""
        from reconciler.apply.applier import Applier
        from reconciler.base.errors import ReconcilerError
        from reconciler.load.desired import load_desired

        w = self.world
        try:
            desired = load_desired(str(self.root), tmpfs=self.world.io.tmpfs)
        except ReconcilerError:
            return
        observer = self.loop.observer
        if observer is None:
            from sim.seams import sim_observer

            observer = sim_observer(w, desired.host.docker.url)
        self.tool_ran = True
        try:
            applier = Applier(desired, observer=observer, connect=False, io=self.world.io)
            live = self._live_ids()
            observed, shown = applier.plan_now()
            self._judge_darkening(shown, live)
            mark = len(w.writes)
            result = applier.converge(start=(observed, shown), approved=shown)
        except Exception as exc:  # noqa: BLE001
            w.violate(f"(e) {type(exc).__name__} escaped apply: {exc}")
            return
        self._knowable_failures(result)
        self._check_within(shown, w.writes[mark:])

    def _desired_and_applier(self) -> tuple[Any, Any, dict[str, str]] | None:
        """The files' digests (read first, as the command reads them), the desired state and an applier that plans
        as ``reconciler apply`` does, with the loop's view; None while the files do not load."""
        from reconciler.base.errors import ReconcilerError
        from reconciler.load.desired import load_desired
        from reconciler.plan.fingerprint import file_digests
        from reconciler.service.apply_session import viewed_applier
        from reconciler.service.loop_view import loop_view

        w = self.world
        files = file_digests(self.root)
        try:
            desired = load_desired(str(self.root), tmpfs=self.world.io.tmpfs)
        except ReconcilerError:
            return None
        observer = self.loop.observer
        if observer is None:
            from sim.seams import sim_observer

            observer = sim_observer(w, desired.host.docker.url)
        view = loop_view(desired.host.name)
        return desired, viewed_applier(desired, view, observer=observer, connect=False, io=self.world.io), files

    def _session(self, applier: Any, files: dict[str, str]) -> Any:
        from reconciler.service import Caller, HostService
        from reconciler.service.apply_session import ApplySession
        from reconciler.service.loop_view import loop_view

        svc = HostService(str(self.root), caller=Caller("cli", "second terminal"), io=self.world.io)
        return ApplySession(svc.context, applier, files, loop_view(applier.desired.host.name))

    @precondition(lambda self: self.world is not None)
    @rule()
    def plan_saved(self) -> None:
        """``reconciler plan --out FILE`` in a second terminal: the plan and its fingerprint, as the file holds them."""
        import json

        from reconciler.plan.fingerprint import fingerprint
        from reconciler.service.loop_view import loop_view
        from reconciler.service.saved_plans import plan_document

        made = self._desired_and_applier()
        if made is None:
            return
        desired, applier, files = made
        live = self._live_ids()
        observed, p = applier.plan_now()
        self._judge_darkening(p, live)
        fp = fingerprint(files, desired, observed, loop_view(desired.host.name))
        # Beside the file's own JSON, the commit the plan was made under (the checker's, read from the loaded state).
        self.saved.append(
            {**json.loads(json.dumps(plan_document(p, fp, desired))), "sim_commit": desired.source_commit}
        )

    @precondition(lambda self: self.world is not None and self.saved)
    @rule(pick=st.integers(0, 3))
    def saved_plan_applied(self, pick: int) -> None:
        """``reconciler apply FILE`` of a plan saved some steps before, as ``HostService.apply_saved`` runs it: stale
        (anything changed since, the plan made now not the saved one) writes nothing; else only the saved steps run."""
        from reconciler.plan.fingerprint import Fingerprint

        w = self.world
        doc = self.saved[pick % len(self.saved)]
        made = self._desired_and_applier()
        if made is None:
            return
        _desired, applier, files = made
        mark = len(w.writes)
        try:
            session = self._session(applier, files)
            changes = session.changes_since(Fingerprint.from_json(doc["fingerprint"]), doc["plan"])
            self.stale_words = changes  # what ``apply FILE`` says of a stale plan (the conformance test's)
            if not changes:
                session.run(source="saved")
        except Exception as exc:  # noqa: BLE001
            w.violate(f"(e) {type(exc).__name__} escaped apply FILE: {exc}")
            return
        if changes and w.writes[mark:]:
            w.violate(f"(d) a stale saved plan wrote: {[wr.kind for wr in w.writes[mark:]]}")
        self._judge_commits("a saved plan", doc.get("sim_commit"), changes, w.writes[mark:])
        if not changes:
            self._check_within(session.approved, w.writes[mark:])

    @precondition(lambda self: self.world is not None and self.prompt is None)
    @rule()
    def prompt_shown(self) -> None:
        """An interactive ``apply`` shows its plan and waits at its prompt; the host and the loop go on meanwhile."""
        made = self._desired_and_applier()
        if made is None:
            return
        _desired, applier, files = made
        self.prompt = self._session(applier, files)

    @precondition(lambda self: self.world is not None and self.prompt is not None)
    @rule()
    def prompt_answered(self) -> None:
        """The operator answers yes, steps after the plan was shown: as ``cmd_apply``, the host is planned again and
        a change since the plan was shown is stale (nothing written); else only the shown plan's steps run."""
        w = self.world
        session, self.prompt = self.prompt, None
        made_under = session.applier.desired.source_commit
        mark = len(w.writes)
        try:
            changes = session.refresh()
            if not changes:
                session.run()
        except Exception as exc:  # noqa: BLE001
            w.violate(f"(e) {type(exc).__name__} escaped an approved apply: {exc}")
            return
        if changes and w.writes[mark:]:
            w.violate(f"(d) an approval gone stale wrote: {[wr.kind for wr in w.writes[mark:]]}")
        self._judge_commits("an approved prompt", made_under, changes, w.writes[mark:])
        if not changes:
            self._check_within(session.approved, w.writes[mark:])

    def _judge_commits(self, what: str, made_under: str | None, changes: list[str], writes: list[Any]) -> None:
        """Invariant (d) across commits of the git source: a plan made under one commit never runs under another that
        changed anything the host reads (its manifests and recipes); the approval is stale, writes nothing, and its
        refusal says the source moved, naming both commits."""
        now = self._commit_in_use()
        if made_under is None or now is None or now == made_under or not self.source.differs(made_under, now):
            return
        moved = f"from {made_under[:7]} to {now[:7]}"
        if not changes:
            self.world.violate(f"(d) {what} made under commit {made_under[:12]} ran under {now[:12]}, which changed it")
        elif writes:
            self.world.violate(
                f"(d) {what} made under commit {made_under[:12]}, stale under {now[:12]}, wrote: {[w.kind for w in writes]}"
            )
        elif not any(moved in line for line in changes):
            self.world.violate(
                f"(d) {what} went stale as the git source moved {moved}, and its refusal does not say so: {changes}"
            )

    def _check_within(self, shown: Any, writes: list[Any]) -> None:
        """Invariant (d): every write of the apply belongs to an action of the plan it showed."""
        from reconciler.plan.actions import ActionKind

        w = self.world
        enters = {a.container for a in shown.actions if a.kind is ActionKind.ENTER}
        # The containers the plan's actions name: its leaves', and an enter's that finishes one left waiting.
        leaves = {a.container_id for a in shown.actions if a.container_id}
        finishing = {a.container_id for a in shown.actions if a.kind is ActionKind.ENTER and a.container_id}
        names = {a.container for a in shown.actions if a.kind is not ActionKind.RECLAIM}
        paths = {p for a in shown.actions for p in a.paths}
        created: set[str] = set()
        for wr in writes:
            if wr.kind == "create":
                if wr.name not in enters:
                    w.violate(f"(d) apply created {wr.name}, not an enter of the plan it showed")
                created.add(wr.target)
            elif wr.kind == "unlink":
                # Judged by who made the file (the world's truth), never by its age: outside the plan's paths only a
                # failed enter's own file may go, one its container made (created by this apply, or the one an
                # enter finishes).
                maker = wr.name.removeprefix("container:") if wr.name.startswith("container:") else None
                if wr.target not in paths and not (maker and (maker in created or maker in finishing)):
                    w.violate(f"(d) apply unlinked {wr.target} (made by {wr.name}), not listed by the plan it showed")
            elif wr.target not in created and wr.target not in leaves:
                kept = any(wr.name.startswith(f"{n}-failed-") for n in names if n)
                if not (wr.kind == "remove" and kept):
                    w.violate(f"(d) apply did {wr.kind} on {wr.name or wr.target[:12]}, outside the plan it showed")

    # ------------------------------------------------------------ invariants

    @invariant()
    def no_violation(self) -> None:
        STEPS[0] += 1
        if self.world is None:
            return
        w = self.world
        ours = [c for c in w.containers.values() if c.ours and c.state in LIVE_STATES]
        for i, a in enumerate(ours):
            for b in ours[i + 1 :]:
                shared = w.cards_of(a) & w.cards_of(b)
                if not shared:
                    continue
                # Sleeping lanes rule 1: two of ours share a card only with one of them asleep by the world's own
                # truth (a lane that woke itself by a restart is the world's doing: the next pass puts it back).
                if a.asleep or b.asleep or a.self_woken or b.self_woken:
                    continue
                if a.sleep_mode or b.sleep_mode:
                    w.violate(f"(1) {a.name} and {b.name} are both awake on card(s) {sorted(shared)}")
                else:
                    w.violate(f"(a) {a.name} and {b.name} both run on card(s) {sorted(shared)}")
        self._judge_sleeping_lanes()
        if self.loop is not None and self.steps_since_adopt_check >= 10:
            # (b) also: nothing is ever adopted here but by an explicit adopt (a second terminal's).
            from reconciler.store.state import read_ownership

            self.steps_since_adopt_check = 0
            adopted = set(read_ownership("sim").adopted) - self.adopted
            if adopted:
                w.violate(f"(b) adopted without an explicit adopt: {sorted(a[:12] for a in adopted)}")
        self.steps_since_adopt_check += 1
        if w.violations:
            raise AssertionError(
                "invariant violated:\n  "
                + "\n  ".join(w.violations)
                + "\nlast log lines:\n  "
                + "\n  ".join(self.sink.lines)
            )

    def _judge_sleeping_lanes(self) -> None:
        """Sleeping lanes rules 3 and 6 after each step (rules 1, 2, 4 and 5 are judged by the world at the call
        that would break them: the wake, the unlink, the sleep)."""
        w = self.world
        interrupted, self.interrupted = self.interrupted, False
        for c in list(w.containers.values()):
            if (c.sleep_failed or c.wake_failed) and not interrupted:
                what = "would not sleep" if c.sleep_failed else "failed its wake"
                # A stop the engine refused (its fault) still shows the tool took the leave or failed-enter path.
                if c.state in LIVE_STATES and not c.stop_tried:
                    w.violate(f"(6) {c.name} {what} and still runs: never left (stopped) nor failed as an enter")
            c.sleep_failed = c.wake_failed = False
        if not self.tool_ran:
            return
        self.tool_ran = False
        if not any(c.ours and c.state == "running" and c.asleep for c in w.containers.values()):
            return
        try:
            status = self._status_json()
        except Exception:  # noqa: BLE001 - the files do not load, or a source is down: nothing is reported then
            return
        for entry in status["containers"]:
            c = next((x for x in w.containers.values() if x.id.startswith(entry["id"])), None)
            if c is not None and c.state == "running" and c.asleep and entry.get("sleeping") is False:
                w.violate(f"(3) status --json says {c.name}, which sleeps, is awake (sleeping: false)")

    def _status_json(self) -> dict[str, Any]:
        """What ``reconciler status --json`` says of the host now."""
        from reconciler.apply.applier import Applier
        from reconciler.load.desired import load_desired
        from reconciler.service.status import status_data
        from sim.seams import sim_observer

        desired = load_desired(str(self.root), tmpfs=self.world.io.tmpfs)
        applier = Applier(
            desired, observer=sim_observer(self.world, desired.host.docker.url), connect=False, io=self.world.io
        )
        observed, plan = applier.plan_now()
        return status_data(desired, observed, plan)

    @precondition(lambda self: self.world is not None)
    @rule()
    def faults_stop_and_host_settles(self) -> None:
        """Invariant (f): with every fault cleared, a bounded number of passes converges the host or leaves it
        blocked by something that is really there (a process: there when the last pass read it; one that forks its
        mapping or its GPU context down to a child meanwhile is held by a pid born after the read)."""
        w = self.world
        w.faults.clear()
        w.lost.clear()
        w.sleep_faults.clear()
        w.engine_down = w.nvml_down = False
        for card in w.cards:
            card.present = True
        w.behaviour = {}
        if self.topology == "broken":
            for r in RECIPES:
                self._write_recipe(r)
            self._write_manifest("split")
            self._publish("the files fixed")
        self._sync()  # the operator takes the newest commit (the loop would within source.interval_s)
        result = None
        for _ in range(LIVENESS_PASSES):
            w.advance(700.0)  # past any backoff
            w.pids_read = set()
            result = self._pass()
            if result is not None and result.final.converged:
                return
        if result is None:
            return  # the host file itself is refused (two slots on one card): nothing runs, which is right
        final = result.final
        if final.unavailable:
            # Each source may stay down only for a cause that is really there.
            true_cause = {
                "gpu": self.shape.startswith("alias"),
                "proc": any(not p.inspectable and p.pid != 1 for p in w.procs.values())
                or (
                    any(getattr(h, "chain", False) for h in w.scan_hooks)
                    and "kept vanishing before they were read" in (result.message or "")
                ),
            }
            false = [s for s in final.unavailable if not true_cause.get(s, False)]
            if false:
                w.violate(f"(f) sources still unavailable after faults stopped: {false}")
            return
        if not final.blocked and final.held and not final.actions:
            return  # a standby lane held until a switch puts the awake lane on its cards to sleep
        if not final.blocked:
            w.violate(
                f"(f) not converged after {LIVENESS_PASSES} passes without faults: {result.result}: "
                f"{result.message or [a.reason for a in final.actions]}"
            )
            return
        names = {c.name for c in w.containers.values()}
        pids = {f"pid {p}" for p in set(w.procs) | w.pids_read}
        # A running offload container that is not ours keeps every unowned file: the room they take is really held.
        foreign_offload = any(
            not c.ours and c.state in LIVE_STATES and "--kv-offloading-size" in c.command for c in w.containers.values()
        )
        for b in final.blockers:
            if b.holder == "tmpfs" and foreign_offload:
                continue
            if b.cause == "held" and b.holder not in names and b.holder not in pids:
                w.violate(f"(f) blocked by {b.holder!r}, which is not on the host: {b.reason}")
            # VRAM is really there when a process of the host the blocker names holds it (a foreign container's
            # workers on the card, say), or when the card's own figures hide what holds it (hidden use, WSL2).
            named = set(re.findall(r"pid \d+", b.reason))
            if b.cause == "memory" and not named & pids and not any(c.hidden_used for c in w.cards) and not w.wsl2:
                w.violate(f"(f) blocked by unlisted VRAM that nothing holds: {b.reason}")
            if b.cause == "image" and self.images.get(b.recipe, "sim-vllm:1") in w.images:
                w.violate(f"(f) blocked by a missing image that the engine has: {b.reason}")
            if b.cause == "runtime" and w.gpu_runtime:
                w.violate(f"(f) blocked by a GPU runtime the engine has: {b.reason}")
            port = RECIPES.get(b.recipe, (0, 0, 0))[2]
            if b.cause == "port" and not w.listeners(port):
                w.violate(f"(f) blocked by a port nothing listens on: {b.reason}")
