"""The simulated host: an engine, NVML, /proc and a tmpfs on one virtual clock, every choice from one seed.

Nothing here imports the project beyond plain values: ``seams`` connects it. The world keeps its own ground truth
(which container this install created, which file a live process maps, which card a container's ids resolve to)
and records every write the tool makes, so the invariants are judged against the truth, never against what the
tool believed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30
SHM_DIR = "/dev/shm"
PATTERN_PREFIX, PATTERN_SUFFIX = "vllm_offload_", ".mmap"


class Violation(AssertionError):
    """An invariant broke: the message says which and how."""


class ApiError(Exception):
    """Stands in for the engine's HTTP errors; ``seams`` turns it into docker.errors.APIError."""

    def __init__(self, status: int, text: str):
        self.status = status
        super().__init__(text)


@dataclass
class Card:
    index: int
    uuid: str
    present: bool = True
    total: int = 80 * GIB
    # VRAM held by something no process list shows (WSL2, another pid namespace).
    hidden_used: int = 0
    # Its device node's minor number (/dev/nvidiaN; not always its index) and the UUIDs of its MIG devices.
    minor: int = 0
    migs: list[str] = field(default_factory=list)


@dataclass
class Proc:
    pid: int
    cmd: str
    container: str | None = None  # engine id
    maps: set[int] = field(default_factory=set)  # inodes mapped
    fds: set[int] = field(default_factory=set)  # inodes held open
    gpu: str | None = None  # card uuid
    nodes: set[int] = field(
        default_factory=set
    )  # minors of the card nodes it holds open (no CUDA context: NVML is blind)
    gpu_mem: int | None = 0  # None: the driver does not say (WSL2)
    resolvable: bool = True  # False: not in this /proc (another pid namespace)
    inspectable: bool = True
    start: int = 0  # its start time (/proc/PID/stat): with the pid, one process; a reused pid number has another


# The /proc of a scan: how the world moves while the tool reads it. Each hook runs before each read of one process
# (a fork, an exit, a hand-off of a mapping to a child born after the listing).
ScanHook = Any


@dataclass
class File:
    name: str
    inode: int
    size: int
    # Who made it, the ground truth the checker judges an unlink by: "container:<id>", "program:<what>" (another
    # program writing a pattern file), or "orphan" (left on the host before the run, or by a crash long ago).
    maker: str = "orphan"

    @property
    def path(self) -> str:
        return f"{SHM_DIR}/{self.name}"


# The states in which a container's processes still run. Podman's Docker API adds "stopping" to Docker's: a stop in
# progress (`podman stop` with a grace period), the processes alive, their cards and files held until they exit.
LIVE_STATES = ("running", "paused", "restarting", "stopping")


@dataclass
class Container:
    id: str
    name: str
    image: str
    labels: dict[str, str]
    env: dict[str, str]
    command: list[str]
    device_ids: list[str]
    state: str = "created"
    exit_code: int = 0
    restarts: int = 0
    started_at: float = 0.0
    ours: bool = False  # created by this install through the tool
    # How it behaves once started: "ok", "crash" (exits after crash_after_s), "hang" (never answers health)
    behaviour: str = "ok"
    crash_after_s: float = 1.0
    slow_stop: bool = False  # ignores SIGTERM: a stop waits its whole timeout, then the engine kills it
    boot_s: float = 2.0
    port: int | None = None
    offload_bytes: int = 0
    stops_at: float = 0.0  # in state "stopping": when its processes exit
    # Cards given other than by a GPU request: device nodes mapped in (/dev/nvidiaN), --privileged (every card).
    devices: list[str] = field(default_factory=list)
    privileged: bool = False
    # Cards given by a device cgroup rule (docker run --device-cgroup-rule 'c 195:* rmw'): with a card's node bound in
    # (binds, "SRC:DST"), /dev bound in, or CAP_MKNOD kept (not in cap_drop) to make any node inside.
    cgroup_rules: list[str] = field(default_factory=list)
    binds: list[str] = field(default_factory=list)
    cap_drop: list[str] = field(default_factory=list)
    # A foreign container that holds its cards without running anything on them (no process NVML would list).
    idle: bool = False
    # vLLM's sleep mode (its command has --enable-sleep-mode): "awake", "asleep", or "waking" (a level-2 wake between
    # its weights and its KV cache, or one that failed half way: its memory taken, so awake by the world's truth).
    sleep_mode: bool = False
    sleep_state: str = "awake"
    # Woke by itself (its container restarted while asleep) since the tool last put it to sleep: two lanes awake on
    # one card then are the world's doing, until the tool has had a pass to put it back to sleep.
    self_woken: bool = False
    # The order of the world's events (``World.event``) at which it last woke itself (its restart), last answered GET
    # /is_sleeping that it sleeps, and was created: a lane started beside one that woke itself after the starting
    # lane's own last check of it (right before its start, after its create) is the world's doing, a race no tool can
    # close; one that woke before that check is the tool's.
    woke_seq: int = -1
    asleep_seq: int = -1
    created_seq: int = -1
    # Requests in flight until ``busy_until`` (a drain waits them out; a sleep meanwhile aborts them), and whether the
    # last read of its gauges said it was idle (rule 5: a sleep is sent only then).
    inflight: int = 0
    busy_until: float = 0.0
    said_idle: bool = False
    aborted: int = 0
    # A sleep or a wake the world made fail in the pass now running (rule 6 judges what the tool did about it), and a
    # stop the tool asked for since.
    sleep_failed: bool = False
    wake_failed: bool = False
    stop_tried: bool = False

    @property
    def asleep(self) -> bool:
        """Asleep by the world's own truth (not by anything the tool was told)."""
        return self.sleep_mode and self.sleep_state == "asleep"


@dataclass
class Write:
    """One mutating call the tool made, for the plan check of ``apply``."""

    kind: str  # create | start | stop | remove | rename | kill | unlink
    target: str  # container id / name, or path
    name: str = ""


class World:
    def __init__(self, seed: int, *, cards: int = 2, tmpfs_gib: float = 20.0, wsl2: bool = False):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 1_800_000_000.0  # the monotonic clock (only moves forward)
        self.taken_down: dict[str, int] = {}  # recipe -> its lanes being taken down now (HostIO.lanes.taking_down)
        self._events = 0  # the order of the events ``event`` numbers (an instant of ``now`` holds many)
        # The wall clock is the monotonic one plus this offset, which jumps (NTP stepping it, an operator's date -s).
        self.wall_offset = 0.0
        # Actions of one group, run interleaved at the seams (seams.Interleaver); None: nothing to interleave.
        self.sched: Any = None
        # The host's I/O seams as this world answers them (``seams.sim_io``), handed to the project's code.
        self.io: Any = None
        # Every pid a read of the tool's returned (NVML's process list, the /proc scan's read of one process): a
        # holder the tool names was on the host when it was read, though a fork may have replaced it since.
        self.pids_read: set[int] = set()
        # Recipes whose containers ignore SIGTERM: a stop takes its whole timeout, then the engine kills them.
        self.slow_stop: set[str] = set()
        self.cards = [Card(i, _uuid(seed, i)) for i in range(cards)]
        # Minor numbers follow the driver's probe order, not always NVML's index; each card has two MIG devices.
        minors = list(range(cards)) if seed % 2 == 0 else list(reversed(range(cards)))
        for card, minor in zip(self.cards, minors, strict=True):
            card.minor = minor
            card.migs = [_uuid(seed, 100 + 10 * card.index + j).replace("GPU-", "MIG-") for j in range(2)]
        # NVML did not answer the minor-number and MIG queries (an older driver): those ids resolve to no card.
        self.nvml_hides_identity = False
        self.tmpfs_size = int(tmpfs_gib * GIB)
        self.files: dict[str, File] = {}
        self.procs: dict[int, Proc] = {}
        self.containers: dict[str, Container] = {}
        self.images = {"sim-vllm:1": {}, "sim-other:1": {}}
        self.wsl2 = wsl2
        # Podman's Docker API: a container whose process ended reads "stopped" until Podman's clean-up has run (the
        # next time the clock moves here), then "exited".
        self.podman = False
        self.next_pid = 1000
        self.next_start = 1
        # Pid numbers freed by exits; with ``pid_reuse`` a new process may get one of them again (a wrapped pid space).
        self.freed_pids: list[int] = []
        self.pid_reuse = False
        # Run before each read of one process during a /proc scan (seams.sim_scan): the world moving under the scan.
        self.scan_hooks: list[ScanHook] = []
        # The inodes held without a break all through the last /proc scan: the lease gate refusing one of them means
        # the scan missed a holder it should have seen (the checker's (c)).
        self.held_through_scan: set[int] = set()
        self.next_inode = 100
        # Faults: method -> probability of a 5xx; "lost" answers: the call takes effect, the answer is an error.
        self.faults: dict[str, float] = {}
        self.lost: dict[str, float] = {}
        self.engine_down = False
        self.nvml_down = False
        self.writes: list[Write] = []
        self.violations: list[str] = []
        self.install_id: str | None = None  # learnt from the first container the tool creates
        self.host_name = "sim"
        # Called at every sleep of the tool: lets the world move while the tool waits (files mapped between the
        # two inspections, a container dying during its health wait).
        self.on_sleep: list[Any] = []
        self.ports: dict[str, int] = {}
        self.behaviour: dict[str, str] = {}  # recipe -> how its containers behave once started
        # Whether the engine can give GPUs by DeviceRequest (NVIDIA's runtime installed), and the ports a process
        # outside any container listens on (a stale server): an enter's knowable failures.
        self.gpu_runtime = True
        self.squatted_ports: set[int] = set()
        # Sleep mode's faults, each a probability per call: "sleep_error" (POST /sleep answers 500), "sleep_never"
        # (200, but it never says it sleeps), "sleep_interrupted" (200, then its engine restarts mid-sleep: awake),
        # "wake_error" (POST /wake_up answers 500, its memory half taken), "wake_never" (200, it never says awake).
        self.sleep_faults: dict[str, float] = {}
        self.residual = 2 * GIB  # what a sleeping lane's process keeps on its card (NCCL buffers, CUDA context)
        self.awake_mem = 20 * GIB
        # Every POST /sleep and /wake_up the tool sent: (kind, container id, level).
        self.sleep_calls: list[tuple[str, str, int]] = []
        # Whether the tool could know what a lane's wake takes (NVML telemetry answering, pids resolved, its awake
        # footprint recorded): set by ``seams.installed``; a wake into memory that is not free is judged only then.
        self.wake_memory_known: Any = lambda cid: False
        self.telemetry = "nvml"  # the host file's gpu_telemetry (the machine writes both)
        # The front door before the lanes (tests/sim/door.py's ``SimDoor``), once a run draws one: the drain reads
        # what it publishes (``HostIO.lanes.front``), and it looks at the host while the tool waits (``on_sleep``).
        self.door: Any = None

    # ------------------------------------------------------------ the clock

    def event(self) -> int:
        """The next number in the order of the world's events (creates, answers, restarts)."""
        self._events += 1
        return self._events

    def wall(self) -> float:
        return self.now + self.wall_offset

    def point(self) -> None:
        """A seam of the tool's: another action of its group may run here (seams.Interleaver)."""
        if self.sched is not None:
            self.sched.point()

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, float(seconds)))
        for hook in list(self.on_sleep):
            hook(self)
        self.point()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for c in self.containers.values():
            if c.state == "stopped" and seconds > 0:
                c.state = "exited"
            if c.state == "running" and c.behaviour == "crash" and self.now - c.started_at >= c.crash_after_s:
                self._exit(c, 1)
            elif c.state == "stopping" and self.now >= c.stops_at:
                self._exit(c, 143)

    # ------------------------------------------------------------ ids and resolution

    def card_of_id(self, dev: str) -> Card | None:
        """What a container's GPU id (index, UUID in any case, ``i:j`` MIG index, MIG UUID, device node) is, on this
        host: the physical card."""
        dev = dev.removeprefix("nvidia.com/gpu=")
        for card in self.cards:
            if dev == str(card.index) or dev.lower() == card.uuid.lower():
                return card
            if dev.split(":")[0] == str(card.index) and ":" in dev:
                return card
            if dev.lower() in (m.lower() for m in card.migs) or dev == f"/dev/nvidia{card.minor}":
                return card
        return None

    def cards_of(self, c: Container) -> set[int]:
        if c.privileged:
            return {card.index for card in self.cards}
        ruled: set[int] = set()
        if c.cgroup_rules:  # the world's rules reach every card's node (c 195:* rmw)
            every = "MKNOD" not in c.cap_drop or any(b.split(":")[0] == "/dev" for b in c.binds)
            bound = {b.split(":")[1] for b in c.binds}
            ruled = {card.index for card in self.cards if every or f"/dev/nvidia{card.minor}" in bound}
        ids = list(c.device_ids) + list(c.devices)
        if not c.device_ids and c.env.get("NVIDIA_VISIBLE_DEVICES"):
            ids += [d for d in c.env["NVIDIA_VISIBLE_DEVICES"].split(",") if d]
        if "all" in ids:
            return {card.index for card in self.cards}
        return ruled | {card.index for d in ids if (card := self.card_of_id(d)) is not None}

    def node_holders(self, card: int) -> list[Proc]:
        """The processes that hold card ``card``'s node open: they hold it whatever their container's configuration."""
        minor = self.cards[card].minor
        return [p for p in self.procs.values() if minor in p.nodes]

    def new_id(self) -> str:
        return hashlib.sha256(f"{self.seed}-{self.rng.random()}".encode()).hexdigest()

    def new_pid(self) -> int:
        self.next_start += 1
        free = [p for p in self.freed_pids if p not in self.procs]
        if self.pid_reuse and free and self.rng.random() < 0.5:
            pid = free[self.rng.randrange(len(free))]
            self.freed_pids.remove(pid)
            return pid
        self.next_pid += self.rng.randint(1, 7)
        return self.next_pid

    def add_proc(self, proc: Proc) -> Proc:
        proc.start = self.next_start
        self.procs[proc.pid] = proc
        return proc

    def end_proc(self, pid: int) -> None:
        if self.procs.pop(pid, None) is not None:
            self.freed_pids.append(pid)

    def fork_handoff(self, pid: int) -> Proc | None:
        """The process forks a child that inherits its mappings and descriptors, and exits (a daemonising double
        fork, a prefork recycler): the same files held without a break, by a pid born just now."""
        p = self.procs.get(pid)
        if p is None:
            return None
        child = Proc(
            self.new_pid(),
            p.cmd,
            container=p.container,
            maps=set(p.maps),
            fds=set(p.fds),
            nodes=set(p.nodes),
            gpu=p.gpu,
            gpu_mem=p.gpu_mem,
            resolvable=p.resolvable,
            inspectable=p.inspectable,
        )
        self.add_proc(child)
        self.end_proc(pid)
        return child

    def lease_refused(self, inode: int) -> list[int]:
        """The kernel's write lease, from the truth: refused (the pids that hold the file) while any process maps
        or holds it."""
        return [p.pid for p in self.procs.values() if inode in (p.maps | p.fds)]

    # ------------------------------------------------------------ the engine (called through seams.SimEngine)

    def _fault(self, method: str) -> None:
        if self.engine_down:
            raise ConnectionError("engine down (simulated)")
        p = self.faults.get(method, 0.0)
        if p and self.rng.random() < p:
            raise ApiError(500, f"simulated engine error on {method}")

    def _lost(self, method: str) -> None:
        p = self.lost.get(method, 0.0)
        if p and self.rng.random() < p:
            raise ApiError(500, f"simulated lost answer of {method} (it took effect)")

    def create(
        self,
        *,
        name: str,
        image: str,
        labels: dict[str, str],
        env: dict[str, str],
        command: list[str],
        device_ids: list[str],
        ours: bool = True,
    ) -> Container:
        self._fault("create")
        if any(c.name == name for c in self.containers.values()):
            raise ApiError(409, f'Conflict. The container name "/{name}" is already in use')
        if image not in self.images:
            raise ApiError(404, f"No such image: {image}")
        c = Container(self.new_id(), name, image, dict(labels), dict(env), list(command), list(device_ids), ours=ours)
        c.created_seq = self.event()
        if ours:
            self.install_id = labels.get("io.reconciler.install", self.install_id)
            recipe = labels.get("io.reconciler.recipe", "")
            c.port = self.ports.get(recipe)
            c.offload_bytes = int(env.get("SIM_OFFLOAD_BYTES", "0") or 0)
            c.behaviour = self.behaviour.get(recipe, "ok")
            c.slow_stop = recipe in self.slow_stop
            c.boot_s = float(env.get("SIM_BOOT_S", "2"))
            c.sleep_mode = "--enable-sleep-mode" in command
        self.containers[c.id] = c
        self.writes.append(Write("create", c.id, name))
        self._lost("create")
        return c

    def get(self, ref: str) -> Container:
        c = self.containers.get(ref) or next((x for x in self.containers.values() if x.name == ref), None)
        if c is None:
            raise ApiError(404, f"No such container: {ref}")
        return c

    def start(self, ref: str) -> None:
        self._fault("start")
        c = self.get(ref)
        self.writes.append(Write("start", c.id, c.name))
        if c.state == "running":
            self._lost("start")
            return
        if c.device_ids and not self.gpu_runtime:
            raise ApiError(500, 'could not select device driver "nvidia" with capabilities: [[gpu]]')
        self._check_start(c)
        c.state, c.started_at, c.exit_code = "running", self.now, 0
        c.sleep_state, c.self_woken, c.inflight = "awake", False, 0
        self._spawn(c)
        self._lost("start")

    def _check_start(self, c: Container) -> None:
        """Invariants (a) and (g): the tool never starts a container on a card another container runs on."""
        if not c.ours:
            return
        mine = self.cards_of(c)
        for other in self.containers.values():
            if other.id == c.id or other.state not in LIVE_STATES:
                continue
            if other.ours and other.asleep:
                continue  # a sleeping lane of ours stays beside the lane started there (sleeping lanes rule 2)
            if other.ours and other.self_woken and c.created_seq < other.asleep_seq < other.woke_seq:
                # It said it slept to a check made after this lane's create, and woke itself (a restart) after
                # that answer: the start raced the world's restart; the next pass puts it back to sleep.
                continue
            shared = mine & self.cards_of(other)
            if shared:
                self.violate(
                    f"(a) started {c.name} on card(s) {sorted(shared)} while {other.name} "
                    f"({'ours' if other.ours else 'foreign'}, {other.state}) runs there"
                )
        for i in sorted(mine):
            for p in self.node_holders(i):
                owner = self.containers.get(p.container or "")
                if owner is None or not owner.ours:
                    self.violate(f"(a) started {c.name} on card {i} while pid {p.pid} ({p.cmd}) holds its node open")

    def _spawn(self, c: Container) -> None:
        """The processes of a started container: one per card (TP workers), mapping the offload file if any."""
        if not c.ours and (c.idle or not self.cards_of(c)):
            self.add_proc(Proc(self.new_pid(), f"{c.name} main", container=c.id))
            return
        inode = None
        if c.offload_bytes:
            if self.free_bytes() < c.offload_bytes:
                self._exit(c, 1)  # the seed's Errno 14: no room for the offload file
                return
            inode = self.add_file(c.offload_bytes, maker=f"container:{c.id}").inode
        self._spawn_procs(c, inode)

    def _spawn_procs(self, c: Container, inode: int | None) -> None:
        cards = sorted(self.cards_of(c))
        for idx in cards or [None]:
            pid = self.new_pid()
            card = self.cards[idx] if idx is not None else None
            self.add_proc(
                Proc(
                    pid,
                    f"vllm worker {c.name}",
                    container=c.id,
                    maps={inode} if inode else set(),
                    gpu=card.uuid if card and card.present else None,
                    gpu_mem=None if self.wsl2 else self.awake_mem,
                    resolvable=not self.wsl2,
                )
            )

    def _exit(self, c: Container, code: int) -> None:
        c.state, c.exit_code = ("stopped" if self.podman else "exited"), code
        c.sleep_state, c.self_woken, c.inflight = "awake", False, 0
        for pid in [p.pid for p in self.procs.values() if p.container == c.id]:
            self.end_proc(pid)

    def stop(self, ref: str, timeout: float = 10) -> None:
        tried = self.containers.get(ref) or next((x for x in self.containers.values() if x.name == ref), None)
        if tried is not None:
            tried.stop_tried = True
        self._fault("stop")
        c = self.get(ref)
        self.writes.append(Write("stop", c.id, c.name))
        self._check_ours(c, "stop")
        if c.state in LIVE_STATES and c.slow_stop:
            # SIGTERM ignored: the engine waits the stop's timeout (the request open, Podman saying "stopping"
            # meanwhile, the processes holding their cards and files), then kills it. Other actions run meanwhile.
            wait = max(1.0, float(timeout))
            if self.podman:
                c.state, c.stops_at = "stopping", self.now + wait + 1.0  # exits at the kill, not on its own
            self.advance(wait / 2)
            self.point()
            self.advance(wait / 2)
            if c.state in LIVE_STATES:
                self._exit(c, 137)
            self._lost("stop")
            return
        if c.state in LIVE_STATES:
            self._exit(c, 143 if c.behaviour != "hang" else 137)
        self._lost("stop")

    def kill(self, ref: str) -> None:
        self._fault("kill")
        c = self.get(ref)
        self.writes.append(Write("kill", c.id, c.name))
        self._check_ours(c, "kill")
        if c.state in LIVE_STATES:
            self._exit(c, 137)

    def remove(self, ref: str) -> None:
        self._fault("remove")
        c = self.get(ref)
        self.writes.append(Write("remove", c.id, c.name))
        self._check_ours(c, "remove")
        if c.state in LIVE_STATES:
            raise ApiError(409, f"You cannot remove a running container {c.id}")
        del self.containers[c.id]
        self._lost("remove")

    def rename(self, ref: str, new: str) -> None:
        self._fault("rename")
        c = self.get(ref)
        self._check_ours(c, "rename")
        if any(x.name == new for x in self.containers.values()):
            raise ApiError(409, f'Conflict. The container name "/{new}" is already in use')
        self.writes.append(Write("rename", c.id, new))
        c.name = new
        self._lost("rename")

    def _check_ours(self, c: Container, verb: str) -> None:
        """Invariant (b): nothing without this host's name and this install's id is ever touched."""
        if not c.ours:
            self.violate(f"(b) {verb} of {c.name} ({c.id[:12]}), which this install did not create")

    def violate(self, text: str) -> None:
        self.violations.append(f"t={self.now - 1_800_000_000.0:.1f}s: {text}")

    # ------------------------------------------------------------ the world acting on its own

    def foreign(
        self,
        name: str,
        *,
        device_ids: list[str] = (),
        labels: dict[str, str] | None = None,
        state: str = "running",
        env: dict[str, str] | None = None,
        devices: list[str] = (),
        privileged: bool = False,
        idle: bool = False,
        cgroup_rules: list[str] = (),
        binds: list[str] = (),
        cap_drop: list[str] = (),
    ) -> Container:
        c = Container(
            self.new_id(),
            name,
            "sim-other:1",
            dict(labels or {}),
            dict(env or {}),
            ["sleep"],
            list(device_ids),
            ours=False,
            devices=list(devices),
            privileged=privileged,
            idle=idle,
            cgroup_rules=list(cgroup_rules),
            binds=list(binds),
            cap_drop=list(cap_drop),
        )
        self.containers[c.id] = c
        if state == "running":
            c.state, c.started_at = "running", self.now
            self._spawn(c)
        else:
            c.state, c.exit_code = state, 0
        return c

    def add_file(self, size: int, name: str | None = None, *, maker: str = "orphan") -> File:
        self.next_inode += 1
        name = name or f"{PATTERN_PREFIX}{self.next_inode:x}{PATTERN_SUFFIX}"
        f = File(name, self.next_inode, size, maker)
        self.files[name] = f
        return f

    def free_bytes(self) -> int:
        return max(0, self.tmpfs_size - sum(f.size for f in self.files.values()))

    def held_inodes(self) -> set[int]:
        return {i for p in self.procs.values() for i in (p.maps | p.fds)}

    def unlink(self, name: str, *, inode: int, size: int) -> bool:
        """The one deletion: invariant (c) is judged here, against the truth of this instant."""
        f = self.files.get(name)
        if f is None or f.inode != inode or f.size != size:
            return False
        if not (name.startswith(PATTERN_PREFIX) and name.endswith(PATTERN_SUFFIX)):
            self.violate(f"(c) unlinked {name}, outside shm.pattern")
        holders = [p.pid for p in self.procs.values() if inode in (p.maps | p.fds)]
        if holders:
            self.violate(f"(c) unlinked {name} while pid(s) {holders} map or hold it")
        del self.files[name]
        self.writes.append(Write("unlink", f.path, f.maker))
        return True

    # ------------------------------------------------------------ health (what answers a recipe's port)

    def answers(self, port: int) -> str | None:
        """'ok' when a booted container of ours (or a squatter) listens on ``port``, 'boot' while it loads, None:
        nothing."""
        if port in self.squatted_ports:
            return "ok"
        for c in self.containers.values():
            if c.port == port and c.state == "running":
                if c.behaviour == "hang" or self.now - c.started_at < c.boot_s:
                    return "boot"
                return "ok"
        return None

    def listeners(self, port: int) -> list[tuple[int, str | None]]:
        """(pid, container id or None) of what listens on ``port``: containers of ours whose processes run, and a
        squatter outside any container."""
        out: list[tuple[int, str | None]] = [(99999, None)] if port in self.squatted_ports else []
        for c in self.containers.values():
            if c.port == port and c.state in LIVE_STATES:
                out.append((90000 + len(out), c.id))
        return out

    # ------------------------------------------------------------ sleep mode (what a lane's own origin answers)

    def lane_on(self, port: int | None) -> Container | None:
        """The running container of ours whose server listens on ``port`` (booted: it answers)."""
        if port is None:
            return None
        for c in self.containers.values():
            if (
                c.port == port
                and c.state == "running"
                and c.behaviour != "hang"
                and self.now - c.started_at >= c.boot_s
            ):
                return c
        return None

    def _lane_mem(self, c: Container, each: int) -> None:
        for p in self.procs.values():
            if p.container == c.id and p.gpu is not None and p.gpu_mem is not None:
                p.gpu_mem = each

    def _chance(self, fault: str) -> bool:
        p = self.sleep_faults.get(fault, 0.0)
        return bool(p) and self.rng.random() < p

    def in_flight(self, c: Container) -> int:
        if c.inflight and self.now >= c.busy_until:
            c.inflight = 0
        return c.inflight

    def gauges(self, port: int | None) -> tuple[float, float] | str:
        """vLLM's running and waiting gauges, as the lane's /metrics says them now."""
        c = self.lane_on(port)
        if c is None:
            return f"http://127.0.0.1:{port}/metrics did not answer (connection refused, simulated)"
        n = self.in_flight(c)
        c.said_idle = n == 0
        return float(n), 0.0

    def requests_arrive(self, c: Container, n: int, seconds: float) -> bool:
        """Clients send ``n`` requests that take ``seconds``; a sleeping lane fails them (vLLM answers asleep)."""
        if c.state != "running" or c.sleep_state != "awake":
            return False
        c.inflight = self.in_flight(c) + n
        c.busy_until = max(c.busy_until, self.now + seconds)
        return True

    def is_sleeping(self, port: int | None) -> bool | str:
        """GET /is_sleeping: True only once the lane is fully asleep; a lane half woken still says it sleeps."""
        c = self.lane_on(port)
        if c is None:
            return f"GET http://127.0.0.1:{port}/is_sleeping: ConnectionRefusedError (simulated)"
        if not c.sleep_mode:
            return f"GET http://127.0.0.1:{port}/is_sleeping answered 404"
        if c.sleep_state != "awake":
            c.asleep_seq = self.event()
            return True
        return False

    def lane_post(self, url_port: int | None, path: str) -> tuple[int, str]:
        """A POST to a lane's own origin: /sleep?level=N, /wake_up[?tags=...], /collective_rpc. (status, body)."""
        c = self.lane_on(url_port)
        if c is None:
            raise ConnectionRefusedError(f"[Errno 111] Connection refused (simulated port {url_port})")
        if not c.sleep_mode:
            return 404, '{"detail": "Not Found"}'
        if path.startswith("/sleep"):
            level = int(path.rsplit("=", 1)[1]) if "level=" in path else 1
            self.sleep_calls.append(("sleep", c.id, level))
            self._judge_sleep(c)
            if self._chance("sleep_error"):
                c.sleep_failed, c.stop_tried = True, False
                return 500, '{"error": "simulated: sleep failed"}'
            if self.in_flight(c):
                c.aborted += c.inflight  # vLLM aborts what is in flight when it is put to sleep
                c.inflight = 0
            self.advance(1.0)
            if self._chance("sleep_never"):
                c.sleep_failed, c.stop_tried = True, False
                return 200, "{}"
            if self._chance("sleep_interrupted"):
                c.sleep_failed, c.stop_tried = True, False
                self.restart_lane(c)  # its engine restarted mid-sleep: awake again, from nothing
                return 200, "{}"
            c.sleep_state, c.self_woken = "asleep", False
            self._lane_mem(c, self.residual)
            return 200, "{}"
        if path.startswith("/wake_up"):
            self.sleep_calls.append(("wake", c.id, 0))
            if c.sleep_state == "awake":
                return 200, "{}"
            if "kv_cache" not in path:
                self._judge_wake(c)
                short = self._wake_short(c)
                if short:
                    if self.wake_memory_known(c.id):
                        self.violate(
                            f"(2) woke {c.name} into memory that is not free ({short}): the residual and "
                            "what else holds the card were not counted"
                        )
                    c.sleep_state, c.wake_failed, c.stop_tried = "waking", True, False
                    return 500, f'{{"error": "simulated: CUDA out of memory ({short})"}}'
            self.advance(0.5)
            self._lane_mem(c, self.awake_mem)
            if "kv_cache" not in path and self._chance("wake_error"):
                c.sleep_state, c.wake_failed, c.stop_tried = "waking", True, False
                return 500, '{"error": "simulated: CUDA error during wake"}'
            if "kv_cache" not in path and self._chance("wake_never"):
                c.sleep_state, c.wake_failed, c.stop_tried = "waking", True, False
                return 200, "{}"
            if c.wake_failed:
                return 200, "{}"
            c.sleep_state = "waking" if "tags=weights" in path else "awake"
            return 200, "{}"
        if path.startswith("/collective_rpc"):
            return 200, '{"results": [null]}'
        return 404, '{"detail": "Not Found"}'

    def restart_lane(self, c: Container) -> None:
        """Its container restarts (the engine's restart policy, an OOM kill): new processes, loaded from nothing and
        awake, whatever it was before (vLLM keeps no sleep across a restart)."""
        was = c.asleep
        for pid in [p.pid for p in self.procs.values() if p.container == c.id]:
            self.end_proc(pid)
        c.restarts += 1
        c.started_at = self.now - c.boot_s  # up again at once: what matters is that it is awake
        c.sleep_state, c.inflight = "awake", 0
        c.self_woken = c.self_woken or was or c.sleep_failed
        c.woke_seq = self.event()
        inode = next((f.inode for f in self.files.values() if f.maker == f"container:{c.id}"), None)
        self._spawn_procs(c, inode)

    def _judge_sleep(self, c: Container) -> None:
        """Rule 5: no POST /sleep with requests in flight, unless its drain's last reading said it was idle."""
        if self.in_flight(c) and not c.said_idle:
            self.violate(
                f"(5) POST /sleep to {c.name} with {c.inflight} request(s) in flight, which its drain never saw idle"
            )

    def _wake_short(self, c: Container) -> str:
        """The cards where the wake would not find the memory it takes (its awake footprint less what it keeps
        asleep), by the world's truth."""
        out = []
        for i in sorted(self.cards_of(c)):
            card = self.cards[i]
            procs = [p for p in self.procs.values() if p.gpu == card.uuid]
            used = card.hidden_used + sum((p.gpu_mem or self.awake_mem) for p in procs) + GIB // 2
            need = sum(self.awake_mem - (p.gpu_mem or 0) for p in procs if p.container == c.id)
            if card.total - used < need:
                out.append(f"card {i}: {max(0, card.total - used) / GIB:.1f} GiB free, {need / GIB:.1f} GiB needed")
        return "; ".join(out)

    def _judge_wake(self, c: Container) -> None:
        """Rules 1 and 2 at the wake itself: on its cards nothing else awake, nothing foreign."""
        mine = self.cards_of(c)
        for other in self.containers.values():
            if other.id == c.id or other.state not in LIVE_STATES:
                continue
            shared = mine & self.cards_of(other)
            if not shared:
                continue
            if other.ours and not other.asleep:
                self.violate(f"(1) woke {c.name} on card(s) {sorted(shared)} while {other.name} is awake there")
            elif not other.ours:
                self.violate(f"(2) woke {c.name} on card(s) {sorted(shared)} where foreign {other.name} runs")
        if self.telemetry != "nvml":
            # gpu_telemetry: none: no process list exists for the tool to read (the engine alone says what holds a
            # slot, docs/design.md); a bare process on the card is outside what it is asked to see.
            return
        uuids = {self.cards[i].uuid for i in mine}
        ours = {x.id for x in self.containers.values() if x.ours}
        for p in self.procs.values():
            if p.gpu in uuids and p.container not in ours:
                self.violate(f"(2) woke {c.name} on the card of foreign pid {p.pid} ({p.cmd})")

    # ------------------------------------------------------------ NVML's answer (read_nvml's shape)

    def nvml_raw(self) -> dict[str, Any]:
        if self.nvml_down:
            return {"error": "NVMLError_Unknown: simulated", "devices": [], "device_count": 0}
        devices = []
        present = [c for c in self.cards if c.present]
        for card in present:
            procs = [p for p in self.procs.values() if p.gpu == card.uuid]
            self.pids_read.update(p.pid for p in procs)
            used = card.hidden_used + sum((p.gpu_mem or 20 * GIB) for p in procs) + GIB // 2
            identity: dict[str, Any] = (
                {"identity_errors": {"minor": "NVMLError_NotSupported: simulated"}}
                if self.nvml_hides_identity
                else {"minor": card.minor, "mig": list(card.migs)}
            )
            devices.append(
                {
                    "index": card.index,
                    "name": "NVIDIA H200",
                    "uuid": card.uuid,
                    **identity,
                    "errors": {},
                    "memory_total": card.total,
                    "memory_used": min(used, card.total),
                    "memory_free": max(0, card.total - used),
                    "processes": [{"pid": p.pid, "used_gpu_memory": p.gpu_mem} for p in procs],
                }
            )
        return {"error": None, "driver_version": "sim", "device_count": len(present), "devices": devices}

    def container_of(self, pid: int) -> str | None:
        p = self.procs.get(pid)
        if p is None or not p.resolvable or p.container is None:
            return None
        return p.container if p.container in self.containers else None

    def command_of(self, pid: int) -> str:
        p = self.procs.get(pid)
        return p.cmd if p is not None and p.resolvable else ""


def _uuid(seed: int, i: int) -> str:
    h = hashlib.sha256(f"card-{seed}-{i}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
