"""A mapping handed down by fork, on the real /proc and a real tmpfs: the holder scan re-lists /proc until no pid
it has not read appears (docs/design.md, safety rule 2), and the kernel's write lease is the last gate before every
unlink (safety rule 4): it is refused while any other open file description of the file exists, a mapping's
included, whatever the scan saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import make_file, shm_config

from reconciler.apply.shm_guard import reclaim
from reconciler.model import ShmConfig
from reconciler.observe.holder_scan import scan_holders
from reconciler.plan.observed import Reading

REPO = Path(__file__).resolve().parents[2]
DOCKER_URL = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock")

pytestmark = pytest.mark.root

# A prefork recycler, as a daemonising double fork does it over and over: the process maps the file, closes every
# descriptor of it, and from then on forks a child (which inherits the mapping) and exits, every ``hop`` seconds.
# The file is mapped without a break, by a pid that is always new. It stops when ``stop`` appears.
CHAIN = textwrap.dedent(
    """
    import mmap, os, sys, time
    path, hop, stop, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, os.fstat(fd).st_size)
    ino = os.fstat(fd).st_ino
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{name}").st_ino == ino:
                os.close(int(name))
        except OSError:
            pass
    if os.fork():
        os._exit(0)  # the launcher sees its child exit: the chain runs on detached
    os.setsid()
    open(ready, "w").close()
    while not os.path.exists(stop):
        time.sleep(hop)
        if os.fork():
            os._exit(0)
    m[0:1] = b"x"  # the last of the chain still has the mapping
    """
)


@pytest.fixture
def shm(tmpfs_dir: Path) -> Path:
    return tmpfs_dir


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[object]:
    started: list[Path] = []

    def start(path: Path, hop: float) -> None:
        stop, ready = tmp_path / f"stop-{len(started)}", tmp_path / f"ready-{len(started)}"
        subprocess.run([sys.executable, "-c", CHAIN, str(path), str(hop), str(stop), str(ready)], check=True)
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert time.monotonic() < deadline, "the fork chain did not start"
            time.sleep(0.01)
        started.append(stop)

    try:
        yield start
    finally:
        for stop in started:
            stop.touch()
        time.sleep(0.2)


def holder(code: str, path: Path) -> subprocess.Popen[str]:
    """A process that runs ``code`` on ``p`` (the path), says ready and waits until its stdin closes."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, sys\np={str(path)!r}\n{code}\nprint('ready', flush=True)\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


# Python's mmap keeps a dup of the descriptor: every descriptor of the file is closed, so only the mapping holds it.
_CLOSE_ALL = (
    "ino = os.stat(p).st_ino\n"
    "for n in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        os.stat(f'/proc/self/fd/{n}').st_ino == ino and os.close(int(n))\n"
    "    except OSError:\n"
    "        pass\n"
    "assert not [n for n in os.listdir('/proc/self/fd') if os.path.exists(f'/proc/self/fd/{n}') "
    "and os.stat(f'/proc/self/fd/{n}').st_ino == ino]"
)
MAP_RO = "import mmap; fd=os.open(p, os.O_RDONLY); m=mmap.mmap(fd, 4096, prot=mmap.PROT_READ)\n" + _CLOSE_ALL
MAP_RW = "import mmap; fd=os.open(p, os.O_RDWR); m=mmap.mmap(fd, 4096)\n" + _CLOSE_ALL
OPEN_FD = "fd=os.open(p, os.O_RDONLY)"


def map_only(path: Path) -> subprocess.Popen[str]:
    return holder(MAP_RW, path)


def config(d: Path, **kw: object) -> ShmConfig:
    return shm_config(d, **{"confirm_interval_s": 0.05, **kw})  # type: ignore[no-any-return]


def no_containers() -> tuple[tuple[()], Reading]:
    return (), Reading("docker", True)


def _write_root(root: Path, shm: Path) -> None:
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "host.yaml").write_text(
        textwrap.dedent(
            f"""\
            name: shm-handoff
            gpus:
              a: {{index: 0}}
            gpu_telemetry: none
            docker:
              url: {DOCKER_URL}
            shm:
              dir: {shm}
              confirm_interval_s: 0.1
              ignore_uninspectable_pids: [1]
            """
        )
    )


def test_a_mapping_handed_down_by_fork_is_seen_by_every_scan(shm: Path, chain) -> None:  # type: ignore[no-untyped-def]
    path = shm / "vllm_offload_chain.mmap"
    st = make_file(path)
    chain(path, 0.004)
    misses = 0
    for _ in range(20):
        scan = scan_holders(st.st_dev, workers=1)
        if st.st_ino not in scan.holders() and not getattr(scan, "unstable", ""):
            misses += 1
    assert misses == 0, f"{misses} of 20 scans missed the fork chain that maps {path} without a break"


def test_shm_reclaim_never_unlinks_a_file_a_fork_chain_keeps_mapped(shm: Path, tmp_path: Path, chain) -> None:  # type: ignore[no-untyped-def]
    """``reconciler shm reclaim --confirm``, the whole command, again and again while a prefork chain maps the file;
    an orphan beside it shows that each run could remove what it should."""
    held = shm / "vllm_offload_chain.mmap"
    st = make_file(held)
    # A hop of 20 ms: slower than a re-listing round takes even on a loaded machine (so the scan settles, and the
    # orphan beside it can go), faster than one pass over /proc (so one listing misses the chain).
    chain(held, 0.02)
    root = tmp_path / "root"
    _write_root(root, shm)
    reclaimed_orphans = 0
    outs = []
    for i in range(6):
        orphan = shm / f"vllm_offload_orphan{i}.mmap"
        make_file(orphan)
        out = subprocess.run(
            [sys.executable, "-m", "reconciler", "--root", str(root), "shm", "reclaim", "--confirm", "--json"],
            check=False,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert os.stat(held).st_ino == st.st_ino, f"run {i} unlinked the file the chain maps: {out.stdout}"
        data = json.loads(out.stdout)
        outs.append({k: data[k] for k in ("refused", "sources", "blocking_containers")})
        reclaimed_orphans += str(orphan) in {f["path"] for f in data["reclaimed"]}
    assert reclaimed_orphans, f"no run reclaimed an orphan: the test proved nothing (every reclaim refused): {outs}"


def test_the_write_lease_alone_refuses_while_a_hidden_holder_maps_the_file(shm: Path, tmp_path: Path) -> None:
    """The /proc scan defeated (an empty proc root: every file reads as an orphan): the kernel still knows the
    mapping, so the lease is refused, the file stays, and the refusal has its reason code."""
    held = shm / "vllm_offload_held.mmap"
    st = make_file(held)
    orphan = shm / "vllm_offload_free.mmap"
    make_file(orphan)
    holder = map_only(held)  # a mapping, no descriptor
    fake_proc = tmp_path / "proc"
    fake_proc.mkdir()
    try:
        res = reclaim(config(shm), observe_docker=no_containers, confirm=True, proc_root=str(fake_proc))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)

    assert os.stat(held).st_ino == st.st_ino, "unlinked a file a live process maps"
    assert [f.path for f in res.reclaimed] == [str(orphan)] and not orphan.exists()
    [kept] = [k for k in res.kept if k.path == str(held)]
    assert kept.code == "lease_refused" and "write lease" in kept.reason
    from reconciler.loop.refusals import reclaim_refusals

    assert "lease_refused" in reclaim_refusals(res)


def test_the_write_lease_is_refused_for_a_read_only_mapping_and_an_open_descriptor(shm: Path) -> None:
    """What the gate rests on, checked on this kernel's tmpfs: F_SETLEASE F_WRLCK from an O_RDONLY descriptor is
    granted only while no other open file description exists, however the holder holds it."""
    from reconciler.apply.shm_unlink import LeaseRefused, take_lease

    path = shm / "vllm_offload_x.mmap"
    make_file(path)
    dfd = os.open(shm, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for how, code in (("map-ro", MAP_RO), ("map-rw", MAP_RW), ("fd", OPEN_FD)):
            p = holder(code, path)
            with pytest.raises(LeaseRefused) as exc:
                take_lease(dfd, path.name)
            assert exc.value.code == "lease_refused", how
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=10)
            lease = take_lease(dfd, path.name)  # the holder gone: granted
            lease.release()
    finally:
        os.close(dfd)


def test_an_opener_during_the_lease_cannot_kill_the_lease_holder(shm: Path) -> None:
    """A lease break signals its owner (SIGIO by default, which kills): the gate asks for a signal that is
    ignored by default, so a concurrent open only waits for the release."""
    from reconciler.apply.shm_unlink import take_lease

    path = shm / "vllm_offload_y.mmap"
    make_file(path)
    dfd = os.open(shm, os.O_RDONLY | os.O_DIRECTORY)
    try:
        lease = take_lease(dfd, path.name)
        opener = subprocess.Popen([sys.executable, "-c", f"import os; os.open({str(path)!r}, os.O_RDONLY)"])
        time.sleep(0.3)  # the open is blocked on the lease and its break signal was sent to this process
        assert not lease.intact(), "an opener's lease break is seen"
        lease.release()
        assert opener.wait(timeout=10) == 0
    finally:
        os.close(dfd)
