"""The guarded reclaim under the unit's capabilities (docs/design.md, safety rule 4, and "The unit's
capabilities"): the write lease taken on an offload file before its unlink needs the file's owner or CAP_LEASE,
and a lane of another user made the file. Each case runs the real ``reconciler shm reclaim --confirm`` under
``setpriv`` with exactly the capability sets the unit from ``reconciler systemd-unit`` declares (read from its text
here, so the test follows the unit), on a real tmpfs, against a file a real process of uid 65534 made and left
behind when it exited.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER_URL = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock")
LANE_UID = 65534  # nobody: a lane's user other than root
PYTHON = "/usr/bin/python3"  # the lane's: stdlib only
CAP_LEASE = 28  # capability(7)

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.safety_rule(4)]

# A lane's worker as vLLM's makes its offload file: created by its own user (0600), sized and mapped; it exits when
# stdin closes and leaves the file behind, held by no one.
LANE = textwrap.dedent(
    """
    import mmap, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 1 << 20)
    m = mmap.mmap(fd, 1 << 20)
    m[0:5] = b"lane\\n"
    os.close(fd)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def unit_caps() -> tuple[list[str], list[str], bool]:
    """The bounding set, the ambient set and NoNewPrivileges of the unit ``reconciler systemd-unit`` prints."""
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", "/etc/reconciler", "systemd-unit"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    conf: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            conf[key.strip()] = value.strip()
    assert conf.get("User", "root") == "root", "the unit runs as root: the sets below are root's"
    return (
        conf["CapabilityBoundingSet"].split(),
        conf.get("AmbientCapabilities", "").split(),
        (conf.get("NoNewPrivileges") == "yes"),
    )


def setpriv_as(bounding: list[str], ambient: list[str], no_new_privs: bool) -> list[str]:
    """``setpriv`` that leaves root exactly these sets, as systemd leaves the unit's process: root's permitted and
    effective sets after exec are its bounding set (and its ambient one), so the inheritable set is emptied too."""

    def caps(names: list[str]) -> str:
        return ",".join(["-all", *(f"+{re.sub('^CAP_', '', n).lower()}" for n in names)])

    cmd = ["setpriv", f"--bounding-set={caps(bounding)}", f"--inh-caps={caps(ambient)}"]
    if ambient:
        cmd.append(f"--ambient-caps={caps(ambient)}")
    if no_new_privs:
        cmd.append("--no-new-privs")
    return [*cmd, "--"]


def cap_bits(names: list[str]) -> int:
    numbers = {"CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_SYS_PTRACE": 19}
    numbers["CAP_LEASE"] = CAP_LEASE
    return sum(1 << numbers[n] for n in set(names))


def effective(prefix: list[str]) -> int:
    """CapEff of a process started under ``prefix``."""
    done = subprocess.run(
        [*prefix, PYTHON, "-c", "print(open('/proc/self/status').read())"], capture_output=True, text=True, check=True
    )
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("CapEff:")]
    return int(line.split()[1], 16)


def orphan_of_another_user(shm: Path) -> Path:
    """A file a real process of uid 65534 made in ``shm`` (a sticky tmpfs, as /dev/shm is), mapped, then left behind
    when the process ended."""
    path = shm / "vllm_offload_lane.mmap"
    lane = subprocess.Popen(
        ["setpriv", f"--reuid={LANE_UID}", f"--regid={LANE_UID}", "--clear-groups", PYTHON, "-c", LANE, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert lane.stdout is not None and lane.stdin is not None
    assert lane.stdout.readline() == "ready\n", "the lane did not make its file"
    lane.stdin.close()
    assert lane.wait(timeout=30) == 0
    st = os.stat(path)
    assert (st.st_uid, st.st_mode & 0o777) == (LANE_UID, 0o600)
    return path


def write_root(root: Path, shm: Path) -> None:
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "host.yaml").write_text(
        textwrap.dedent(
            f"""\
            name: lease-unit-test
            gpus:
              a: {{index: 0}}
            gpu_telemetry: none
            docker:
              url: {DOCKER_URL}
            shm:
              dir: {shm}
              confirm_interval_s: 0.2
              ignore_uninspectable_pids: [1]
            """
        )
    )


def reclaim_under(prefix: list[str], root: Path) -> subprocess.CompletedProcess[str]:
    """``shm reclaim --confirm --json`` under ``prefix``; while a native-offload container of another test runs on
    this engine (every reclaim is refused then), wait for it to end and ask again."""
    cmd = [*prefix, sys.executable, "-m", "reconciler", "--root", str(root), "shm", "reclaim", "--confirm", "--json"]
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
        if "native offload" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(1)


@pytest.fixture
def needs_tools(docker_api) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run the reclaim with the unit's capabilities")


def test_the_units_capabilities_let_reclaim_remove_another_users_orphan(
    tmpfs_dir: Path, tmp_path: Path, needs_tools: None
) -> None:
    bounding, ambient, nnp = unit_caps()
    prefix = setpriv_as(bounding, ambient, nnp)
    assert effective(prefix) == cap_bits(bounding + ambient), "setpriv leaves exactly the unit's set"
    path = orphan_of_another_user(tmpfs_dir)
    root = tmp_path / "root"
    write_root(root, tmpfs_dir)

    done = reclaim_under(prefix, root)
    out = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr + done.stdout
    assert [r["path"] for r in out["reclaimed"]] == [str(path)] and out["verified"] is True, out
    assert not path.exists() and "Traceback" not in done.stderr


def test_without_cap_lease_the_refusal_is_in_words(tmpfs_dir: Path, tmp_path: Path, needs_tools: None) -> None:
    bounding, ambient, nnp = unit_caps()
    without = [c for c in bounding if c != "CAP_LEASE"]
    prefix = setpriv_as(without, [c for c in ambient if c != "CAP_LEASE"], nnp)
    assert not effective(prefix) >> CAP_LEASE & 1
    path = orphan_of_another_user(tmpfs_dir)
    inode = os.stat(path).st_ino
    root = tmp_path / "root"
    write_root(root, tmpfs_dir)

    done = reclaim_under(prefix, root)
    words = (
        f"cannot take the write lease on {path}: it belongs to uid {LANE_UID} and this process lacks CAP_LEASE "
        "(the kernel answered EACCES); the unit that `reconciler systemd-unit` prints grants it"
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: {words}" in done.stderr, done.stderr
    out = json.loads(done.stdout)
    [kept] = out["kept"]
    assert kept["path"] == str(path) and kept["code"] == "lease_refused" and words in kept["reason"], kept
    assert out["reclaimed"] == [] and os.stat(path).st_ino == inode

    # In words on a terminal's plain output too.
    plain = subprocess.run(
        [*prefix, sys.executable, "-m", "reconciler", "--root", str(root), "shm", "reclaim", "--confirm"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    if "native offload" not in plain.stderr:
        assert plain.returncode == 1 and words in plain.stdout and words in plain.stderr, plain
        assert "Traceback" not in plain.stderr
