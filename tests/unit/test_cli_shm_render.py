"""Human and JSON output of ``shm status`` / ``shm reclaim`` from plain values (the guard itself is tested on a
real tmpfs in test_shm_guard.py)."""

from __future__ import annotations

from reconciler.apply.shm_results import KeptFile, ReclaimResult, RemovedFile
from reconciler.cli.commands.shm import render_reclaim, render_status
from reconciler.observe.shapes import status_json
from reconciler.plan.observed import Owner, Reading, ShmFile, ShmView, Tmpfs, Uninspectable

GIB = 1 << 30

VIEW = ShmView(
    dir="/dev/shm",
    pattern="vllm_offload_*.mmap",
    tmpfs=Tmpfs(size_bytes=32 * GIB, used_bytes=31 * GIB, free_bytes=1 * GIB),
    proc=Reading("proc", True),
    docker=Reading("docker", True),
    files=(
        ShmFile(
            "/dev/shm/vllm_offload_a.mmap",
            41,
            7,
            8 * GIB,
            8 * GIB,
            (Owner(101, "map", "vllm-exclusive", "vllm serve"),),
            "owned",
            "mapped by pid 101",
        ),
        ShmFile("/dev/shm/vllm_offload_[b].mmap", 41, 8, 8 * GIB, 8 * GIB, (), "orphan", "no live process maps it"),
        ShmFile("/dev/shm/vllm_offload_c\nd.mmap", 41, 9, 100, 4096, (), "orphan", "no live process maps it"),
    ),
    deleted_mapped_bytes=GIB,
    deleted_mapped=(
        ShmFile("/dev/shm/vllm_offload_z.mmap (deleted)", 41, 10, GIB, GIB, (Owner(102, "map"),), "owned", "unlinked"),
    ),
    uninspectable=(Uninspectable(1, "/sbin/init " + "x" * 100, "/proc/1/maps: Permission denied", True),),
    skipped=(("/dev/shm/vllm_offload_l.mmap", "a symlink (to '/etc/passwd'): never followed, never removed"),),
)


def test_status_json_has_the_design_shape() -> None:
    data = status_json(VIEW)
    assert list(data)[:6] == ["dir", "pattern", "tmpfs", "sources", "blocking_containers", "files"]
    assert data["sources"] == {"proc": "ok", "docker": "ok"}
    first = data["files"][0]
    assert {k: first[k] for k in ("path", "dev", "inode", "size_bytes", "allocated_bytes", "state", "reason")} == {
        "path": "/dev/shm/vllm_offload_a.mmap",
        "dev": 41,
        "inode": 7,
        "size_bytes": 8 * GIB,
        "allocated_bytes": 8 * GIB,
        "state": "owned",
        "reason": "mapped by pid 101",
    }
    assert first["owners"] == [{"pid": 101, "container": "vllm-exclusive", "via": "map", "command": "vllm serve"}]
    assert data["deleted_mapped_bytes"] == GIB
    assert data["uninspectable"][0]["excused"] is True


def test_plain_status_is_one_row_per_file_with_odd_names_quoted() -> None:
    text = render_status(VIEW, tty=False)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert lines[0] == "/dev/shm (vllm_offload_*.mmap): 1.00 GiB free of 32.00 GiB, 31.00 GiB used"
    rows = [line for line in lines if line.startswith(("owned", "orphan", "blocked"))]
    assert len(rows) == 3
    assert "101 map (vllm-exclusive)" in rows[0]
    assert rows[2].endswith("'/dev/shm/vllm_offload_c\\nd.mmap'")
    assert "unlinked but still held: 1 file(s), 1.00 GiB" in text
    assert any(line.startswith("uninspectable pid 1 (/sbin/init xxx") and line.count("x") < 80 for line in lines)


def test_terminal_status_does_not_read_paths_as_markup() -> None:
    text = render_status(VIEW, tty=True)
    assert "vllm_offload_[b].mmap" in text


def test_reclaim_texts() -> None:
    removed = RemovedFile("/dev/shm/vllm_offload_b.mmap", 8 * GIB, 8 * GIB, 41, 8)
    dry = ReclaimResult(confirmed=False, dir="/dev/shm", pattern="p", candidates=(removed,))
    assert render_reclaim(dry).startswith("dry run: would remove 1 orphan file(s), 8.00 GiB; run with --confirm")
    assert "to remove exactly these: reconciler shm reclaim --confirm --path " in render_reclaim(dry)
    assert dry.to_json()["reclaimed"] == [] and dry.to_json()["would_reclaim_bytes"] == 8 * GIB
    done = ReclaimResult(
        confirmed=True,
        dir="/dev/shm",
        pattern="p",
        reclaimed=(removed,),
        kept=(KeptFile("/dev/shm/vllm_offload_a.mmap", "mapped by pid 101", "owned"),),
        verified=True,
    )
    text = render_reclaim(done)
    assert text.startswith("removed 1 file(s), 8.00 GiB freed (verified absent)")
    assert "  /dev/shm/vllm_offload_a.mmap: mapped by pid 101" in text
    assert done.ok and done.to_json()["reclaimed_bytes"] == 8 * GIB
    refused = ReclaimResult(confirmed=True, dir="/dev/shm", pattern="p", refused="docker unavailable: x")
    assert render_reclaim(refused).startswith("refused: docker unavailable: x") and not refused.ok


def test_owners_are_grouped_by_container_each_pid_once() -> None:
    from reconciler.cli.commands.shm import _owners

    owners = (
        Owner(7566, "map", "lane"),
        Owner(7567, "map", "lane"),
        Owner(7566, "fd", "lane"),
        Owner(7567, "fd", "lane"),
        Owner(42, "fd"),
    )
    f = ShmFile("/dev/shm/vllm_offload_a.mmap", 41, 7, GIB, GIB, owners, "owned", "mapped")
    assert _owners(f) == "7566 map+fd, 7567 map+fd (lane); 42 fd"


def test_terminal_colours_never_shift_a_column() -> None:
    """On a terminal each state is coloured (render.Style), and with the escapes taken out the table is the plain one.
    The colours are the tool's own: the terminal boundary (``units.terminal_text``) writes them raw."""
    import re

    from reconciler.base.units import terminal_text

    coloured = terminal_text(render_status(VIEW, tty=True))
    assert "\x1b[32mowned\x1b[0m" in coloured and "\x1b[1mSTATE\x1b[0m" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == render_status(VIEW, tty=False)
