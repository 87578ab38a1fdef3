"""The pure half of /proc reading: maps and cgroup texts (captured from real processes) in, records out."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.observe.holder_scan import scan_holders
from reconciler.observe.proc_settle import settle_scan
from reconciler.observe.procfs import (
    FdTarget,
    HolderScan,
    MapRecord,
    dev_token,
    innermost_known,
    maps_on_dev,
    parse_cgroup_container_ids,
    parse_maps,
    parse_maps_line,
)
from reconciler.observe.shm import DirEntry, DirListing, build_view, describe_owners, owner_container
from reconciler.plan.observed import ContainerView, Owner, Reading, Tmpfs

TMPFS = os.makedev(0, 41)  # printed "00:29"

# Captured from /proc/PID/maps of a Python process mapping files on a tmpfs (device 0:41) with
# names holding a blank and a newline, one file unlinked after mapping, plus a few lines from other processes
# (a memfd, an anon_inode mapping, a device with a minor above 255, a path that contains the device text).
CAPTURED = b"""\
55ef6ed1c000-55ef6ed1d000 r--p 00000000 fe:00 26723                      /root/.pyenv/versions/3.11.7/bin/python3.11
55ef93536000-55ef936c5000 rw-p 00000000 00:00 0                          [heap]
7f70235e2000-7f70235e4000 rw-s 00000000 00:29 10                         /tmp/r1/shm/gone.mmap (deleted)
7f70235e4000-7f70235e6000 r--p 00000000 fe:00 29775                      /root/.pyenv/versions/3.11.7/lib/python3.11/lib-dynload/mmap.cpython-311-x86_64-linux-gnu.so
7f70236ad000-7f70236af000 rw-s 00000000 00:29 9                          /tmp/r1/shm/vllm_offload_nl\\012x.mmap
7f70236d4000-7f70236d6000 rw-s 00000000 00:29 8                          /tmp/r1/shm/vllm_offload_a b.mmap
7f7023c00000-7f7023cf5000 r--p 00000000 fe:00 26933                      /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f7024325000-7f7024327000 rw-s 00004000 00:29 7                          /tmp/r1/shm/vllm_offload_x.mmap
7f7024330000-7f7024334000 rw-s 00000000 00:01 2051                       /memfd:cuda-ipc (deleted)
7f7024334000-7f7024335000 rw-p 00000000 00:0e 12                         anon_inode:[perf_event]
7f7024335000-7f7024336000 r--p 00000000 00:1a3 77                        /mnt/many-minors/file
7f7024336000-7f7024337000 r--p 00000000 fe:00 88                         /data/odd 00:29 name.bin
7f7024336000-7f7024338000 r-xp 00000000 00:00 0                          [vdso]
7ffcc04d3000-7ffcc04f4000 rw-p 00000000 00:00 0                          [stack]
7ffcc04f4000-7ffcc04f5000 rw-p 000"""


def test_dev_token_is_the_kernels_hex_format() -> None:
    assert dev_token(TMPFS) == b" 00:29 "
    assert dev_token(os.makedev(254, 0)) == b" fe:00 "
    assert dev_token(os.makedev(0, 0x1A3)) == b" 00:1a3 "


def test_parse_line_fields() -> None:
    rec = parse_maps_line(
        b"7f7024325000-7f7024327000 rw-s 00004000 00:29 7                          /tmp/r1/shm/vllm_offload_x.mmap\n"
    )
    assert rec == MapRecord(
        start=0x7F7024325000,
        end=0x7F7024327000,
        perms="rw-s",
        offset=0x4000,
        dev_major=0,
        dev_minor=41,
        inode=7,
        path="/tmp/r1/shm/vllm_offload_x.mmap",
        deleted=False,
    )
    assert rec.dev == TMPFS
    assert rec.length == 0x2000


def test_parse_anonymous_and_special_lines() -> None:
    heap = parse_maps_line(b"55ef93536000-55ef936c5000 rw-p 00000000 00:00 0                          [heap]")
    assert heap is not None and heap.inode == 0 and heap.path == "[heap]" and heap.dev == 0
    bare = parse_maps_line(b"7f7023c00000-7f7023cf5000 rw-p 00000000 00:00 0 ")
    assert bare is not None and bare.path == "" and not bare.deleted


def test_deleted_suffix_and_escaped_newline() -> None:
    recs = {r.inode: r for r in parse_maps(CAPTURED) if r.dev == TMPFS}
    assert recs[10].deleted and recs[10].path == "/tmp/r1/shm/gone.mmap"
    assert recs[9].path == "/tmp/r1/shm/vllm_offload_nl\nx.mmap" and not recs[9].deleted
    assert recs[8].path == "/tmp/r1/shm/vllm_offload_a b.mmap"


def test_truncated_and_garbage_lines_are_not_records() -> None:
    assert parse_maps_line(b"7ffcc04f4000-7ffcc04f5000 rw-p 000") is None
    assert parse_maps_line(b"") is None
    assert parse_maps_line(b"not a maps line at all") is None
    # 15 lines, the last one cut short by a read that raced with the process.
    assert len(parse_maps(CAPTURED)) == 14


def test_device_filter_equals_full_parse() -> None:
    """The fast path (substring search first) finds exactly what parsing every line and filtering finds."""
    for dev in (TMPFS, os.makedev(254, 0), os.makedev(0, 0x1A3), os.makedev(0, 1), os.makedev(0, 0), os.makedev(7, 7)):
        slow = [r for r in parse_maps(CAPTURED) if r.dev == dev]
        assert parse_maps(CAPTURED, dev=dev) == slow, dev


def test_device_text_inside_a_path_is_not_a_match() -> None:
    # "/data/odd 00:29 name.bin" lies on fe:00; the token hit in its path must not make it a tmpfs mapping.
    inodes = [r.inode for r in parse_maps(CAPTURED, dev=TMPFS)]
    assert inodes == [10, 9, 8, 7]
    assert 88 not in inodes


def test_device_filter_on_text_without_the_device() -> None:
    text = b"55ef93536000-55ef936c5000 rw-p 00000000 00:00 0    [heap]\n"
    assert parse_maps(text, dev=TMPFS) == []
    assert parse_maps(b"", dev=TMPFS) == []


def test_minor_above_255_is_matched_exactly() -> None:
    [rec] = parse_maps(CAPTURED, dev=os.makedev(0, 0x1A3))
    assert rec.inode == 77
    # 0:0x1a is a different device whose token " 00:1a " is not a prefix match of " 00:1a3 ".
    assert parse_maps(CAPTURED, dev=os.makedev(0, 0x1A)) == []


def test_hot_path_agrees_with_the_full_parse() -> None:
    """maps_on_dev (what the scan runs) finds the same inodes, and the unlinked ones in full."""
    for dev in (TMPFS, os.makedev(254, 0), os.makedev(0, 0x1A3), os.makedev(0, 1), os.makedev(0, 0), os.makedev(7, 7)):
        full = parse_maps(CAPTURED, dev=dev)
        inodes, unlinked = maps_on_dev(CAPTURED, dev)
        assert inodes == {r.inode for r in full}, dev
        assert unlinked == [r for r in full if r.deleted], dev
    inodes, unlinked = maps_on_dev(CAPTURED, TMPFS)
    assert inodes == {7, 8, 9, 10} and [r.path for r in unlinked] == ["/tmp/r1/shm/gone.mmap"]


def test_hot_path_ignores_device_text_inside_paths() -> None:
    text = (
        b"7f7024336000-7f7024337000 r--p 00000000 fe:00 88     /data/odd 00:29 5 name.bin\n"
        b"7f7024336000-7f7024337000 r--p 00000000 fe:00 89     /data/x 00:29 6 (deleted)\n"
    )
    assert maps_on_dev(text, TMPFS) == (set(), [])


def test_holders_groups_by_inode_mappings_first() -> None:
    scan = HolderScan(dev=TMPFS)
    scan.mapped = {100: {7}, 200: {7}}
    scan.fds = {100: [FdTarget(5, 7, 8192, 8192, 1), FdTarget(6, 7, 8192, 8192, 1)], 300: [FdTarget(3, 9, 0, 0, 1)]}
    assert scan.holders() == {7: [(100, "map"), (200, "map"), (100, "fd")], 9: [(300, "fd")]}


@pytest.mark.parametrize(
    "line",
    [
        b"zzzz-7f7024327000 rw-s 00000000 00:29 7 /x",
        b"7f7024325000-7f7024327000 rw-s 0000000g 00:29 7 /x",
        b"7f7024325000-7f7024327000 rw-s 00000000 00-29 7 /x",
        b"7f7024325000-7f7024327000 rw-s 00000000 00:29 seven /x",
    ],
)
def test_malformed_fields_are_rejected(line: bytes) -> None:
    assert parse_maps_line(line) is None


# ---------------------------------------------------------------- /proc/PID/cgroup: which container a pid is in

CGROUP_DATA = Path(__file__).parent.parent / "data" / "cgroup"
CGROUP_FILES = sorted(p.stem for p in CGROUP_DATA.glob("*.txt"))


def cgroup_text(name: str) -> str:
    """A data file's cgroup text without its '#' comment lines (a real file never has them)."""
    lines = (CGROUP_DATA / f"{name}.txt").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


def cgroup_ids(name: str) -> tuple[str, ...]:
    return tuple((CGROUP_DATA / f"{name}.ids").read_text().split())


@pytest.mark.parametrize("name", CGROUP_FILES)
def test_cgroup_file_candidates_innermost_first(name: str) -> None:
    """Captured and documented cgroup files (tests/data/cgroup/README.md): every candidate, innermost first."""
    assert parse_cgroup_container_ids(cgroup_text(name)) == cgroup_ids(name)


def test_the_cgroup_data_covers_the_layouts() -> None:
    names = set(CGROUP_FILES)
    assert {"docker-v1-cgroupfs", "dind-v1-cgroupfs-inner", "dind-v2-systemd-inner", "kind-node-containerd"} <= names
    # Podman: cgroupfs (captured), systemd on v2 and v1, rootless, pods.
    assert {
        "podman-cgroupfs-v1",
        "podman-systemd-v2",
        "podman-systemd-v1",
        "podman-rootless-systemd-v2",
        "podman-pod-systemd-v2",
        "podman-pod-cgroupfs",
    } <= names
    assert all((CGROUP_DATA / f"{n}.ids").exists() for n in names)


# Real Docker in Docker (tests/data/cgroup/README.md): OUTER is a container of the host's engine running a
# dockerd; INNER a container of that inner engine.
OUTER = cgroup_ids("dind-v1-cgroupfs-outer")[0]
INNER = cgroup_ids("dind-v1-cgroupfs-inner-seen-from-outer")[0]
OTHER = "9" * 64  # some other container the engine lists


def test_nested_real_file_the_host_engine_owns_the_outer_container() -> None:
    # The reconciler on the host asks the host's engine, which knows the outer container only: a process of the
    # nested engine's container belongs to that outer container, the one this engine can stop.
    text = cgroup_text("dind-v1-cgroupfs-inner")
    assert innermost_known(parse_cgroup_container_ids(text), {OUTER, OTHER}) == OUTER


def test_nested_real_file_the_outer_id_known_only_to_an_outer_engine() -> None:
    # The reconciler runs inside the outer container and talks to the inner engine, which never heard of OUTER:
    # the innermost id it knows is the process's container, and OUTER is never presented as one.
    text = cgroup_text("dind-v1-cgroupfs-inner")
    candidates = parse_cgroup_container_ids(text)
    assert candidates == (INNER, OUTER)
    assert innermost_known(candidates, {INNER, OTHER}) == INNER
    # The inner dockerd itself runs in OUTER: a container of no engine this one knows.
    assert innermost_known(parse_cgroup_container_ids(cgroup_text("dind-v1-cgroupfs-outer")), {INNER}) is None
    # Seen from inside the outer container's own cgroup namespace, only the inner id is on the path.
    assert (
        innermost_known(parse_cgroup_container_ids(cgroup_text("dind-v1-cgroupfs-inner-seen-from-outer")), {INNER})
        == INNER
    )


def test_nothing_known_is_no_container() -> None:
    for name in CGROUP_FILES:
        assert innermost_known(parse_cgroup_container_ids(cgroup_text(name)), set()) is None, name
    assert innermost_known((), {OUTER}) is None


def test_kind_node_is_the_host_engines_container() -> None:
    _pod_ctr, node = cgroup_ids("kind-node-containerd")
    assert innermost_known(parse_cgroup_container_ids(cgroup_text("kind-node-containerd")), {node}) == node


def test_an_id_at_any_depth_of_any_v1_line_counts_once_at_its_deepest() -> None:
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    text = f"4:memory:/docker/{a}/docker/{b}/docker/{c}\n1:name=systemd:/docker/{a}/docker/{b}\n0::/docker/{a}\n"
    assert parse_cgroup_container_ids(text) == (c, b, a)
    assert parse_cgroup_container_ids(f"0::/docker/{a}\n1:cpu:/docker/{a}\n") == (a,)


def test_owner_shown_for_a_holder_never_names_an_unknown_id_as_a_container() -> None:
    candidates = parse_cgroup_container_ids(cgroup_text("dind-v1-cgroupfs-inner"))
    assert owner_container(candidates, {OUTER: "dind"}, engine_ok=True) == "dind"
    assert owner_container(candidates, {INNER: "inner"}, engine_ok=True) == "inner"
    assert (
        owner_container(candidates, {OTHER: "x"}, engine_ok=True) == f"a container unknown to this engine: {INNER[:12]}"
    )
    assert owner_container(candidates, {}, engine_ok=False) == (
        f"a container not confirmed (docker did not answer): {INNER[:12]}"
    )
    assert owner_container((), {OTHER: "x"}, engine_ok=True) is None
    owners = (Owner(7, "map", owner_container(candidates, {}, engine_ok=True), "x"), Owner(8, "fd", "dind", "y"))
    assert describe_owners(owners) == (
        f"mapped by pid 7 in a container unknown to this engine: {INNER[:12]}; held open by pid 8 in container dind"
    )


# ---------------------------------------------------------------- which running offload container keeps unowned files


@dataclass
class _Cfg:
    dir: str = "/dev/shm"
    pattern: str = "vllm_offload_*.mmap"
    ignore_uninspectable_pids: list[int] = field(default_factory=list)


def _view(containers: list[ContainerView], holders: dict[int, list[Owner]], settled: set[str]):  # type: ignore[no-untyped-def]
    entries = (
        DirEntry("vllm_offload_a.mmap", 0o100600, TMPFS, 7, 4096, 4096, 1),  # lane a's own, mapped by it
        DirEntry("vllm_offload_dead.mmap", 0o100600, TMPFS, 8, 4096, 4096, 1),  # a dead lane's: nothing holds it
    )
    listing = DirListing(TMPFS, entries, Tmpfs(1 << 30, 8192, (1 << 30) - 8192))
    return build_view(
        _Cfg(),
        listing=listing,
        holders=holders,
        deleted=(),
        unreadable={},
        containers=containers,
        docker=Reading("docker", True),
        settled=settled,
    )


LANE_A = ContainerView(id="a" * 64, name="reconciler-small-a", state="running", image="i", offload=True)
LANE_A_HOLDS = {7: [Owner(1001, "map", "reconciler-small-a", "vllm")]}


def test_a_settled_offload_lane_seen_holding_its_file_keeps_no_other_file() -> None:
    view = _view([LANE_A], LANE_A_HOLDS, {LANE_A.id})
    assert view.blocking_containers == ()
    assert {f.path.rsplit("/", 1)[1]: f.state for f in view.files} == {
        "vllm_offload_a.mmap": "owned",
        "vllm_offload_dead.mmap": "orphan",
    }


@pytest.mark.parametrize(
    ("settled", "holders", "why"),
    [
        (set(), LANE_A_HOLDS, "not recorded healthy: may still be making its file"),
        ({LANE_A.id}, {}, "seen holding nothing: its processes may not be visible, or its file not made yet"),
        (
            {LANE_A.id},
            {7: [Owner(1001, "map", "reconciler-other", "vllm")]},
            "the file it would hold is another container's",
        ),
    ],
)
def test_an_offload_lane_not_accounted_for_keeps_every_unowned_file(
    settled: set[str], holders: dict[int, list[Owner]], why: str
) -> None:
    view = _view([LANE_A], holders, settled)
    assert view.blocking_containers == ("reconciler-small-a",), why
    assert view.by_state("orphan") == (), why


def test_a_foreign_offload_container_keeps_every_unowned_file_beside_a_settled_lane() -> None:
    foreign = ContainerView(id="f" * 64, name="someone-vllm", state="running", image="i", offload=True)
    view = _view([LANE_A, foreign], LANE_A_HOLDS, {LANE_A.id})
    assert view.blocking_containers == ("someone-vllm",)
    assert [f.state for f in view.files if f.path.endswith("dead.mmap")] == ["blocked"]


# ---------------------------------------------------------------- the scan's listings (settle_scan, on plain values)


class _Proc:
    """A /proc of plain values: pid -> (start time, inodes mapped); ``on_read`` moves it before each read."""

    def __init__(self, procs: dict[int, tuple[int, set[int]]]):
        self.procs = procs
        self.reads: list[int] = []
        self.on_read: list[Callable[[], None]] = []

    def list_pids(self) -> list[str]:
        for hook in list(self.on_read):
            hook()
        return [str(p) for p in sorted(self.procs)]

    def start_time(self, pid: int) -> int | None:
        return self.procs[pid][0] if pid in self.procs else None

    def scan_names(self, names: list[str], scan: HolderScan) -> None:
        for name in names:
            for hook in list(self.on_read):
                hook()
            pid = int(name)
            if pid not in self.procs:
                scan.lost.append(pid)  # gone before it was read
                continue
            self.reads.append(pid)
            start, maps = self.procs[pid]
            scan.seen[pid] = start
            if maps:
                scan.mapped.setdefault(pid, set()).update(maps)

    def scan(self, max_rounds: int = 16) -> HolderScan:
        scan = HolderScan(dev=TMPFS)
        self.scan_names(self.list_pids(), scan)
        return settle_scan(
            scan,
            list_pids=self.list_pids,
            start_time=self.start_time,
            scan_names=self.scan_names,
            max_rounds=max_rounds,
        )


def test_a_child_born_after_the_listing_is_read_at_the_next_one() -> None:
    """The holder forks (the child has the mapping) and exits before it is read: one listing missed the file."""
    proc = _Proc({10: (1, set()), 20: (2, {7})})

    def hand_down() -> None:
        if 20 in proc.procs and proc.reads == [10]:
            proc.procs[30] = (3, {7})
            del proc.procs[20]

    proc.on_read.append(hand_down)
    scan = proc.scan()
    assert scan.rounds == 2 and not scan.unstable
    assert scan.holders() == {7: [(30, "map")]}


def test_a_reused_pid_number_is_read_again() -> None:
    """Pid 20 exits after it was read and its number goes to the holder's child (another start time)."""
    proc = _Proc({10: (1, {7}), 20: (2, set())})

    def reuse() -> None:
        if proc.reads == [10, 20] and proc.procs.get(10, (0,))[0] == 1:
            proc.procs[20] = (5, {7})  # the child of 10, under 20's number
            del proc.procs[10]

    proc.on_read.append(reuse)
    scan = proc.scan()
    assert proc.reads == [10, 20, 20] and scan.seen[20] == 5 and scan.rounds == 2


def test_a_listed_pid_that_cannot_be_read_does_not_keep_the_scan_going(tmp_path: Path) -> None:
    """A zombie (its stat there, its maps and fds not) is listed at every listing: read once, not a new process."""
    for pid, files in ((10, ("stat", "maps")), (11, ("stat",))):
        (tmp_path / str(pid)).mkdir()
        for name in files:
            (tmp_path / str(pid) / name).write_text(f"{pid} (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {pid} 0 0\n")
    (tmp_path / "10" / "fd").mkdir()
    scan = scan_holders(TMPFS, proc_root=str(tmp_path), workers=1)
    assert scan.rounds == 1 and scan.unstable == "" and set(scan.seen) == {10, 11}


def test_processes_that_keep_appearing_and_are_read_do_not_keep_the_scan_going() -> None:
    """A build forks at every read and every listing (issue 40: one fork every 2 ms): each listing shows new
    processes, all read alive. They descend from processes the scan read, so the scan settles (it used to give up
    after 16 listings, and every pass refused as "source unavailable: proc")."""
    proc = _Proc({10: (1, set())})
    born = [100]

    def fork() -> None:
        born[0] += 1
        proc.procs[born[0]] = (born[0], set())

    proc.on_read.append(fork)
    scan = proc.scan(max_rounds=4)
    assert scan.unstable == "" and scan.rounds == 2 and not scan.lost


def test_a_chain_that_hands_down_before_every_read_leaves_the_scan_incomplete() -> None:
    """The holder forks its child and exits before each read of it: every listing loses the holder unread, so
    after ``max_rounds`` listings the scan is incomplete (fail closed) rather than settled without the file."""
    proc = _Proc({10: (1, set()), 20: (2, {7})})
    head = [20]

    def hand_down() -> None:
        if head[0] in proc.procs:
            child = head[0] + 1
            proc.procs[child] = (child, {7})
            del proc.procs[head[0]]
            head[0] = child

    proc.on_read.append(hand_down)
    scan = proc.scan(max_rounds=4)
    assert scan.rounds == 4 and "kept vanishing before they were read" in scan.unstable
    assert 7 not in scan.holders()


def test_a_process_gone_unread_at_a_later_listing_means_one_more_listing() -> None:
    """A process born after a listing, listed by the next one and gone before it is read: its child, born
    meanwhile, is read at the listing after."""
    proc = _Proc({10: (1, set())})
    steps = [0]

    def moves() -> None:
        steps[0] += 1
        if steps[0] == 2:  # after the first read: a holder is born
            proc.procs[20] = (2, {7})
        elif steps[0] == 4 and 20 in proc.procs:  # after the second listing, before 20 is read: it hands down
            proc.procs[30] = (3, {7})
            del proc.procs[20]

    proc.on_read.append(moves)
    scan = proc.scan()
    assert scan.unstable == "" and 20 in scan.lost
    assert scan.holders() == {7: [(30, "map")]}
