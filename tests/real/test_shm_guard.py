"""The shared-memory guard against the real thing: a tmpfs mounted per test, real processes mapping and holding
files, real /proc, and (``docker`` tests) a real engine running containers that map files.

Every case of issue 3 is here, and each asserts what a loosened guard would get wrong: a file that must stay
is checked to exist afterwards with its inode unchanged, a file that must go is checked to be gone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_helpers import MIB, make_file, shm_config

from reconciler.apply.shm_guard import reclaim
from reconciler.apply.shm_results import ReclaimResult
from reconciler.model import ShmConfig
from reconciler.observe.containers import EngineObserver
from reconciler.observe.shm import inspect_shm
from reconciler.plan.observed import ContainerView, Reading, ShmView

PATTERN = "vllm_offload_*.mmap"
REPO = Path(__file__).resolve().parents[2]
# The fake vLLM image is a bare skeleton too: with the host's /usr mounted, /usr/bin/python3 runs inside.
IMAGE = "reconciler/fake-vllm:latest"
DOCKER_URL = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock")

pytestmark = pytest.mark.root

Observation = tuple[tuple[ContainerView, ...], Reading]


def engine_without_containers() -> Observation:
    """An engine that answers and runs nothing: the in-memory stand-in for the non-Docker cases."""
    return (), Reading("docker", True)


# ---------------------------------------------------------------- fixtures and helpers


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A fresh 64 MiB tmpfs: the test's shm.dir."""
    if os.geteuid() != 0:
        pytest.fail("the shm guard tests mount tmpfs and need root")
    d = tmp_path / "shm"
    _mount_tmpfs(d, "64m")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def config(d: Path, **kw: object) -> ShmConfig:
    return shm_config(d, **kw)  # type: ignore[no-any-return]


HOLDER = textwrap.dedent(
    """
    import mmap, os, sys
    mode, path = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    keep = []
    if mode in ("map", "map-unlink"):
        size = os.fstat(fd).st_size
        if size == 0:
            os.ftruncate(fd, 4096)
            size = 4096
        keep.append(mmap.mmap(fd, size))
        ino = os.fstat(fd).st_ino
        # Python's mmap keeps a dup of the descriptor; close every descriptor of the file so that only the
        # mapping holds it, as in a vLLM worker that closed its fd after mmap.
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.stat(f"/proc/self/fd/{name}").st_ino == ino:
                    os.close(int(name))
            except OSError:
                pass
        if mode == "map-unlink":
            os.unlink(path)
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    sys.stdin.read()
    """
)


class Holders:
    """Real processes holding files: ``map`` (mapped, descriptor closed), ``fd`` (open only), ``map-unlink``."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, mode: str, path: Path | str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, mode, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        assert p.stdout.readline() == "ready\n", f"holder {mode} {path!r} did not start"
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen[str]) -> None:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=10)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def holders() -> Iterator[Holders]:
    h = Holders()
    try:
        yield h
    finally:
        h.close()


def run_reclaim(
    d: Path,
    *,
    confirm: bool = True,
    sleep: Callable[[float], None] | None = None,
    observe_docker: Callable[[], Observation] = engine_without_containers,
    **kw: object,
) -> ReclaimResult:
    slept: list[float] = []

    def default_sleep(s: float) -> None:
        slept.append(s)
        time.sleep(s)

    return reclaim(
        config(d, **kw),
        observe_docker=observe_docker,
        confirm=confirm,
        sleep=sleep or default_sleep,
    )


def view_of(d: Path, *, observe_docker: Callable[[], Observation] = engine_without_containers, **kw: object) -> ShmView:
    containers, source = observe_docker()
    return inspect_shm(config(d, **kw), containers=containers, docker=source)


def file_in(view: ShmView, path: Path | str):  # type: ignore[no-untyped-def]
    [f] = [f for f in view.files if f.path == str(path)]
    return f


def kept_reason(result: ReclaimResult, path: Path | str) -> str:
    [k] = [k for k in result.kept if k.path == str(path)]
    return k.reason


# ---------------------------------------------------------------- orphans go, verified, bytes reported


@pytest.mark.safety_rule(5)
def test_orphans_are_removed_verified_and_bytes_reported(shm: Path) -> None:
    a = make_file(shm / "vllm_offload_a.mmap", 3 * MIB)
    b = make_file(shm / "vllm_offload_b.mmap", 5 * MIB)
    before = os.statvfs(shm)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)

    result = run_reclaim(shm, sleep=sleep)

    assert result.ok and result.verified and result.refused is None
    assert slept == [0.2], "exactly one wait of confirm_interval_s between the two inspections"
    assert result.inspections == 2
    assert sorted(f.path for f in result.reclaimed) == [
        str(shm / "vllm_offload_a.mmap"),
        str(shm / "vllm_offload_b.mmap"),
    ]
    assert result.reclaimed_bytes == (a.st_blocks + b.st_blocks) * 512 == 8 * MIB
    assert not (shm / "vllm_offload_a.mmap").exists() and not (shm / "vllm_offload_b.mmap").exists()
    after = os.statvfs(shm)
    assert (after.f_bavail - before.f_bavail) * after.f_frsize == 8 * MIB
    data = result.to_json()
    assert set(data) >= {"confirmed", "reclaimed", "kept", "reclaimed_bytes", "verified"}
    assert data["confirmed"] is True and data["verified"] is True and data["reclaimed_bytes"] == 8 * MIB
    assert set(data["reclaimed"][0]) >= {"path", "size_bytes", "allocated_bytes"}


def test_dry_run_names_candidates_and_removes_nothing(shm: Path) -> None:
    st = make_file(shm / "vllm_offload_a.mmap", 2 * MIB)

    def no_sleep(s: float) -> None:
        raise AssertionError("a dry run inspects once and never waits")

    result = run_reclaim(shm, confirm=False, sleep=no_sleep)

    assert result.ok and not result.confirmed and result.reclaimed == ()
    assert [f.path for f in result.candidates] == [str(shm / "vllm_offload_a.mmap")]
    assert os.stat(shm / "vllm_offload_a.mmap").st_ino == st.st_ino
    data = result.to_json()
    assert data["reclaimed"] == [] and data["reclaimed_bytes"] == 0 and data["verified"] is False
    assert data["would_reclaim_bytes"] == 2 * MIB


# ---------------------------------------------------------------- owners: mapping, descriptor, unlinked, other path


def test_mapped_file_is_owned_and_kept_while_its_orphan_neighbour_goes(shm: Path, holders: Holders) -> None:
    mapped = shm / "vllm_offload_mapped.mmap"
    make_file(mapped, 2 * MIB)
    make_file(shm / "vllm_offload_orphan.mmap", MIB)
    p = holders.start("map", mapped)

    view = view_of(shm)
    f = file_in(view, mapped)
    assert f.state == "owned"
    assert [(o.pid, o.via) for o in f.owners] == [(p.pid, "map")], (
        "descriptor closed after mmap: owned by the map alone"
    )
    assert file_in(view, shm / "vllm_offload_orphan.mmap").state == "orphan"

    result = run_reclaim(shm)
    assert result.ok
    assert [r.path for r in result.reclaimed] == [str(shm / "vllm_offload_orphan.mmap")]
    assert mapped.exists()
    assert f"mapped by pid {p.pid}" in kept_reason(result, mapped)


def test_file_held_only_by_an_open_descriptor_is_owned(shm: Path, holders: Holders) -> None:
    path = shm / "vllm_offload_fd.mmap"
    st = make_file(path, MIB)
    p = holders.start("fd", path)

    f = file_in(view_of(shm), path)
    assert f.state == "owned" and [(o.pid, o.via) for o in f.owners] == [(p.pid, "fd")]
    result = run_reclaim(shm)
    assert result.reclaimed == () and os.stat(path).st_ino == st.st_ino

    holders.stop(p)  # the holder exits: now it is an orphan and goes
    result = run_reclaim(shm)
    assert [r.path for r in result.reclaimed] == [str(path)] and not path.exists()


def test_unlinked_but_mapped_file_counts_as_owned_bytes_without_a_path(shm: Path, holders: Holders) -> None:
    path = shm / "vllm_offload_gone.mmap"
    make_file(path, 4 * MIB)
    p = holders.start("map-unlink", path)
    assert not path.exists()

    view = view_of(shm)
    assert view.files == ()
    [d] = view.deleted_mapped
    assert d.state == "owned" and d.size_bytes == 4 * MIB and d.allocated_bytes == 4 * MIB
    assert [(o.pid, o.via) for o in d.owners] == [(p.pid, "map")]
    assert view.deleted_mapped_bytes == 4 * MIB
    # The tmpfs numbers add up: what is used is (at least) what the unlinked mapping still holds.
    assert view.tmpfs.used_bytes >= view.deleted_mapped_bytes
    assert view.tmpfs.size_bytes == view.tmpfs.used_bytes + view.tmpfs.free_bytes

    holders.stop(p)
    view = view_of(shm)
    assert view.deleted_mapped == () and view.tmpfs.used_bytes < 4 * MIB


def test_ownership_is_by_device_and_inode_not_path_text(shm: Path, tmp_path: Path, holders: Holders) -> None:
    """A process maps the file through another mount of the same tmpfs: maps shows another path, same inode."""
    path = shm / "vllm_offload_elsewhere.mmap"
    make_file(path, MIB)
    other = tmp_path / "other-view"
    other.mkdir()
    subprocess.run(["mount", "--bind", str(shm), str(other)], check=True)
    try:
        p = holders.start("map", other / "vllm_offload_elsewhere.mmap")
        maps = Path(f"/proc/{p.pid}/maps").read_text()
        assert str(other / "vllm_offload_elsewhere.mmap") in maps and str(path) not in maps
        f = file_in(view_of(shm), path)
        assert f.state == "owned" and f.owners[0].pid == p.pid
        result = run_reclaim(shm)
        assert result.reclaimed == () and path.exists()
    finally:
        holders.close()
        subprocess.run(["umount", "-l", str(other)], check=False)


def test_replaced_file_under_a_mapped_name_is_an_orphan(shm: Path, holders: Holders) -> None:
    """The path text of a mapping says nothing about the file now at that path: the new inode is unowned."""
    path = shm / "vllm_offload_r.mmap"
    make_file(path, MIB)
    holders.start("map", path)
    os.unlink(path)
    new = make_file(path, 2 * MIB)

    view = view_of(shm)
    assert file_in(view, path).state == "orphan" and file_in(view, path).inode == new.st_ino
    assert [d.inode for d in view.deleted_mapped] != [new.st_ino] and view.deleted_mapped_bytes == MIB
    result = run_reclaim(shm)
    assert [r.inode for r in result.reclaimed] == [new.st_ino] and not path.exists()


# ---------------------------------------------------------------- changes between the two inspections


def test_inode_swapped_between_inspections_is_kept(shm: Path) -> None:
    path = shm / "vllm_offload_swap.mmap"
    old = make_file(path, MIB)
    swapped: list[int] = []

    def swap(s: float) -> None:
        tmp = shm / "incoming.tmp"
        make_file(tmp, MIB)  # same name, same size, a different file
        os.rename(tmp, path)
        swapped.append(os.stat(path).st_ino)

    result = run_reclaim(shm, sleep=swap)
    assert swapped and swapped[0] != old.st_ino
    assert result.reclaimed == ()
    assert "replaced between the inspections" in kept_reason(result, path)
    assert os.stat(path).st_ino == swapped[0]


def test_file_growing_between_inspections_is_kept(shm: Path) -> None:
    path = shm / "vllm_offload_grow.mmap"
    st = make_file(path, MIB)

    def grow(s: float) -> None:
        with open(path, "ab") as fh:
            fh.write(b"\0" * MIB)

    result = run_reclaim(shm, sleep=grow)
    assert result.reclaimed == () and "size changed" in kept_reason(result, path)
    assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_size == 2 * MIB


def test_file_mapped_between_inspections_is_kept(shm: Path, holders: Holders) -> None:
    path = shm / "vllm_offload_late.mmap"
    make_file(path, MIB)
    started: list[int] = []

    def start_holder(s: float) -> None:
        started.append(holders.start("map", path).pid)

    result = run_reclaim(shm, sleep=start_holder)
    assert result.reclaimed == () and path.exists()
    assert f"owned at the second inspection: mapped by pid {started[0]}" in kept_reason(result, path)


def test_zero_length_file_being_created_is_kept(shm: Path, holders: Holders) -> None:
    """A creator holding a fresh empty file owns it; an empty file that appears between the inspections stays."""
    creating = shm / "vllm_offload_creating.mmap"
    p = holders.start("fd", creating)  # O_CREAT, nothing written yet
    assert os.stat(creating).st_size == 0
    appearing = shm / "vllm_offload_appearing.mmap"
    old = shm / "vllm_offload_old.mmap"
    old.touch()  # an empty orphan present in both inspections: that one goes
    created: list[bool] = []

    def create(s: float) -> None:
        appearing.touch()
        created.append(True)

    result = run_reclaim(shm, sleep=create)
    assert created, "the orphan made the guard take its second look"
    f = file_in(view_of(shm), creating)
    assert f.state == "owned" and f.owners[0].pid == p.pid and f.size_bytes == 0
    assert [r.path for r in result.reclaimed] == [str(old)]
    assert creating.exists() and appearing.exists() and not old.exists()
    assert "appeared" in kept_reason(result, appearing)


def test_unlink_rechecks_the_inode_just_before_removing(shm: Path) -> None:
    """Between the second inspection and the unlink the name may change hands: the last lstat catches it."""
    from reconciler.apply.shm_guard import _dir_identity
    from reconciler.apply.shm_unlink import _unlink_agreed
    from reconciler.plan.observed import ShmFile

    path = shm / "vllm_offload_late_swap.mmap"
    old = make_file(path, MIB)
    inspected = ShmFile(str(path), old.st_dev, old.st_ino, old.st_size, old.st_blocks * 512)
    dir_id = _dir_identity(str(shm))
    os.unlink(path)
    new = make_file(path, MIB)  # same name and size, another inode (tmpfs may even reuse numbers: check)
    assert new.st_ino != old.st_ino
    removed, kept, errors = _unlink_agreed(str(shm), dir_id, [inspected])
    assert removed == [] and errors == [] and "changed just before removal" in kept[0].reason
    assert os.stat(path).st_ino == new.st_ino

    still = ShmFile(str(path), new.st_dev, new.st_ino, new.st_size, new.st_blocks * 512)
    removed, kept, errors = _unlink_agreed(str(shm), dir_id, [still])
    assert [r.inode for r in removed] == [new.st_ino] and not path.exists()


def test_verification_reports_a_name_that_is_still_there(shm: Path) -> None:
    from reconciler.apply.shm_results import RemovedFile
    from reconciler.apply.shm_unlink import _verify_absent

    path = shm / "vllm_offload_v.mmap"
    st = make_file(path, MIB)
    ok, errors = _verify_absent(str(shm), [RemovedFile(str(path), MIB, MIB, st.st_dev, st.st_ino)])
    assert not ok and errors == [f"{path}: still present after unlink"]
    ok, errors = _verify_absent(str(shm), [RemovedFile(str(path), MIB, MIB, st.st_dev, st.st_ino + 1000)])
    assert not ok and "a new file of that name appeared" in errors[0]
    os.unlink(path)
    assert _verify_absent(str(shm), [RemovedFile(str(path), MIB, MIB, st.st_dev, st.st_ino)]) == (True, [])


@pytest.mark.safety_rule(5)
def test_reclaim_is_not_verified_when_a_name_survives_its_unlink(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem that acknowledges the unlink but keeps the name (simulated): the reclaim must say so."""
    path = shm / "vllm_offload_stubborn.mmap"
    make_file(path, MIB)
    monkeypatch.setattr(os, "unlink", lambda name, *, dir_fd=None: None)
    result = run_reclaim(shm, sleep=lambda s: None)
    assert not result.ok and not result.verified
    assert result.errors == (f"{path}: still present after unlink",)


def test_source_failing_at_the_second_inspection_removes_nothing(shm: Path) -> None:
    path = shm / "vllm_offload_a.mmap"
    make_file(path, MIB)
    answers = iter([engine_without_containers(), ((), Reading("docker", False, "unix:///x: connection refused"))])

    result = run_reclaim(shm, observe_docker=lambda: next(answers))
    assert not result.ok and result.reclaimed == () and path.exists()
    assert result.refused == "docker unavailable: unix:///x: connection refused"
    assert result.inspections == 2


def test_only_paths_limits_the_removal(shm: Path) -> None:
    mine, other = shm / "vllm_offload_mine.mmap", shm / "vllm_offload_other.mmap"
    make_file(mine, MIB)
    make_file(other, MIB)
    result = reclaim(
        config(shm),
        observe_docker=engine_without_containers,
        confirm=True,
        only_paths=[str(mine)],
        sleep=lambda s: None,
    )
    assert [r.path for r in result.reclaimed] == [str(mine)]
    assert other.exists() and "not among the paths" in kept_reason(result, other)


# ---------------------------------------------------------------- what the pattern matches, and what is refused


def test_symlink_matching_the_pattern_is_never_followed(shm: Path, tmp_path: Path) -> None:
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"keep me")
    link = shm / "vllm_offload_link.mmap"
    link.symlink_to(precious)
    inner = make_file(shm / "inner.bin", MIB)
    inner_link = shm / "vllm_offload_inner.mmap"
    inner_link.symlink_to(shm / "inner.bin")

    view = view_of(shm)
    assert view.files == ()
    skipped = dict(view.skipped)
    assert "symlink" in skipped[str(link)] and "symlink" in skipped[str(inner_link)]
    result = run_reclaim(shm)
    assert result.reclaimed == ()
    assert link.is_symlink() and inner_link.is_symlink() and precious.read_bytes() == b"keep me"
    assert os.stat(shm / "inner.bin").st_ino == inner.st_ino


def test_directory_matching_the_pattern_is_skipped(shm: Path) -> None:
    d = shm / "vllm_offload_dir.mmap"
    d.mkdir()
    make_file(d / "vllm_offload_nested.mmap", MIB)

    view = view_of(shm)
    assert view.files == () and "directory" in dict(view.skipped)[str(d)]
    result = run_reclaim(shm)
    assert result.reclaimed == () and (d / "vllm_offload_nested.mmap").exists()


def test_names_that_only_nearly_match_are_not_touched(shm: Path) -> None:
    near = [
        "vllm_offload_1.mmap.bak",
        "xvllm_offload_1.mmap",
        "vllm_offload_1.mma",
        "VLLM_OFFLOAD_1.mmap",
        "vllm_offload_1.mmap ",
        "vllm-offload_1.mmap",
        ".vllm_offload_1.mmap~",
    ]
    for name in near:
        make_file(shm / name, 64 * 1024)
    exact = shm / "vllm_offload_1.mmap"
    make_file(exact, 64 * 1024)

    view = view_of(shm)
    assert [f.path for f in view.files] == [str(exact)] and view.skipped == ()
    result = run_reclaim(shm)
    assert [r.path for r in result.reclaimed] == [str(exact)]
    assert sorted(os.listdir(shm)) == sorted(near)


def test_names_with_spaces_and_newlines(shm: Path, holders: Holders) -> None:
    spaced = shm / "vllm_offload_a b.mmap"
    newline = shm / "vllm_offload_x\ny.mmap"
    mapped = shm / "vllm_offload_m\nn.mmap"
    for p in (spaced, newline, mapped):
        make_file(p, MIB)
    holder = holders.start("map", mapped)

    view = view_of(shm)
    assert file_in(view, mapped).state == "owned" and file_in(view, mapped).owners[0].pid == holder.pid
    assert file_in(view, spaced).state == "orphan" and file_in(view, newline).state == "orphan"
    result = run_reclaim(shm)
    assert sorted(r.path for r in result.reclaimed) == sorted([str(spaced), str(newline)])
    assert os.listdir(shm) == ["vllm_offload_m\nn.mmap"]


def test_hard_linked_file_is_skipped(shm: Path) -> None:
    path = shm / "vllm_offload_h.mmap"
    make_file(path, MIB)
    os.link(path, shm / "elsewhere.bin")

    view = view_of(shm)
    assert "2 hard links" in dict(view.skipped)[str(path)]
    assert run_reclaim(shm).reclaimed == () and path.exists()


def test_mount_on_top_of_an_entry_is_skipped(shm: Path, tmp_path: Path) -> None:
    target = tmp_path / "outside.bin"
    target.write_bytes(b"x" * 100)
    entry = shm / "vllm_offload_mnt.mmap"
    entry.touch()
    subprocess.run(["mount", "--bind", str(target), str(entry)], check=True)
    try:
        view = view_of(shm)
        assert "another filesystem" in dict(view.skipped)[str(entry)]
        assert run_reclaim(shm).reclaimed == () and target.read_bytes() == b"x" * 100
    finally:
        subprocess.run(["umount", "-l", str(entry)], check=False)


# ---------------------------------------------------------------- /proc that cannot be read completely


# Run inside a fresh pid namespace (its own /proc) by the test below, with CAP_SYS_PTRACE dropped (and
# CAP_SYS_ADMIN and CAP_PERFMON, which also let a recent kernel read another process's maps): it starts a child
# that makes itself non-dumpable, so the kernel refuses its /proc/PID/maps and fd links to every process there,
# root included; then, for each shm root named on stdin, runs the real ``reconciler shm status --json`` and
# answers one JSON line. Nothing outside the namespace is scanned, so no other process of the machine matters.
UNINSPECTABLE_DRIVER = textwrap.dedent(
    """
    import json, subprocess, sys
    child = subprocess.Popen(
        [sys.executable, "-c", "import ctypes, sys, time\\n"
         "assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0\\n"
         "print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline() == "ready\\n"
    print(json.dumps({"child": child.pid}), flush=True)
    for line in sys.stdin:
        cmd = [sys.executable, "-m", "reconciler", "--root", line.strip()] + sys.argv[1:]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        print(json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr}), flush=True)
    child.kill()
    """
)
DROP = "-sys_ptrace,-sys_admin,-perfmon"


def test_an_uninspectable_process_fails_the_scan_closed_until_excused(shm: Path, tmp_path: Path) -> None:
    """Made, not assumed: a non-dumpable process that the scanner (the real CLI, without CAP_SYS_PTRACE) may not
    inspect fails ``shm status`` closed naming its pid; excusing every pid the strict scan named lets it pass."""
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} (util-linux) is needed to make an uninspectable process")
    path = shm / "vllm_offload_a.mmap"
    st = make_file(path, MIB)
    strict_root, excused_root = tmp_path / "strict", tmp_path / "excused"
    _write_root(strict_root, shm, DOCKER_URL, ignore="[]")
    driver = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc",
         "setpriv", f"--inh-caps={DROP}", f"--bounding-set={DROP}", "--",
         sys.executable, "-c", UNINSPECTABLE_DRIVER, "shm", "status", "--json"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert driver.stdin is not None and driver.stdout is not None

    def status(root: Path) -> tuple[int, dict[str, object]]:
        driver.stdin.write(f"{root}\n")  # type: ignore[union-attr]
        driver.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(driver.stdout.readline())  # type: ignore[union-attr]
        return answer["rc"], json.loads(answer["out"])

    try:
        first = driver.stdout.readline()
        if not first:
            pytest.skip(f"no pid namespace with dropped capabilities here: {driver.stderr.read()}")  # type: ignore[union-attr]
        child = json.loads(first)["child"]

        rc, strict = status(strict_root)
        named = [u["pid"] for u in strict["uninspectable"]]  # type: ignore[union-attr,index]
        assert rc == 1 and child in named, strict
        assert strict["sources"]["proc"].startswith("unavailable: pid ")  # type: ignore[index]
        assert f"pid {child} " in strict["sources"]["proc"] or len(named) > 1  # type: ignore[index]
        assert [f["state"] for f in strict["files"]] == ["blocked"]  # type: ignore[union-attr,index]

        # Pid 1 of the namespace is readable: excusing it too must change nothing.
        _write_root(excused_root, shm, DOCKER_URL, ignore=json.dumps(sorted({1, *named})))
        rc, excused = status(excused_root)
        assert rc == 0, excused
        assert excused["sources"]["proc"] == "ok"  # type: ignore[index]
        assert {(u["pid"], u["excused"]) for u in excused["uninspectable"]} >= {(child, True)}  # type: ignore[union-attr,index]
        assert [f["state"] for f in excused["files"]] == ["orphan"]  # type: ignore[union-attr,index]
    finally:
        driver.stdin.close()
        driver.wait(timeout=60)
    assert os.stat(path).st_ino == st.st_ino


def _fake_proc(root: Path, real_file: Path, dev: int, inode: int) -> None:
    """A /proc look-alike: 4242 unreadable (maps is a directory), 4343 gone, 4444 maps + holds ``real_file``."""
    (root / "4242" / "maps").mkdir(parents=True)
    (root / "4242" / "fd").mkdir()
    (root / "4343").mkdir()  # listed, but its files are gone: exited mid-scan
    (root / "4444" / "fd").mkdir(parents=True)
    line = f"7f0000000000-7f0000100000 rw-s 00000000 {os.major(dev):02x}:{os.minor(dev):02x} {inode}    {real_file}\n"
    (root / "4444" / "maps").write_text("55ef93536000-55ef936c5000 rw-p 00000000 00:00 0    [heap]\n" + line)
    (root / "4444" / "fd" / "7").symlink_to(real_file)  # stat follows it to the very file, like /proc's links
    for pid in (4242, 4444):  # a live process's stat: its start time (field 22) read before its maps
        (root / str(pid) / "stat").write_text(
            f"{pid} (python3) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0\n"
        )
    (root / "self").mkdir()


@pytest.mark.safety_rule(3)
def test_vanished_pid_is_gone_but_unreadable_pid_fails_closed(shm: Path, tmp_path: Path) -> None:
    path = shm / "vllm_offload_a.mmap"
    st = make_file(path, MIB)
    proc = tmp_path / "proc"
    _fake_proc(proc, path, st.st_dev, st.st_ino)

    view = inspect_shm(config(shm), containers=(), docker=Reading("docker", True), proc_root=str(proc))
    assert [u.pid for u in view.uninspectable] == [4242], "4343 exited: gone, not uninspectable"
    assert not view.proc.ok and "pid 4242" in view.proc.detail
    f = file_in(view, path)
    assert [(o.pid, o.via) for o in f.owners] == [(4444, "map"), (4444, "fd")]

    excused = inspect_shm(
        config(shm, ignore_uninspectable_pids=[4242]),
        containers=(),
        docker=Reading("docker", True),
        proc_root=str(proc),
    )
    assert excused.proc.ok and excused.uninspectable[0].excused


def test_parallel_scan_gives_the_same_answer(shm: Path, holders: Holders) -> None:
    from reconciler.observe.holder_scan import scan_holders

    for i in range(4):
        make_file(shm / f"vllm_offload_{i}.mmap", 64 * 1024)
    holders.start("map", shm / "vllm_offload_0.mmap")
    holders.start("fd", shm / "vllm_offload_1.mmap")
    dev = os.stat(shm).st_dev
    before = _pids()
    one = scan_holders(dev, workers=1)
    three = scan_holders(dev, workers=3)
    stable = before & _pids()  # the machine's other processes come and go meanwhile: judged on those that stayed
    assert (three.workers, three.worker_failures) == (3, 0), "both child interpreters answered"
    assert one.holders() == three.holders() and len(one.holders()) == 2
    assert {p for p in one.unreadable if p in stable} == {p for p in three.unreadable if p in stable}


def _pids() -> set[int]:
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


def test_failed_scan_workers_change_nothing(shm: Path, holders: Holders, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that cannot start or dies has its share scanned in-process: same answer, failure counted."""
    from reconciler.observe.holder_scan import scan_holders

    make_file(shm / "vllm_offload_0.mmap", 64 * 1024)
    p = holders.start("map", shm / "vllm_offload_0.mmap")
    dev = os.stat(shm).st_dev
    alone = scan_holders(dev, workers=1)  # in-process only: what the answer must be (whatever this host can read)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # starts, answers nothing, exits 1
    scan = scan_holders(dev, workers=3)
    assert (scan.workers, scan.worker_failures) == (3, 2)
    assert [(p.pid, "map")] == [h for hs in scan.holders().values() for h in hs if h[0] == p.pid]
    assert scan.unreadable.keys() == alone.unreadable.keys()


# ---------------------------------------------------------------- the field report's failure, reproduced


MAPPER = textwrap.dedent(
    """
    import mmap, os, sys
    path, size = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size)
    try:
        m.madvise(23)  # MADV_POPULATE_WRITE: prefault every page, as vLLM's offload does
    except OSError as exc:
        print(exc.errno, exc.strerror)
        sys.exit(3)
    print("ok")
    """
)


def test_orphans_make_madvise_fail_with_errno_14_until_reclaimed(tmp_path: Path) -> None:
    d = tmp_path / "shm128"
    _mount_tmpfs(d, "128m")
    try:
        for i in range(3):
            make_file(d / f"vllm_offload_crashed{i}.mmap", 40 * MIB)  # three whole orphans from crashed workers
        new = d / "vllm_offload_new.mmap"

        first = subprocess.run(
            [sys.executable, "-c", MAPPER, str(new), str(100 * MIB)], check=False, capture_output=True, text=True
        )
        assert first.returncode == 3, first
        assert first.stdout.split()[0] == "14" and "Bad address" in first.stdout
        # As in the report: the failed start left a partial file behind, a fourth orphan.
        assert 0 < os.stat(new).st_blocks * 512 < 100 * MIB

        result = run_reclaim(d)
        assert result.ok and len(result.reclaimed) == 4 and os.listdir(d) == []
        assert result.reclaimed_bytes >= 120 * MIB

        second = subprocess.run(
            [sys.executable, "-c", MAPPER, str(new), str(100 * MIB)], check=False, capture_output=True, text=True
        )
        assert second.returncode == 0 and second.stdout.strip() == "ok", second
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


# ---------------------------------------------------------------- Docker: dead socket, containers


def dead_socket(tmp_path: Path) -> str:
    """A unix socket path that exists with nothing accepting on it: connect() is refused."""
    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return f"unix://{path}"


def test_dead_docker_socket_fails_closed(shm: Path, tmp_path: Path) -> None:
    path = shm / "vllm_offload_a.mmap"
    st = make_file(path, MIB)
    observer = EngineObserver(dead_socket(tmp_path), timeout=5)

    view = view_of(shm, observe_docker=observer.observe)
    assert not view.docker.ok and file_in(view, path).state == "blocked"
    assert "docker unavailable" in file_in(view, path).reason
    result = run_reclaim(shm, observe_docker=observer.observe)
    assert not result.ok and result.refused and result.refused.startswith("docker unavailable: unix://")
    assert result.inspections == 1 and os.stat(path).st_ino == st.st_ino


def _write_root(root: Path, shm: Path, docker_url: str, *, ignore: str = "[1]") -> None:
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "host.yaml").write_text(
        textwrap.dedent(
            f"""\
            name: shm-test
            gpus:
              a: {{index: 0}}
            gpu_telemetry: none
            docker:
              url: {docker_url}
            shm:
              dir: {shm}
              confirm_interval_s: 0.2
              ignore_uninspectable_pids: {ignore}   # pid 1: excused where unreadable, e.g. a microVM init
            """
        )
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args], check=False, capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_cli_exit_codes_with_a_dead_docker_socket(shm: Path, tmp_path: Path) -> None:
    make_file(shm / "vllm_offload_a.mmap", MIB)
    root = tmp_path / "root"
    _write_root(root, shm, dead_socket(tmp_path))

    status = _cli("--root", str(root), "shm", "status", "--json")
    assert status.returncode == 1, status.stderr
    data = json.loads(status.stdout)
    assert data["sources"]["docker"].startswith("unavailable: unix://") and data["sources"]["proc"] == "ok"
    assert "docker source unavailable" in status.stderr

    rec = _cli("--root", str(root), "shm", "reclaim", "--confirm", "--json")
    assert rec.returncode == 1
    out = json.loads(rec.stdout)
    assert out["confirmed"] is True and out["reclaimed"] == [] and out["refused"].startswith("docker unavailable")
    assert (shm / "vllm_offload_a.mmap").exists()


@pytest.fixture(scope="module")
def test_image(docker_api):  # type: ignore[no-untyped-def]
    subprocess.run([str(REPO / "examples" / "fake-vllm" / "build.sh")], check=True, capture_output=True)
    return IMAGE


@pytest.fixture
def containers(docker_api) -> Iterator[Callable[..., str]]:  # type: ignore[no-untyped-def]
    made: list[str] = []

    def run(name_hint: str, command: list[str], *, binds: dict[str, dict[str, str]], **host: object) -> str:
        name = f"reconciler-shm-{name_hint}-{uuid.uuid4().hex[:8]}"
        hc = docker_api.create_host_config(binds={"/usr": {"bind": "/usr", "mode": "ro"}, **binds}, **host)
        c = docker_api.create_container(
            IMAGE, command=command, name=name, host_config=hc, labels={"io.reconciler.test": "shm"}
        )
        made.append(c["Id"])
        docker_api.start(c["Id"])
        return name

    yield run
    for cid in made:
        docker_api.remove_container(cid, force=True)


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.docker
def test_container_mapping_a_file_owns_it(shm: Path, tmp_path: Path, test_image: str, containers) -> None:  # type: ignore[no-untyped-def]
    path = shm / "vllm_offload_c.mmap"
    st = make_file(path, 2 * MIB)
    script = "import mmap,os,time; fd=os.open('/offload/vllm_offload_c.mmap', os.O_RDWR); m=mmap.mmap(fd, 0); os.close(fd); time.sleep(600)"
    name = containers("map", ["/usr/bin/python3", "-c", script], binds={str(shm): {"bind": "/offload", "mode": "rw"}})
    observer = EngineObserver(DOCKER_URL)

    def owned() -> bool:
        return file_in(view_of(shm, observe_docker=observer.observe), path).state == "owned"

    _wait_for(owned, "the container to map the file")
    f = file_in(view_of(shm, observe_docker=observer.observe), path)
    # Python's mmap keeps a dup of the descriptor: the container's process both maps and holds the file.
    assert [(o.container, o.via) for o in f.owners] == [(name, "map"), (name, "fd")]
    assert f"in container {name}" in f.reason
    result = run_reclaim(shm, observe_docker=observer.observe)
    assert result.reclaimed == () and os.stat(path).st_ino == st.st_ino

    # The CLI, end to end against the real engine: the JSON shape of docs/design.md, "JSON output", exit 0 with both sources up.
    root = tmp_path / "root"
    _write_root(root, shm, DOCKER_URL)
    status = _cli("--root", str(root), "--json", "shm", "status")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert set(data) >= {"dir", "pattern", "tmpfs", "sources", "blocking_containers", "files"}
    assert set(data["tmpfs"]) == {"size_bytes", "used_bytes", "free_bytes"}
    assert data["sources"] == {"proc": "ok", "docker": "ok"}
    [jf] = data["files"]
    assert set(jf) >= {"path", "dev", "inode", "size_bytes", "allocated_bytes", "owners", "state", "reason"}
    assert jf["state"] == "owned" and [(o["container"], o["via"]) for o in jf["owners"]] == [
        (name, "map"),
        (name, "fd"),
    ]
    human = _cli("--root", str(root), "shm", "status")
    assert human.returncode == 0 and f"({name})" in human.stdout and str(path) in human.stdout


@pytest.mark.docker
def test_running_offload_container_blocks_every_reclaim(shm: Path, test_image: str, containers) -> None:  # type: ignore[no-untyped-def]
    path = shm / "vllm_offload_orphan.mmap"
    st = make_file(path, MIB)
    # vLLM's flags in the container's command: the container is a native-offload owner, running or starting.
    name = containers(
        "flags",
        [
            "/usr/bin/python3",
            "-c",
            "import time; time.sleep(600)",
            "--kv-offloading-size",
            "8",
            "--kv-offloading-backend",
            "native",
        ],
        binds={},
        ipc_mode="host",
    )
    observer = EngineObserver(DOCKER_URL)
    view = view_of(shm, observe_docker=observer.observe)
    assert name in view.blocking_containers
    f = file_in(view, path)
    assert f.state == "blocked" and name in f.reason
    result = run_reclaim(shm, observe_docker=observer.observe)
    assert not result.ok and result.refused and name in result.refused
    assert result.reclaimed == () and os.stat(path).st_ino == st.st_ino


# ---------------------------------------------------------------- scope, enforced again in the guard (safety rule 1)
#
# The loader refuses these configs; the guard must refuse them too (a config built around the loader, a later
# edit of its rules). ``ShmConfig.model_construct`` builds one without the model's validation.


def raw_config(d: Path | str, pattern: str) -> ShmConfig:
    return ShmConfig.model_construct(
        dir=str(d), pattern=pattern, confirm_interval_s=0.0, ignore_uninspectable_pids=[1], reserve_gib=0.0
    )


def _secrets_in(d: Path) -> dict[str, int]:
    (d / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (d / "app.conf").write_text("listen 8080\n")
    return {n: os.stat(d / n).st_ino for n in ("id_rsa", "app.conf")}


@pytest.mark.safety_rule(1)
def test_star_pattern_in_a_scratch_dir_deletes_nothing_and_says_why(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"  # on the test machine's disk, not a tmpfs
    scratch.mkdir()
    inodes = _secrets_in(scratch)
    for confirm in (False, True):
        result = reclaim(
            raw_config(scratch, "*"), observe_docker=engine_without_containers, confirm=confirm, sleep=lambda s: None
        )
        assert not result.ok and result.reclaimed == () and result.candidates == ()
        assert result.refused and result.refused.startswith("refusing to reclaim: shm.pattern '*'"), result.refused
        assert {n: os.stat(scratch / n).st_ino for n in inodes} == inodes


def test_star_pattern_is_refused_even_on_a_real_tmpfs(shm: Path) -> None:
    inodes = _secrets_in(shm)
    for pattern in ("*", "*.conf", "id_*", "vllm_offload_?.mmap", "vllm_offload_[0-9]*.mmap", "a*b*c"):
        result = reclaim(
            raw_config(shm, pattern), observe_docker=engine_without_containers, confirm=True, sleep=lambda s: None
        )
        assert result.reclaimed == () and result.refused and "shm.pattern" in result.refused, (pattern, result)
        assert {n: os.stat(shm / n).st_ino for n in inodes} == inodes, pattern


def test_a_dir_that_is_not_a_tmpfs_is_refused_at_reclaim_time(tmp_path: Path) -> None:
    scratch = tmp_path / "disk"
    scratch.mkdir()
    inodes = _secrets_in(scratch)
    st = make_file(scratch / "vllm_offload_a.mmap", 64 * 1024)
    result = reclaim(
        raw_config(scratch, PATTERN), observe_docker=engine_without_containers, confirm=True, sleep=lambda s: None
    )
    assert result.reclaimed == () and result.refused and "is not a tmpfs (statfs f_type" in result.refused
    assert os.stat(scratch / "vllm_offload_a.mmap").st_ino == st.st_ino
    assert {n: os.stat(scratch / n).st_ino for n in inodes} == inodes


def test_a_dir_inside_a_tmpfs_that_is_not_its_mount_point_is_refused(shm: Path) -> None:
    """statfs alone says tmpfs here; /proc/self/mountinfo says nothing is mounted on the subdirectory."""
    sub = shm / "sub"
    sub.mkdir()
    st = make_file(sub / "vllm_offload_a.mmap", 64 * 1024)
    result = reclaim(
        raw_config(sub, PATTERN), observe_docker=engine_without_containers, confirm=True, sleep=lambda s: None
    )
    assert result.reclaimed == () and result.refused and "not its mount point" in result.refused, result.refused
    assert os.stat(sub / "vllm_offload_a.mmap").st_ino == st.st_ino


def test_the_root_directory_is_refused_before_anything_is_read() -> None:
    def never() -> Observation:
        raise AssertionError("the scope is refused before any inspection")

    result = reclaim(raw_config("/", PATTERN), observe_docker=never, confirm=True, sleep=lambda s: None)
    assert result.refused and "root directory" in result.refused and result.inspections == 0


def kept_reasons(result: ReclaimResult, path: Path | str) -> list[str]:
    return [k.reason for k in result.kept if k.path == str(path)]


def _inspection_adding(monkeypatch: pytest.MonkeyPatch, extra: Callable[[ShmView], tuple]) -> None:  # type: ignore[type-arg]
    """Make the guard's inspection return extra "orphan" files: what a faulty (or future) scan could hand over."""
    import dataclasses

    import reconciler.apply.shm_guard as guard

    real = guard.inspect_shm

    def inspect(*a: object, **kw: object) -> ShmView:
        view = real(*a, **kw)  # type: ignore[arg-type]
        return dataclasses.replace(view, files=view.files + extra(view))

    monkeypatch.setattr(guard, "inspect_shm", inspect)


def test_a_symlink_handed_over_as_a_file_is_never_followed_or_deleted(
    shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.plan.observed import ShmFile

    precious = shm / "precious.bin"  # on the same tmpfs: a scan that followed the link would see a plain file
    ps = make_file(precious, MIB)
    link = shm / "vllm_offload_link.mmap"
    link.symlink_to(precious)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep")
    link_out = shm / "vllm_offload_out.mmap"
    link_out.symlink_to(outside)

    def followed(view: ShmView) -> tuple[ShmFile, ...]:
        st = os.stat(precious)  # the target's identity, as a scan that follows symlinks would report it
        return tuple(
            ShmFile(str(p), st.st_dev, st.st_ino, st.st_size, st.st_blocks * 512, (), "orphan", "no owner")
            for p in (link, link_out)
        )

    _inspection_adding(monkeypatch, followed)
    result = run_reclaim(shm, sleep=lambda s: None)
    assert result.reclaimed == () and result.candidates == ()
    # The guard's own check (the inspection skips symlinks as well, in its own words).
    assert "a symlink: never followed, never removed" in kept_reasons(result, link)
    assert "a symlink: never followed, never removed" in kept_reasons(result, link_out)
    assert link.is_symlink() and link_out.is_symlink() and outside.read_bytes() == b"keep"
    assert os.stat(precious).st_ino == ps.st_ino


def test_paths_outside_the_dir_or_the_pattern_handed_over_are_never_candidates(
    shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.plan.observed import ShmFile

    inodes = _secrets_in(shm)
    nested_dir = shm / "vllm_offload_d.mmap"
    nested_dir.mkdir()
    nested = make_file(nested_dir / "vllm_offload_n.mmap", MIB)
    dotted = f"{shm}/./vllm_offload_x.mmap"  # the real candidate's file under another spelling of the dir
    paths = [str(shm / "id_rsa"), str(shm / "app.conf"), str(nested_dir / "vllm_offload_n.mmap"), dotted]
    make_file(shm / "vllm_offload_x.mmap", MIB)

    def extra(view: ShmView) -> tuple[ShmFile, ...]:
        out = []
        for p in paths:
            st = os.lstat(p)
            out.append(ShmFile(str(p), st.st_dev, st.st_ino, st.st_size, st.st_blocks * 512, (), "orphan", "no owner"))
        return tuple(out)

    _inspection_adding(monkeypatch, extra)
    result = run_reclaim(shm, sleep=lambda s: None)
    assert [r.path for r in result.reclaimed] == [str(shm / "vllm_offload_x.mmap")], "only the real candidate"
    assert "does not match shm.pattern" in kept_reason(result, shm / "id_rsa")
    assert "does not match shm.pattern" in kept_reason(result, shm / "app.conf")
    assert "not directly inside shm.dir" in kept_reason(result, nested_dir / "vllm_offload_n.mmap")
    assert "not directly inside shm.dir" in kept_reason(result, dotted)
    assert {n: os.stat(shm / n).st_ino for n in inodes} == inodes
    assert os.stat(nested_dir / "vllm_offload_n.mmap").st_ino == nested.st_ino


def test_the_unlink_step_refuses_a_name_outside_the_pattern(shm: Path) -> None:
    """The last gate, on its own: even handed an agreed file, a name the pattern does not match stays."""
    from reconciler.apply.shm_guard import _dir_identity
    from reconciler.apply.shm_unlink import _unlink_agreed
    from reconciler.plan.observed import ShmFile

    inodes = _secrets_in(shm)
    agreed = []
    for n in inodes:
        st = os.stat(shm / n)
        agreed.append(ShmFile(str(shm / n), st.st_dev, st.st_ino, st.st_size, st.st_blocks * 512))
    removed, kept, errors = _unlink_agreed(str(shm), _dir_identity(str(shm)), agreed, pattern=PATTERN)
    assert removed == [] and errors == [] and all("never removed" in k.reason for k in kept)
    assert {n: os.stat(shm / n).st_ino for n in inodes} == inodes


def test_a_file_created_after_the_plan_is_not_deleted_when_only_paths_excludes_it(shm: Path) -> None:
    planned = shm / "vllm_offload_planned.mmap"
    make_file(planned, MIB)
    # The plan (or the dry run the operator saw): one inspection, its orphans.
    seen = [f.path for f in view_of(shm).by_state("orphan")]
    assert seen == [str(planned)]
    # Between the plan and the reclaim: a new matching file that nobody maps (a crashed start, or anybody's).
    late = shm / "vllm_offload_late.mmap"
    st = make_file(late, MIB)
    assert file_in(view_of(shm), late).state == "orphan", "unowned and matching: only only_paths keeps it"

    result = reclaim(
        config(shm), observe_docker=engine_without_containers, confirm=True, only_paths=seen, sleep=lambda s: None
    )
    assert [r.path for r in result.reclaimed] == [str(planned)] and result.verified
    assert os.stat(late).st_ino == st.st_ino
    assert "not among the paths" in kept_reason(result, late)
    # An empty set removes nothing at all.
    nothing = reclaim(
        config(shm), observe_docker=engine_without_containers, confirm=True, only_paths=[], sleep=lambda s: None
    )
    assert nothing.reclaimed == () and os.stat(late).st_ino == st.st_ino


def _reclaim_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``shm reclaim --json ARGS``; while a native-offload container of another test runs on this engine (every
    reclaim is refused then), wait for it to end and ask again."""
    deadline = time.monotonic() + 120
    while (r := _cli("--root", str(root), "shm", "reclaim", "--json", *args)).returncode != 0:
        assert "native offload" in r.stderr and time.monotonic() < deadline, r.stderr
        time.sleep(1)
    return r


@pytest.mark.docker
def test_cli_reclaim_removes_only_the_paths_the_dry_run_listed(shm: Path, tmp_path: Path, docker_api) -> None:  # type: ignore[no-untyped-def]
    planned = shm / "vllm_offload_planned.mmap"
    make_file(planned, MIB)
    root = tmp_path / "root"
    _write_root(root, shm, DOCKER_URL)  # the dry run needs Docker to answer to call anything an orphan
    dry = _reclaim_cli(root)
    listed = [f["path"] for f in json.loads(dry.stdout)["would_reclaim"]]
    assert listed == [str(planned)]
    late = shm / "vllm_offload_late.mmap"
    st = make_file(late, MIB)

    args = [a for p in listed for a in ("--path", p)]
    done = _reclaim_cli(root, "--confirm", *args)
    out = json.loads(done.stdout)
    assert [r["path"] for r in out["reclaimed"]] == [str(planned)] and out["verified"] is True
    assert os.stat(late).st_ino == st.st_ino and not planned.exists()


# ---------------------------------------------------------------- a stopped container's own files (safety rule 2)


def _starting_offload_lane() -> Observation:
    """An engine running one native-offload container that is not settled yet (another lane still entering)."""
    lane = ContainerView(id="b" * 64, name="reconciler-starting-lane", state="running", image="i", offload=True)
    return (lane,), Reading("docker", True)


def test_a_stopped_containers_own_file_goes_while_another_offload_lane_is_starting(shm: Path) -> None:
    """A failed enter (or a leave) claims the files its container was the only one seen holding: no running
    offload container can be making such a file, so one still starting keeps only the files nobody can account
    for, and the claimed file goes (it was refused, and the planner had counted it as room)."""
    own = shm / "vllm_offload_own.mmap"
    make_file(own, MIB)
    stray = shm / "vllm_offload_stray.mmap"
    st = make_file(stray, MIB)

    res = reclaim(
        config(shm),
        observe_docker=_starting_offload_lane,
        confirm=True,
        only_paths=[str(own)],
        claimed=[str(own)],
        sleep=lambda s: None,
    )
    assert res.refused is None and [f.path for f in res.reclaimed] == [str(own)], res
    assert not own.exists() and os.stat(stray).st_ino == st.st_ino

    both = reclaim(
        config(shm),
        observe_docker=_starting_offload_lane,
        confirm=True,
        only_paths=[str(stray)],
        claimed=[],
        sleep=lambda s: None,
    )
    assert both.refused and "reconciler-starting-lane" in both.refused and stray.exists()
