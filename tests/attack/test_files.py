"""A local user against the files root writes and trusts, for real: uid 65534 plants symlinks, files and locks where
the tool used to write (a world-writable lock directory like /run/lock, a state directory anyone can write, a
predictable temporary name), and the real command line run as root answers each with a clear error (exit 1, the
directory or file named, the fix) and writes nothing through the plant. Without a plant, the tool makes its
directories 0700 and the unprivileged user can neither read, lock nor forge anything in them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from e2e_helpers import LoopProcess, Root, wait_until

from attack.helpers import PRECIOUS, Attacker, no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"


def orphan(root: Root, name: str = "vllm_offload_stale.mmap") -> Path:
    p = root.shm / name
    p.write_bytes(b"\0" * 4096)
    return p


@pytest.mark.safety_rule(12)
def test_a_world_writable_lock_directory_is_refused_and_nothing_is_written_through_it(
    root: Root, attacker: Attacker, public: Path, precious: Path
) -> None:
    root.manifest()
    stale = orphan(root)
    # Before: the lock lived in /run/lock (1777). The attacker plants the lock file as a symlink to root's file,
    # the loop's state file as a forgery, and holds a flock of its own on a lock file it made.
    attacker.run("ln", "-s", str(precious), str(public / f"reconciler-{root.host}.lock"), check=True)
    forged = {
        "pid": 1,
        "host": root.host,
        "backoff": {f"omni@{B}": {"until": 4e9, "failures": 99, "last_error": "forged by nobody"}},
    }
    attacker.python(
        "import json, sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        str(public / f"reconciler-{root.host}.state.json"),
        json.dumps(forged),
    )
    root.env["RECONCILER_LOCK_DIR"] = str(public)
    for args in (("shm", "reclaim", "--confirm"), ("apply", "--yes")):
        r = root.cli(*args)
        assert r.rc == 1, r
        no_traceback(r.stderr + r.stdout)
        assert str(public) in r.stderr and "writable by group or others" in r.stderr, r
        assert "RECONCILER_LOCK_DIR" in r.stderr and "chmod go-w" in r.stderr, r
    for args in (("status",), ("plan",)):
        r = root.cli(*args)
        assert r.rc == 1 and "forged by nobody" not in r.stdout + r.stderr, r
        assert str(public) in r.stderr and "writable by group or others" in r.stderr, r
    assert precious.read_text() == PRECIOUS, "the symlinked file was not truncated"
    assert stale.exists(), "nothing was reclaimed without a safe lock"


@pytest.mark.safety_rule(12)
def test_a_runtime_directory_planted_by_another_user_is_refused(
    root: Root, attacker: Attacker, public: Path, precious: Path
) -> None:
    root.manifest()
    # The attacker makes the directory first (a sticky parent lets it), with a symlink inside.
    planted = public / "reconciler"
    attacker.run("mkdir", "-m", "0700", str(planted), check=True)
    attacker.run("ln", "-s", str(precious), str(planted / f"reconciler-{root.host}.lock"), check=True)
    root.env["RECONCILER_LOCK_DIR"] = str(planted)
    r = root.cli("apply", "--yes")
    assert r.rc == 1, r
    no_traceback(r.stderr)
    assert f"{planted} is owned by uid 65534" in r.stderr and "cannot take the host lock" in r.stderr, r
    assert precious.read_text() == PRECIOUS


def test_the_private_directories_keep_the_unprivileged_user_out(
    root: Root, attacker: Attacker, scratch: Path, start_loop
) -> None:  # type: ignore[no-untyped-def]
    root.manifest()
    runtime, state = scratch / "run" / "reconciler", scratch / "lib" / "reconciler"
    root.env["RECONCILER_LOCK_DIR"], root.env["RECONCILER_STATE_DIR"] = str(runtime), str(state)
    lp: LoopProcess = start_loop().started()
    for d in (runtime, state, state / root.host):
        st = d.stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700, (d, oct(st.st_mode))
    lock, state_file = runtime / f"reconciler-{root.host}.lock", runtime / f"reconciler-{root.host}.state.json"
    wait_until(state_file.exists, timeout=10, what="the loop's state file")  # written just after the pass's log line
    assert lock.exists() and stat.S_IMODE(state_file.stat().st_mode) == 0o600
    # Nobody can open the lock (to flock it: a denial of every apply), forge the state, or plant a name.
    probe = attacker.python(
        "import fcntl, os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o666); fcntl.flock(fd, fcntl.LOCK_EX); print('OPENED', p)\n"
        "    except OSError as e:\n"
        "        print('denied', e.errno)\n",
        str(lock),
        str(state_file),
        str(runtime / "planted"),
        str(state / root.host / "api-token"),
    )
    assert "OPENED" not in probe.stdout and probe.stdout.count("denied 13") == 4, probe
    r = root.cli("status", "--json")
    assert r.rc == 0 and r.data["loop"]["pid"] == lp.proc.pid, r
    lp.stop()


def test_a_writable_state_directory_and_a_planted_token_are_refused(
    root: Root, attacker: Attacker, public: Path, start_loop
) -> None:  # type: ignore[no-untyped-def]
    root.manifest()
    # Before: with RECONCILER_STATE_DIR in a writable place, nobody's token file was used ("generated").
    state = public / "state"
    attacker.run("mkdir", "-p", "-m", "0700", str(state / root.host), check=True)
    attacker.python(
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600); "
        "os.write(fd, b'nobody-knows-this-token-0123456789')",
        str(state / root.host / "api-token"),
    )
    root.env["RECONCILER_STATE_DIR"] = str(state)
    r = root.cli("run", "--metrics-addr", "127.0.0.1:0", "--log-format", "json", timeout=30)
    assert r.rc == 1, r
    no_traceback(r.stderr)
    assert "owned by uid 65534" in r.stderr and "RECONCILER_STATE_DIR" in r.stderr, r
    assert "generated" not in r.stderr
    # The same directory handed over to root but left world-writable is refused as well.
    os.chown(state, 0, 0)
    state.chmod(0o777)
    r = root.cli("apply", "--yes")
    assert r.rc == 1 and f"{state} is writable by group or others" in r.stderr, r


def test_a_secrets_file_of_another_user_is_refused(root: Root, attacker: Attacker, public: Path) -> None:
    env_file = public / "secrets.env"
    attacker.python(
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600); "
        "os.write(fd, b'HF_TOKEN=chosen-by-nobody\\n')",
        str(env_file),
    )
    root.with_secret(env_file)
    r = root.cli("validate")
    assert r.rc == 1, r
    no_traceback(r.stderr)
    assert f"{env_file} is owned by uid 65534" in r.stderr and "chosen-by-nobody" not in r.stderr, r


def test_plan_out_replaces_a_planted_symlink_and_apply_refuses_a_plan_it_does_not_own(
    root: Root, attacker: Attacker, public: Path, precious: Path
) -> None:
    root.manifest()
    out = public / "plan.json"
    # Before: `plan --out FILE` wrote FILE.tmpPID with O_CREAT|O_TRUNC, following a symlink planted there.
    attacker.run("ln", "-s", str(precious), str(out), check=True)
    attacker.python(
        "import os, sys\n"
        "base = int(open('/proc/sys/kernel/ns_last_pid').read())\n"
        "for pid in range(base, base + 400):\n"
        "    os.symlink(sys.argv[2], f'{sys.argv[1]}.tmp{pid}')\n",
        str(out),
        str(precious),
    )
    r = root.cli("plan", "--out", str(out))
    assert r.rc == 0, r
    assert precious.read_text() == PRECIOUS, "a planted symlink was followed"
    st = out.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, st
    # Root's own plan applies (planned again when another test's container on a shared engine made it stale).
    for _ in range(5):
        applied = root.cli("apply", str(out))
        if applied.rc == 0 or "stale" not in applied.stderr:
            break
        assert root.cli("plan", "--out", str(out)).rc == 0
    assert applied.rc == 0, applied

    # A plan file of nobody's (a copy of a real one) is refused, and so is root's own left writable by others.
    mine = json.loads(out.read_text())
    theirs = public / "theirs.json"
    attacker.python("import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(theirs), json.dumps(mine))
    r = root.cli("apply", str(theirs))
    assert r.rc == 1, r
    no_traceback(r.stderr)
    assert f"{theirs} is owned by uid 65534" in r.stderr and "nothing was applied" in r.stderr, r
    out.chmod(0o666)
    r = root.cli("apply", str(out))
    assert r.rc == 1 and "writable by group or others" in r.stderr, r
    records = root.cli("audit", "--json").data["records"]
    refused = [x for x in records if x["action"] == "apply" and x["outcome"] == "refused"]
    assert len(refused) == 2 and "uid 65534" in refused[0]["reason"], records
