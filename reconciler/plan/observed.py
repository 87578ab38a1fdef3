"""Plain values describing what is on the host: the output of observation and the input of the planner.

Pure: frozen dataclasses, and ``observation``, the one constructor of an ``Observed`` (``reconciler.observe.observe``
assembles every observation of the host through it, from Docker, GPU telemetry and /proc; the tests build theirs
through it too). The planner and the renderers read them; nothing here talks to the world.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

# Labels this tool puts on every container it creates. Ownership is decided by these alone.
LABEL_PREFIX = "io.reconciler."
LABEL_MANAGED = LABEL_PREFIX + "managed"
LABEL_HOST = LABEL_PREFIX + "host"
LABEL_RECIPE = LABEL_PREFIX + "recipe"
LABEL_RECIPE_HASH = LABEL_PREFIX + "recipe-hash"
LABEL_SLOTS = LABEL_PREFIX + "slots"
LABEL_GPUS = LABEL_PREFIX + "gpus"
LABEL_OFFLOAD = LABEL_PREFIX + "offload"
LABEL_PRESERVED = LABEL_PREFIX + "preserved"
# This install's id (reconciler.store.state): with the host's name, the proof that a container is ours.
LABEL_INSTALL = LABEL_PREFIX + "install"
# A random token per create, also kept in the install's record until the create's answer gives the container's id:
# a create whose answer was lost is still known for this install's by its name and this token (reconciler.store.state).
LABEL_CREATE_TOKEN = LABEL_PREFIX + "create-token"
# The hash of the whole rendered container (reconciler.plan.spec), and the hash of each of its parts.
LABEL_SPEC_HASH = LABEL_PREFIX + "spec-hash"
LABEL_SPEC_PARTS = LABEL_PREFIX + "spec-parts"
# The recipe hash's version its hashes were made under (reconciler.model.recipe_hash.hash_version); none: version 1,
# the release before the label.
LABEL_HASH_VERSION = LABEL_PREFIX + "hash-version"

# Docker cannot relabel a container, so a failed one kept for its logs is marked by this name suffix.
PRESERVED_SUFFIX = "-failed-"
_PRESERVED_RE = re.compile(r"-failed-\d{8}-\d{6}$")

# Container states. Docker's, and those Podman's Docker API passes through besides: "configured" (created, never
# started), "stopping" (a stop in progress: its processes still run), "stopped" (they exited; Podman's clean-up
# pending), "unknown". A container holds its GPUs and its offload files in every state but these, where its processes
# never ran or have ended; a state this list does not know (a newer engine's word) holds them too (fail closed).
NEVER_STARTED_STATES = frozenset({"created", "configured"})
ENDED_STATES = frozenset({"exited", "dead", "stopped", "removing"})
INACTIVE_STATES = NEVER_STARTED_STATES | ENDED_STATES


@dataclass(frozen=True)
class Reading:
    """One reading of the host (the engine, /proc and the offload dir, the GPUs) and whether it answered completely.
    ("source" in this code is the git source alone; the JSON keeps its word ``sources`` for these readings.)"""

    name: str  # "docker" | "proc" | "gpu"
    ok: bool
    detail: str = ""
    # Why it is unavailable, where that is known: "slow" (answered too slowly), "down" (does not answer), "error"
    # (answered, but with an error), "uninspectable" (/proc: a process whose maps or fds cannot be read, not
    # excused). "" when ok or not said.
    cause: str = ""

    def render(self) -> str:
        return "ok" if self.ok else f"unavailable: {self.detail}"


@dataclass(frozen=True)
class ContainerView:
    """One Docker container, as far as this tool cares."""

    id: str
    name: str
    state: str  # docker's State: created, running, restarting, paused, exited, dead, removing
    image: str
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    exit_code: int | None = None
    # GPUs the container is given: physical ids as written (index or UUID), or ("all",).
    gpu_devices: tuple[str, ...] = ()
    # vLLM native offload configured (our label, vLLM flags in its command, or offload env).
    offload: bool = False
    # Label keys whose value the container inherited from its image's labels: never proof of anything.
    inherited: frozenset[str] = frozenset()
    # Host ports the engine publishes for it (a bridged container's ports, served by the engine's proxy process).
    published_ports: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        return self.state not in INACTIVE_STATES

    @property
    def managed(self) -> bool:
        return self.labels.get(LABEL_MANAGED) == "true"

    @property
    def preserved(self) -> bool:
        """A failed container kept (stopped, renamed ``NAME-failed-YYYYMMDD-HHMMSS``) so its logs stay readable."""
        return self.labels.get(LABEL_PRESERVED) == "true" or bool(_PRESERVED_RE.search(self.name))

    @property
    def recipe(self) -> str | None:
        return self.labels.get(LABEL_RECIPE)

    @property
    def recipe_hash(self) -> str | None:
        return self.labels.get(LABEL_RECIPE_HASH)

    @property
    def spec_hash(self) -> str | None:
        return self.labels.get(LABEL_SPEC_HASH)

    @property
    def hash_version(self) -> int | None:
        """The hash version of its labels: 1 without the label (or with one only its image gave it), None when the
        label is no version."""
        raw = self.label(LABEL_HASH_VERSION)
        if raw is None:
            return 1
        return int(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) < 1 << 16 else None

    def label(self, key: str) -> str | None:
        """A label's value, unless the container only inherited it from its image."""
        return None if key in self.inherited else self.labels.get(key)

    @property
    def names(self) -> frozenset[str]:
        """What an offload file's owner may name this container by (``Owner.container``): its name or its id."""
        return frozenset((self.name, self.id, self.id[:12]))

    @property
    def slots(self) -> tuple[str, ...]:
        raw = self.labels.get(LABEL_SLOTS, "")
        return tuple(s for s in raw.split(",") if s)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    container_id: str | None = None  # full id when the pid runs in a Docker container
    command: str = ""
    # False when the pid is not found in this /proc (another pid namespace, as container pids on WSL2, or gone).
    resolved: bool = True


@dataclass(frozen=True)
class GpuSlotView:
    """One configured slot as GPU telemetry sees it."""

    slot: str
    index: int | None
    uuid: str | None
    name: str = ""
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    missing: bool = False  # configured, but no such GPU on the host
    error: str = ""
    # NVML's own free figure (total - used where it is not given); None where memory is not known.
    memory_free_bytes: int | None = None
    utilization_percent: int | None = None  # None: not reported by this driver (WSL2: N/A), or not read
    # The card's other names, as NVML reports them: its device node's minor number (/dev/nvidiaN) and the UUIDs of
    # its MIG devices (empty with MIG off). None: not known (telemetry none, or NVML did not say).
    minor: int | None = None
    mig_uuids: tuple[str, ...] | None = None

    @property
    def free_bytes(self) -> int | None:
        if self.memory_free_bytes is not None:
            return self.memory_free_bytes
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return max(0, self.memory_total_bytes - self.memory_used_bytes)


@dataclass(frozen=True)
class GpuView:
    """GPU telemetry for all configured slots. With ``telemetry == "none"`` there are no processes to see."""

    telemetry: str  # "nvml" | "none"
    reading: Reading
    slots: dict[str, GpuSlotView] = field(default_factory=dict)
    # What the driver answers, learnt from its answers: "reported", "not reported" (NVML's N/A: WSL2), or
    # "unknown" (nothing to judge by: no process listed, telemetry none or down).
    process_memory: str = "unknown"
    utilization: str = "unknown"


@dataclass(frozen=True)
class NodeHolder:
    """A process that holds a card's device node open (a descriptor on character node 195:``minor``, whatever its
    path): it can use that card though NVML lists it nowhere (NVML lists a process once it has a CUDA context)."""

    pid: int
    minor: int
    container_id: str | None = None  # the engine's container it runs in (full id); None: none the engine lists
    container: str | None = None  # what to call that container (its name, or what its cgroup says)
    command: str = ""


@dataclass(frozen=True)
class CardNodes:
    """Who holds a card's node open, from the /proc scan of every pass; ``read`` False when that scan could not be
    made (``detail`` says why): then no process is known not to hold one."""

    holders: tuple[NodeHolder, ...] = ()
    read: bool = True
    detail: str = ""


@dataclass(frozen=True)
class Owner:
    pid: int
    via: str  # "map" | "fd"
    container: str | None = None  # container name (or id) when the pid belongs to one
    command: str = ""


@dataclass(frozen=True)
class ShmFile:
    path: str
    dev: int
    inode: int
    size_bytes: int
    allocated_bytes: int
    owners: tuple[Owner, ...] = ()
    state: str = "orphan"  # "owned" | "orphan" | "blocked"
    reason: str = ""


@dataclass(frozen=True)
class Uninspectable:
    pid: int
    command: str
    reason: str
    excused: bool


@dataclass(frozen=True)
class Tmpfs:
    size_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class ShmView:
    """The offload files in ``shm.dir`` and who holds them."""

    dir: str
    pattern: str
    tmpfs: Tmpfs
    proc: Reading
    docker: Reading
    files: tuple[ShmFile, ...] = ()
    # Running containers with native offload configured: while any exists, nothing is reclaimed.
    blocking_containers: tuple[str, ...] = ()
    # Bytes of files already unlinked but still mapped (``(deleted)`` in maps): owned, with no path.
    deleted_mapped_bytes: int = 0
    deleted_mapped: tuple[ShmFile, ...] = ()
    uninspectable: tuple[Uninspectable, ...] = ()
    # Entries that matched the pattern but were refused (symlink, directory, outside dir): path -> why.
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def readings_ok(self) -> bool:
        return self.proc.ok and self.docker.ok

    def by_state(self, state: str) -> tuple[ShmFile, ...]:
        return tuple(f for f in self.files if f.state == state)

    def held_only_by(self, names: Collection[str]) -> tuple[ShmFile, ...]:
        """The files some process holds, each holder in a container named by ``names`` (one container's names)."""
        return tuple(f for f in self.files if f.owners and all(o.container in names for o in f.owners))


@dataclass(frozen=True)
class Ownership:
    """What this install keeps about the host (``reconciler.store.state``): its id, the containers it created (their ids,
    recorded at create: the proof, beside the labels anyone can copy), those an operator adopted and those that
    passed their health check.

    ``created`` is None for an install whose record predates created ids: until its first apply records the
    containers that carry its labels then (docs/design.md, safety rule 9), the labels decide as they did.
    ``pending`` holds (container name, create token) of creates whose answer has not given an id yet."""

    install_id: str | None = None
    adopted: frozenset[str] = frozenset()
    healthy: frozenset[str] = frozenset()
    created: frozenset[str] | None = None
    pending: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class LaneMemory:
    """GPU memory of one lane's container, bytes per slot, as NVML attributed it to the container's processes."""

    awake: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)
    asleep: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)

    def wake_needs(self, slot: str) -> int | None:
        """The bytes a wake takes on ``slot`` beyond what the sleeping lane holds there; None: never measured."""
        if slot not in self.awake:
            return None
        return max(0, self.awake[slot] - self.asleep.get(slot, 0))


@dataclass(frozen=True)
class Listener:
    """A TCP socket listening in this host's network namespace (``/proc/net/tcp``, ``/proc/net/tcp6``), with the
    process holding it where /proc tells (``pid`` None: no process of this /proc could be found holding it)."""

    address: str  # "0.0.0.0", "127.0.0.1", "::", "::1", ...
    port: int
    inode: int
    pid: int | None = None
    command: str = ""
    container_id: str | None = None  # full id when the pid runs in a container the engine lists

    @property
    def reachable_from_loopback(self) -> bool:
        """Whether a connection to a loopback address on its port would reach it (bound to any or to loopback)."""
        a = self.address
        return a in ("0.0.0.0", "::", "::1") or a.startswith("127.") or a.startswith("::ffff:127.")


@dataclass(frozen=True)
class EnterFacts:
    """What decides, before anything stops, whether an enter can start at all (docs/design.md, "Knowable
    failures of an enter"): whether each image the recipes name is on the engine, whether the engine has NVIDIA's
    runtime, and what listens on the recipes' ports. The default is "not observed": then nothing is judged by it."""

    images: tuple[tuple[str, bool], ...] = ()  # (image as the recipe names it, present on the engine)
    gpu_runtime: str = "unknown"  # "present" | "absent" | "unknown" (not asked, or the engine cannot tell)
    gpu_runtime_detail: str = ""  # what the engine listed, for the message
    ports: frozenset[int] = frozenset()  # the ports whose listeners were looked up
    listeners: tuple[Listener, ...] = ()

    def image_present(self, image: str) -> bool | None:
        """True or False where the engine was asked, None where it was not."""
        return next((present for name, present in self.images if name == image), None)

    def listening(self, port: int) -> tuple[Listener, ...] | None:
        """The listeners a loopback URL on ``port`` would reach; None where the port was not looked up."""
        if port not in self.ports:
            return None
        return tuple(x for x in self.listeners if x.port == port and x.reachable_from_loopback)


@dataclass(frozen=True)
class Observed:
    """Everything one observation pass saw. Sources that failed are recorded, never papered over."""

    host: str
    containers: tuple[ContainerView, ...]
    gpus: GpuView
    shm: ShmView
    docker: Reading
    ownership: Ownership = Ownership()
    enter: EnterFacts = EnterFacts()
    # Container id -> its lane's own answer to GET /is_sleeping (lanes whose recipe has [sleep]); absent: not asked,
    # or no answer. Only an answer proves a lane asleep: a 200 from /health says nothing of it.
    sleeping: Mapping[str, bool] = field(default_factory=dict, hash=False, compare=False)
    # Container id -> the GPU memory its lane held, measured at its last enter or wake (awake) and sleep (asleep).
    lane_memory: Mapping[str, LaneMemory] = field(default_factory=dict, hash=False, compare=False)
    # The processes holding a card's device node open (docs/design.md, safety rule 11).
    card_nodes: CardNodes = CardNodes()

    @property
    def readings(self) -> dict[str, Reading]:
        return {"docker": self.docker, "proc": self.shm.proc, "gpu": self.gpus.reading}

    def unavailable(self) -> list[Reading]:
        return [s for s in self.readings.values() if not s.ok]


ENGINE_ANSWERED = Reading("docker", True)


def observation(
    host: str,
    *,
    containers: Collection[ContainerView] = (),
    docker: Reading = ENGINE_ANSWERED,
    gpus: GpuView | None = None,
    shm: ShmView | None = None,
    **facts: Any,
) -> Observed:
    """The one constructor of an observation: ``reconciler.observe.observe`` makes every one from the host's sources
    through it, and the tests' observations go through it too, so all are made alike. A fact not given takes its
    default: the engine answered, no GPU telemetry (``gpus``: telemetry "none", from the engine alone), an empty
    /dev/shm whose /proc scan was whole and whose ``docker`` source is the observation's own, and every other field
    of ``Observed`` (``facts``, by its name) its own default."""
    if gpus is None:
        gpus = GpuView(telemetry="none", reading=Reading("gpu", True, "GPU occupancy from Docker alone"))
    if shm is None:
        shm = ShmView("/dev/shm", "vllm_offload_*.mmap", Tmpfs(0, 0, 0), Reading("proc", True), docker)
    return Observed(host=host, containers=tuple(containers), gpus=gpus, shm=shm, docker=docker, **facts)
