"""The outermost I/O seams of the project, answered by the simulated world; everything between them is real.

The project reaches the host through one object, ``reconciler.apply.host_io.HostIO``; ``sim_io`` builds one whose
every part is the world's and ``installed`` hands it in whole (``world.io``: the loop, the applier, the guard, the
service and the loader take it), patching no name of the project. Answered by the world: the container engine (``SimEngine``, an implementation of the engine protocol, ``reconciler.host.engine.protocol.Engine``), the
sources of one observation (``sim_sources``, a ``reconciler.observe.seams.ObserveSeams``: the project's own
``observe`` assembles every fact from them, and no copy of it is kept here), among them the NVML read
(``observe_gpus``'s ``read``, ``container_of`` and ``command_of``), the /proc and shm.dir reads of one inspection
(``list_dir`` and the per-process reads of ``scan_holders``, through the real ``settle_scan`` and the real pure
``build_view``; the world moves between the reads) and who listens on the recipes' ports, the guard's unlink (behind the kernel's write lease,
modelled from who holds the file) and its statvfs, the loader's tmpfs checks, the health URL's answer and vLLM's gauges, the clock and sleep of the apply
layer, the guard, the loop and the engine-call retries, and a sleeping lane's answers (GET /is_sleeping, the POSTs of a sleep
and a wake). Kept real: the loader and its files on disk, the model, the
planner, the apply layer, the loop's cycle, the guard's decisions, the state, history and audit files.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from sim.world import LIVE_STATES, SHM_DIR, ApiError, World


class Interleaver:
    """Runs a group's actions (``reconciler.apply.groups.run_in_threads``'s place) each in a thread of its own, but one
    at a time: a thread runs only while it holds the turn, and at each seam it calls (an engine request, a read of one
    process during a /proc scan, an unlink, a sleep, a wait for a lock another action holds) the turn passes to a thread
    drawn from this seed's own random numbers, itself included. Every interleaving at those seams is one a seed can
    draw, and a run still replays from its seed. A lock the apply layer takes (``Applier``'s guard and files locks) is a
    ``SimLock``: waiting for it passes the turn, so the holder runs on."""

    def __init__(self, world: World):
        self.world = world
        self.rng = random.Random(world.seed ^ 0x5EED5)
        self._cv = threading.Condition()
        self._local = threading.local()
        self._turn: int | None = None
        self._live: set[int] = set()
        self.switches = 0  # turns passed to another action (the tests' witness that actions interleaved)
        self.groups = 0

    def run(self, calls: list[Any]) -> list[Any]:
        if len(calls) < 2 or self._live:
            return [call() for call in calls]
        n = len(calls)
        results: list[Any] = [None] * n
        errors: list[BaseException | None] = [None] * n
        self.groups += 1

        def body(i: int) -> None:
            self._local.index = i
            with self._cv:
                self._cv.wait_for(lambda: self._turn == i)
            try:
                results[i] = calls[i]()
            except BaseException as exc:  # noqa: BLE001 - raised in the group's caller, as invariant (e) wants
                errors[i] = exc
            finally:
                with self._cv:
                    self._live.discard(i)
                    self._turn = self.rng.choice(sorted(self._live)) if self._live else None
                    self._cv.notify_all()

        threads = [threading.Thread(target=body, args=(i,), name=f"sim-action-{i}", daemon=True) for i in range(n)]
        with self._cv:
            self._live = set(range(n))
            self._turn = self.rng.randrange(n)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for exc in errors:
            if exc is not None:
                raise exc
        return results

    def point(self, *, waiting: bool = False) -> None:
        """A seam: the turn may pass to another live action (with ``waiting``, it must: this one waits for it)."""
        me = getattr(self._local, "index", None)
        if me is None:
            return
        with self._cv:
            if me not in self._live:
                return
            others = sorted(j for j in self._live if j != me)
            pick = others if waiting else sorted(self._live)
            if not pick:
                raise RuntimeError("simulation: an action waits for a lock no other live action holds")
            nxt = self.rng.choice(pick)
            if nxt == me:
                return
            self.switches += 1
            self._turn = nxt
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn == me)


class SimLock:
    """A lock of the apply layer under the interleaver: waiting for it passes the turn to the action holding it."""

    def __init__(self, sched: Interleaver):
        self.sched = sched
        self.owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        while self.owner is not None:
            if not blocking:
                return False
            if getattr(self.sched._local, "index", None) is None:
                raise RuntimeError("simulation: a lock held by an action is waited for outside the group")
            self.sched.point(waiting=True)
        self.owner = me
        return True

    def release(self) -> None:
        self.owner = None

    def locked(self) -> bool:
        return self.owner is not None

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _engine_error(exc: BaseException) -> BaseException:
    """The engine protocol's error for the world's (``reconciler.host.engine.protocol``)."""
    from reconciler.host.engine.protocol import EngineDown, EngineError, NotFound

    if isinstance(exc, ApiError):
        return (NotFound if exc.status == 404 else EngineError)(exc.status, str(exc))
    if isinstance(exc, ConnectionError):
        return EngineDown(f"the engine does not answer: {exc}")
    return exc


def _engine(fn: Any) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.w.point()  # a request to the engine: another action may run meanwhile
        try:
            return fn(self, *args, **kwargs)
        except (ApiError, ConnectionError) as exc:
            raise _engine_error(exc) from None

    call.__name__ = fn.__name__
    return call


class SimEngine:
    """The simulated host's container engine: an implementation of ``reconciler.host.engine.protocol.Engine`` (held
    to it by tests/real/test_engine_conformance.py beside Docker's and Podman's), answered by the world.

    Its events are the state changes its own calls made, in order (a start, a death, a removal); a stream ends
    when it has given every one so far: the world has no wall time to wait in."""

    kind = "sim"

    def __init__(self, world: World, url: str = "unix:///sim/engine.sock"):
        self.w = world
        self.url = url
        self._log: list[dict[str, Any]] = []

    @_engine
    def ping(self) -> None:
        self.w._fault("ping")

    @_engine
    def version(self) -> dict[str, Any]:
        self.w._fault("version")
        return {"Version": "sim", "ApiVersion": "1.41", "Components": [{"Name": "Engine", "Version": "sim"}]}

    @_engine
    def info(self) -> dict[str, Any]:
        self.w._fault("info")
        return {"Runtimes": {"runc": {}, **({"nvidia": {}} if self.w.gpu_runtime else {})}}

    @_engine
    def containers(self, *, labels: Any = None) -> list[dict[str, Any]]:
        self.w._fault("list")
        out = []
        for c in self.w.containers.values():
            if any(c.labels.get(k) != v for k, v in (labels or {}).items()):
                continue
            status = f"Exited ({c.exit_code}) 1 second ago" if c.state in ("exited", "stopped") else c.state
            out.append(
                {
                    "Id": c.id,
                    "Names": ["/" + c.name],
                    "State": c.state,
                    "Status": status,
                    "Image": c.image,
                    "Labels": dict(c.labels),
                }
            )
        return out

    @_engine
    def inspect_container(self, ref: str) -> dict[str, Any]:
        self.w._fault("inspect")
        c = self.w.get(ref)
        reqs = (
            [{"Driver": "nvidia", "DeviceIDs": list(c.device_ids), "Capabilities": [["gpu"]]}] if c.device_ids else None
        )
        return {
            "Id": c.id,
            "Name": "/" + c.name,
            "Image": "sha256:" + c.image.replace(":", ""),
            "Args": c.command[1:],
            "State": {
                "Status": c.state,
                "Running": c.state == "running",
                "ExitCode": c.exit_code,
                "RestartCount": c.restarts,
            },
            "RestartCount": c.restarts,
            "Config": {
                "Env": [f"{k}={v}" for k, v in c.env.items()],
                "Cmd": c.command,
                "Entrypoint": None,
                "Labels": dict(c.labels),
                "Image": c.image,
            },
            "HostConfig": {
                "DeviceRequests": reqs,
                "Devices": [{"PathOnHost": d, "PathInContainer": d, "CgroupPermissions": "rwm"} for d in c.devices],
                "Privileged": c.privileged,
                "DeviceCgroupRules": list(c.cgroup_rules) or None,
                "Binds": list(c.binds) or None,
                "CapDrop": list(c.cap_drop) or None,
            },
        }

    @_engine
    def inspect_image(self, ref: str) -> dict[str, Any]:
        self.w._fault("inspect_image")
        name = next((i for i in self.w.images if ref in (i, "sha256:" + i.replace(":", ""))), None)
        if name is None:
            raise ApiError(404, f"No such image: {ref}")
        return {"Id": "sha256:" + name.replace(":", ""), "Config": {"Labels": dict(self.w.images[name])}}

    @_engine
    def create(self, spec: Any) -> str:
        hc = spec["host_config"]
        ids = [d for r in hc.get("device_requests") or [] for d in r.get("DeviceIDs") or []]
        c = self.w.create(
            name=spec["name"],
            image=spec["image"],
            labels=dict(spec.get("labels") or {}),
            env=dict(spec.get("environment") or {}),
            command=list(spec.get("command") or []),
            device_ids=ids,
        )
        c.binds = list(hc.get("binds") or [])
        return str(c.id)

    def _changed(self, ref: str, act: Any) -> None:
        """Run ``act`` and log the events of the state change it made to ``ref``'s container."""
        before = self.w.containers.get(ref) or next((x for x in self.w.containers.values() if x.name == ref), None)
        cid, was = (before.id, before.state) if before is not None else (ref, None)
        live = ("running", "stopping", "paused", "restarting")
        try:
            act()
        finally:
            after = self.w.containers.get(cid)
            now = after.state if after is not None else None
            if was not in live and now in live:
                self._event(cid, "start")
            if (was in live or now in live) and now not in live:
                if was not in live:
                    self._event(cid, "start")
                self._event(cid, "die")
            if before is not None and after is None:
                self._event(cid, "destroy")

    def _event(self, cid: str, action: str) -> None:
        self._log.append({"Type": "container", "Action": action, "status": action, "id": cid, "Actor": {"ID": cid}})

    @_engine
    def start(self, ref: str) -> None:
        self._changed(ref, lambda: self.w.start(ref))

    @_engine
    def stop(self, ref: str, *, timeout_s: int) -> None:
        self._changed(ref, lambda: self.w.stop(ref, timeout=timeout_s))

    @_engine
    def kill(self, ref: str) -> None:
        self._changed(ref, lambda: self.w.kill(ref))

    @_engine
    def remove(self, ref: str) -> None:
        self._changed(ref, lambda: self.w.remove(ref))

    @_engine
    def rename(self, ref: str, name: str) -> None:
        self.w.rename(ref, name)

    @_engine
    def logs(self, ref: str, *, tail: int) -> str:
        self.w.get(ref)
        return "simulated log line\n"

    @_engine
    def events(self, *, actions: Any) -> Iterator[dict[str, Any]]:
        self.w._fault("events")
        start = len(self._log)
        wanted = set(actions)

        def stream() -> Iterator[dict[str, Any]]:
            i = start
            while i < len(self._log):
                ev = self._log[i]
                i += 1
                if ev["Action"] in wanted:
                    yield ev

        return stream()


def sim_observer(world: World, url: str) -> Any:
    """A real ``EngineObserver`` (its cache, its parse) whose engine is the world's."""
    from reconciler.observe.containers import EngineObserver

    return EngineObserver(url, engine=SimEngine(world, url))


def sim_scan(world: World) -> Any:
    """The holder scan as ``procfs.scan_holders`` makes it, over the world's /proc: the real ``settle_scan`` lists
    again while a listing loses a process unread, while the world's scan hooks fork, exit and hand mappings down between
    the reads. Records which inodes were held without a break all through it (the lease check's truth)."""
    from reconciler.observe.proc_settle import settle_scan
    from reconciler.observe.procfs import FdTarget, HolderScan

    scan = HolderScan(dev=1)
    through = world.held_inodes()

    def list_pids() -> list[str]:
        return [str(pid) for pid in sorted(world.procs) if world.procs[pid].resolvable]

    def start_time(pid: int) -> int | None:
        p = world.procs.get(pid)
        return p.start if p is not None and p.resolvable else None

    def scan_names(names: list[str], into: Any) -> None:
        nonlocal through
        for name in names:
            world.point()  # a read of one process: another action may run meanwhile
            for hook in list(world.scan_hooks):
                hook(world)
            through &= world.held_inodes()
            p = world.procs.get(int(name))
            if p is None or not p.resolvable:
                into.lost.append(int(name))  # gone before it was read: a child forked since may hold what it held
                continue
            into.seen[p.pid] = p.start
            world.pids_read.add(p.pid)
            into.pids_scanned += 1
            if not p.inspectable:
                into.unreadable[p.pid] = "Permission denied (simulated)"
                continue
            if p.maps:
                into.mapped.setdefault(p.pid, set()).update(p.maps)
            for ino in sorted(p.fds):
                f = next((x for x in world.files.values() if x.inode == ino), None)
                size = f.size if f else 0
                into.fds.setdefault(p.pid, []).append(FdTarget(3, ino, size, size, 1 if f else 0))

    scan_names(list_pids(), scan)
    settle_scan(scan, list_pids=list_pids, start_time=start_time, scan_names=scan_names)
    world.held_through_scan = through & world.held_inodes()
    return scan


def sim_shm(world: World, cfg: Any, *, containers: Any, docker: Any, settled: Any = (), on_cards: Any = None) -> Any:
    """One inspection of shm.dir and every process, as ``inspect_shm`` makes it, from the world's truth; hands
    ``on_cards`` the processes holding a card's node open once the scan was made whole, as the real one does."""
    from reconciler.observe.shm import DirEntry, DirListing, build_view, owner_container, unavailable_view
    from reconciler.plan.observed import NodeHolder, Owner, Tmpfs

    entries = tuple(
        DirEntry(f.name, 0o100600, 1, f.inode, f.size, f.size, 1)
        for f in sorted(world.files.values(), key=lambda f: f.name)
    )
    used = sum(f.size for f in world.files.values())
    listing = DirListing(1, entries, Tmpfs(world.tmpfs_size, used, world.tmpfs_size - used))
    scan = sim_scan(world)
    if scan.unstable:
        return unavailable_view(
            cfg,
            listing=listing,
            containers=containers,
            docker=docker,
            proc_error=f"/proc: {scan.unstable}",
            settled=settled,
        )
    names = {c.id: c.name for c in containers}
    if on_cards is not None:
        on_cards(
            tuple(
                NodeHolder(p.pid, minor, cid, names.get(cid or ""), world.command_of(p.pid))
                for p in sorted(world.procs.values(), key=lambda p: p.pid)
                if p.resolvable
                for minor in sorted(p.nodes)
                for cid in [world.container_of(p.pid)]
            )
        )

    def owner(pid: int, via: str) -> Any:
        p = world.procs.get(pid)  # resolved after the scan, as the real resolver reads cgroup and cmdline then
        ctr = owner_container([p.container] if p and p.container else [], names, engine_ok=docker.ok)
        return Owner(pid, via, ctr, p.cmd if p else "")

    holders = {ino: [owner(pid, via) for pid, via in pairs] for ino, pairs in scan.holders().items()}
    unreadable = {
        pid: (world.procs[pid].cmd if pid in world.procs else "", why) for pid, why in scan.unreadable.items()
    }
    return build_view(
        cfg,
        listing=listing,
        holders=holders,
        deleted=(),
        unreadable=unreadable,
        containers=containers,
        docker=docker,
        settled=settled,
    )


def sim_listeners(world: World, ports: Any, *, known_containers: Any = None) -> Any:
    """Who listens on the recipes' ports (``read_listeners``'s answer), from the world: each port looked up."""
    from reconciler.plan.observed import Listener

    listeners = tuple(
        Listener("0.0.0.0", port, 1, pid, "sim squatter" if cid is None else "vllm serve", cid)
        for port in ports
        for pid, cid in world.listeners(port)
    )
    return frozenset(ports), listeners


def sim_sources(world: World) -> Any:
    """The sources of one observation (``reconciler.observe.seams.ObserveSeams``) as the world answers them; the
    observation itself is the project's own ``observe``, which assembles every fact from these."""
    import functools

    from reconciler.observe.gpu import observe_gpus
    from reconciler.observe.seams import ObserveSeams

    def gpus(host: Any, *, known_containers: Any = None) -> Any:
        return observe_gpus(
            host, read=lambda _h: world.nvml_raw(), container_of=world.container_of, command_of=world.command_of
        )

    return ObserveSeams(
        engine=lambda host: sim_observer(world, host.docker.url),
        # No toolkit hook on the simulated host: its engine's runtimes alone say whether it can give GPUs.
        toolkit_hook=lambda: False,
        gpus=gpus,
        processes=functools.partial(sim_shm, world),
        listeners=functools.partial(sim_listeners, world),
        # Each sleeping-mode lane asked as ``observe`` asks it (the real reader, the world answering GET /is_sleeping).
        is_sleeping=_ask_sleeping(world),
    )


def _taking_down(world: World) -> Any:
    def taking_down(host: str, recipe: str, slots: str) -> Any:
        world.taken_down[recipe] = world.taken_down.get(recipe, 0) + 1

        def undo() -> None:
            world.taken_down[recipe] -= 1

        return undo

    return taking_down


def _unlink_agreed(world: World) -> Any:
    from reconciler.apply.shm_results import KeptFile, RemovedFile
    from reconciler.apply.shm_unlink import LeaseRefused, lease_kept

    def unlink_agreed(directory: str, dir_id: Any, agreed: Any, *, pattern: str | None = None) -> Any:
        import fnmatch

        removed, kept = [], []
        for f in agreed:
            parent, name = os.path.split(f.path)
            if parent != directory or (pattern is not None and not fnmatch.fnmatchcase(name, pattern)):
                kept.append(KeptFile(f.path, "not a name of shm.dir matching shm.pattern: never removed", "skipped"))
                continue
            world.point()  # between the inspection and the unlink: another action may run meanwhile
            made = world.files[name].maker.removeprefix("container:") if name in world.files else ""
            sleeper = world.containers.get(made)
            if sleeper is not None and sleeper.state in LIVE_STATES and sleeper.asleep:
                # Sleeping lanes rule 4: a sleeping offload lane's file is mapped by its workers and never reclaimed.
                world.violate(f"(4) an unlink of {name} was tried, the offload file of sleeping lane {sleeper.name}")
            # The kernel's write lease (shm_unlink.take_lease), from the truth: refused while any process holds it.
            holders = world.lease_refused(f.inode) if name in world.files else []
            if holders:
                if f.inode in world.held_through_scan:
                    world.violate(
                        f"(c) the /proc scan missed pid(s) {holders}, which held {name} all through it: only the "
                        "lease gate kept the file"
                    )
                kept.append(lease_kept(f, LeaseRefused("the kernel refused the write lease (simulated): in use")))
                continue
            if world.unlink(name, inode=f.inode, size=f.size_bytes):
                removed.append(RemovedFile(f.path, f.size_bytes, f.size_bytes, f.dev, f.inode))
            else:
                kept.append(KeptFile(f.path, "changed just before removal (not the inspected file any more)", f.state))
        return removed, kept, []

    return unlink_agreed


def _path_refusal(world: World) -> Any:
    def path_refusal(directory: str, pattern: str, path: str) -> str | None:
        import fnmatch

        parent, name = os.path.split(path)
        if parent != directory or not name or name in (".", ".."):
            return f"not directly inside shm.dir {directory}"
        if not fnmatch.fnmatchcase(name, pattern):
            return f"name does not match shm.pattern {pattern!r}"
        return None if name in world.files else "cannot be examined: No such file or directory"

    return path_refusal


def _health(world: World, url: str) -> str | None:
    port = urlsplit(url).port
    return world.answers(port) if port is not None else None


def _lane_request(world: World) -> Any:
    """``lane_http.request`` as the sleep and the wake call it: a POST to the lane's own origin, answered by the
    world (a refused connection raises as urllib's does)."""
    from reconciler.apply.lane_http import Answer

    def request(url: str, payload: Any, timeout: float) -> Any:
        world.point()  # a request to a lane: another action may run meanwhile
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            status, body = world.lane_post(parts.port, path)
        except ConnectionRefusedError as exc:
            import urllib.error

            raise urllib.error.URLError(exc) from None
        return Answer(status, body.encode(), "application/json")

    return request


def _ask_sleeping(world: World) -> Any:
    def ask_sleeping(origin: str, timeout: float = 2.0) -> bool | str:
        return world.is_sleeping(urlsplit(origin).port)

    return ask_sleeping


def _listeners(world: World, ports: Any) -> Any:
    """Who listens on each port, as /proc would say: every running container's server, from its start on."""
    from reconciler.apply.ports import PortHolder
    from reconciler.observe.net import TcpListener

    view: dict[int, list[Any]] = {port: [] for port in ports}
    for n, c in enumerate(world.containers.values()):
        if c.port in view and c.state == "running":
            view[c.port].append((TcpListener("0.0.0.0", c.port, 0, 1000 + n), [PortHolder(1000 + n, "vllm", (c.id,))]))
    return view


def sim_io(world: World) -> Any:
    """The host's I/O seams (``reconciler.apply.host_io.HostIO``) as the world answers them: every part its own."""
    from reconciler.apply.host_io import HostIO, LaneHttp
    from reconciler.apply.shm_guard import ShmIO
    from reconciler.base.clock import Clock
    from reconciler.load.tmpfs import TmpfsReads
    from reconciler.plan.observed import Tmpfs

    # Actions on disjoint slots run interleaved at their seams, in an order the seed draws (Interleaver); a lock of
    # the apply layer is a SimLock: waiting for it passes the turn to its holder.
    sched = Interleaver(world)
    world.sched = sched
    sources = sim_sources(world)

    def inspect(cfg: Any, observe_docker: Any, proc_root: str, *, settled: Any = ()) -> Any:
        containers, docker = observe_docker()
        return sim_shm(world, cfg, containers=containers, docker=docker, settled=settled)

    def verify(directory: str, removed: Any) -> tuple[bool, list[str]]:
        return all(os.path.basename(f.path) not in world.files for f in removed), []

    def tmpfs_of(path: str) -> Any:
        return Tmpfs(world.tmpfs_size, world.tmpfs_size - world.free_bytes(), world.free_bytes())

    return HostIO(
        # The world's clocks (the wall clock may jump apart from the monotonic one), and a sleep that moves them.
        clock=Clock(time=world.wall, monotonic=lambda: world.now, sleep=world.sleep),
        engine=sources.engine,
        sources=sources,
        listeners=lambda ports: _listeners(world, ports),
        lanes=LaneHttp(
            health_ok=lambda url: _health(world, url) == "ok",
            answer=lambda url, **kw: None if _health(world, url) is None else "HTTP 200",
            # The lane's POSTs (a sleep, a wake, the drain's /pause: a 404 here, so the gauges) and its GET /version.
            request=_lane_request(world),
            gauges=lambda url, **kw: world.gauges(urlsplit(url).port),
            is_sleeping=sources.is_sleeping,
            # What each lane's server says of itself (the loop's metrics only): no simulated lane serves HTTP, and
            # no real server on this machine may answer for one.
            readings=lambda desired, observed: {},
            # What the front door says of a lane, as the drain reads it: the simulated door's (tests/sim/door.py)
            # where one is drawn, else none stands before the lanes.
            front=lambda host, recipe: world.door.front(host, recipe) if world.door is not None else None,
            # The lanes being taken down, kept in the world (what the door's view reads of them).
            taking_down=_taking_down(world),
            taken_down=lambda host: frozenset(r for r, n in world.taken_down.items() if n > 0),
        ),
        shm=ShmIO(
            inspect=inspect,
            dir_identity=lambda path: (1, 1),
            mount_refusal=lambda directory: None,
            path_refusal=_path_refusal(world),
            unlink_agreed=_unlink_agreed(world),
            verify_absent=verify,
            tmpfs_of=tmpfs_of,
        ),
        tmpfs=TmpfsReads(
            mount_problem=lambda directory: None,
            size=lambda directory: world.tmpfs_size,
            free=lambda directory: world.free_bytes(),
        ),
        run_group=sched.run,
        lock=lambda: SimLock(sched),
        edit_lock=_edit_lock(world, sched),
    )


def _edit_lock(world: World, sched: Interleaver) -> Any:
    """The lock of the manifest's edits (``store.lock.manifest_edit_lock``'s place): one per host, a ``SimLock``.
    Taking it is a seam (another switch may read the manifest meanwhile), and so is holding it (another switch that
    reaches it then waits, passing the turn back): two switches run in one group interleave at both."""
    locks: dict[str, SimLock] = {}

    @contextlib.contextmanager
    def edit_lock(host: str) -> Iterator[None]:
        lock = locks.setdefault(host, SimLock(sched))
        world.point()
        with lock:
            world.point()
            yield

    return edit_lock


def _leaves(value: Any, at: str) -> Iterator[tuple[str, Any]]:
    """Each callable a part of a ``HostIO`` holds, by its dotted name (``lanes.request``, ``shm.inspect``)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _leaves(getattr(value, f.name), f"{at}.{f.name}" if at else f.name)
    else:
        yield at, value


def real_parts_left(io: Any) -> list[str]:
    """The parts of ``io`` that are the host's own (``REAL_IO``'s, the real guard's, the real tmpfs reads): a part
    added to ``HostIO`` that ``sim_io`` does not give yet would reach the host, and stops the run."""
    from reconciler.apply.host_io import REAL_IO
    from reconciler.apply.shm_guard import REAL_SHM

    real = {id(v) for _, v in _leaves(REAL_IO, "")} | {id(v) for _, v in _leaves(REAL_SHM, "")}
    return [name for name, value in _leaves(io, "") if value is None or id(value) in real]


@contextlib.contextmanager
def installed(world: World) -> Iterator[str]:
    """Put the world under the project's code: ``world.io`` is the one ``HostIO`` the simulation hands to the loop,
    the applier, the guard, the service and the loader (nothing of the project is patched); yields a fresh state
    directory (the caller writes the root)."""
    mp = pytest.MonkeyPatch()
    state = tempfile.mkdtemp(prefix="reconciler-sim-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        mp.setenv("RECONCILER_STATE_DIR", os.path.join(state, "state"))
        mp.setenv("RECONCILER_LOCK_DIR", os.path.join(state, "run"))
        mp.setenv("RECONCILER_RUNTIME_DIR", os.path.join(state, "run"))
        os.makedirs(os.path.join(state, "state"), mode=0o700)
        os.makedirs(os.path.join(state, "run"), mode=0o700)
        io = sim_io(world)
        left = real_parts_left(io)
        if left:
            raise AssertionError(f"simulation: HostIO parts left real (they would reach the host): {', '.join(left)}")
        world.io = io

        def wake_memory_known(cid: str) -> bool:
            from reconciler.store.lane_memory import read_lane_memory

            mem = read_lane_memory(world.host_name).get(cid)
            return bool(mem and mem.awake) and world.telemetry == "nvml" and not world.nvml_down and not world.wsl2

        world.wake_memory_known = wake_memory_known
        yield state
    finally:
        mp.undo()
        import shutil

        shutil.rmtree(state, ignore_errors=True)


assert SHM_DIR == "/dev/shm"
