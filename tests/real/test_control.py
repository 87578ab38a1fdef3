"""The running loop answers the command line (reconciler.control), for real: ``reconciler run`` as a process on a
root of the test's own (tests/e2e_helpers.py), the real engine, fake-vllm lanes, a real tmpfs, and the command line
as whole processes beside it.

- Each read-only command (plan, status, shm status, audit, probe; text and ``--json``) answered by the loop prints
  what the same command prints stand-alone (``RECONCILER_NO_LOOP=1``) apart from times, with the same exit code,
  and the client process never loads pydantic, the engine's client, the model or the service layer (its modules
  are listed at its exit).
- ``apply``, an interactive ``apply`` (a pseudo-terminal answers its prompt), ``apply FILE`` and
  ``shm reclaim --confirm`` are carried out by the loop under its pass lock while it holds the host (stand-alone
  they meet "another reconciler holds"); an approval that comes after the files changed is refused as stale and
  nothing runs; the loop's passes go on while the prompt waits.
- A loop killed with SIGKILL leaves its socket behind: the commands run stand-alone.
- Planted: a socket of another user in the runtime directory, or one that a process of another user listens on, is
  refused (exit 1, named, with the fix) and nothing is sent to it; the loop refuses a client of another user.

The loops run with ``--debounce 30``: after an edit of the files a loop waits 30 quiet seconds before its own pass,
so what the test asks of it through the command line is what acts (other work on a shared engine may wake a loop).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from attack.helpers import Attacker, no_traceback
from e2e_helpers import CliResult, LoopProcess, Root, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"
ALONE = {"RECONCILER_NO_LOOP": "1"}
# Never loaded by a command the loop answers: what makes a stand-alone command slow, or could act on the host.
HEAVY = (
    "pydantic",
    "pydantic_core",
    "docker",
    "yaml",
    "rich",
    "reconciler.model",
    "reconciler.service",
    "reconciler.load.desired",
    "reconciler.plan.planner",
    "reconciler.observe",
)

# The command line as a whole process (``python -m reconciler ARGS``), listing the modules it loaded at its exit.
CLIENT = r"""
import json, os, runpy, sys
sys.argv = ["reconciler", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("reconciler", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
finally:
    sys.stdout.flush()
    with open(os.environ["CLIENT_MODULES"], "w") as f:
        json.dump(sorted(sys.modules), f)
sys.exit(code)
"""

# Times are the one thing two answers a moment apart may differ in.
_TIMES = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?Z?"  # ISO times
    r"|\"(seconds|at|age_s|last_pass_age_s|since_start_s|started|ts|time)\": -?[0-9.e+-]+"  # JSON durations, epochs
    r"|\b\d+(\.\d+)?\s?(ms|s)\b"  # "0.52s", "12 s"
    r"|\b\d+m\d\ds\b"  # "3m54s"
    r"|\b\d+(\.\d+)? ?(seconds|minutes|hours|days) ago\b"
)


def norm(text: str) -> str:
    return _TIMES.sub("<time>", text)


@pytest.fixture
def client(root: Root, tmp_path: Path) -> Callable[..., tuple[CliResult, list[str]]]:
    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> tuple[CliResult, list[str]]:
        mods = tmp_path / "client-modules.json"
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, "--root", str(root.path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**root.env, "CLIENT_MODULES": str(mods), **(env or {})},
            check=False,
        )
        return CliResult(args, proc.returncode, proc.stdout, proc.stderr), json.loads(mods.read_text())

    return run


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY or any(m == h or m.startswith(h + ".") for h in HEAVY)]


def orphan(root: Root, name: str = "vllm_offload_stale.mmap", size: int = 1 << 20) -> Path:
    p = root.shm / name
    p.write_bytes(b"\0" * size)
    return p


def hold_off(root: Root, lp: LoopProcess) -> None:
    """Touch a file under configs/: the loop waits its 30 s debounce before its own next pass."""
    mark = lp.mark()
    (root.path / "configs" / "touch.txt").write_text(str(time.time()))
    time.sleep(0.3)  # the watch has seen it
    assert not lp.find("pass", after=mark), lp.log()


def audit(root: Root) -> list[dict[str, Any]]:
    return root.cli("audit", "--json", env=ALONE).data["records"]


def same_answer(
    root: Root, client: Callable[..., tuple[CliResult, list[str]]], *args: str
) -> tuple[CliResult, CliResult]:
    """The command answered by the loop and stand-alone; a loop's pass in between (another container's event on a
    shared engine) may change what there is to say, so a difference is looked at again, twice at most."""
    for _ in range(3):
        via, modules = client(*args)
        assert not heavy(modules), (args, heavy(modules))
        alone = root.cli(*args, env=ALONE)
        if (via.rc, norm(via.stdout), norm(via.stderr)) == (alone.rc, norm(alone.stdout), norm(alone.stderr)):
            return via, alone
    assert norm(via.stdout) == norm(alone.stdout), f"{via}\n--- stand-alone:\n{alone}"
    assert (via.rc, norm(via.stderr)) == (alone.rc, norm(alone.stderr)), f"{via}\n--- stand-alone:\n{alone}"
    return via, alone


# ---------------------------------------------------------------- the same answers


def test_the_loop_answers_each_read_command_as_the_stand_alone_command_prints_it(
    root: Root, start_loop: Callable[..., LoopProcess], client: Callable[..., tuple[CliResult, list[str]]]
) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    lp = start_loop("--debounce", "30").started()
    lp.wait("action", kind="enter", result="ok", timeout=60)
    # A file the loop did not make, held by this process: shm status has an owner to show.
    held = root.shm / "vllm_offload_held.mmap"
    held.write_bytes(b"\0" * 4096)
    with held.open("rb"):
        for args in (
            ("plan",),
            ("plan", "--json"),
            ("status",),
            ("status", "--json"),
            ("shm", "status"),
            ("shm", "status", "--json"),
            ("audit",),
            ("audit", "--json"),
            ("audit", "--since", "1h"),
        ):
            via, _ = same_answer(root, client, *args)
            assert via.rc == 0, via
            if "--json" in args:
                assert "error" not in via.data, via
        status, _ = client("status", "--json")
        assert status.data["loop"]["pid"] == lp.proc.pid, status
        shm, _ = client("shm", "status", "--json")
        assert [(f["path"], f["state"], {o["pid"] for o in f["owners"]}) for f in shm.data["files"]] == [
            (str(held), "owned", {os.getpid()})
        ], shm
    # probe runs the recipe's probes against the running lane (each run is audited and kept as its suite's last).
    for args in (("probe", omni), ("probe", omni, "--json")):
        via, _ = same_answer(root, client, *args)
        assert via.rc == 0, via
    assert via.data["ok"] is True and via.data["passed"] == via.data["planned"] > 0, via
    probes = [r for r in audit(root) if r["action"] == "probe"]
    assert len(probes) >= 4 and {r["front"] for r in probes} == {"cli"}, probes
    # Errors are answered alike too: an unknown recipe, and files that do not validate.
    same_answer(root, client, "probe", "no-such-recipe")
    hold_off(root, lp)
    root.manifest_path.write_text("host: [\n")
    for args in (("plan", "--json"), ("status",), ("status", "--json")):
        via, _ = same_answer(root, client, *args)
        assert via.rc == 1, via
    assert lp.proc.poll() is None


# ---------------------------------------------------------------- what changes the host


def test_apply_and_shm_reclaim_are_carried_out_by_the_loop_that_holds_the_host(
    root: Root, start_loop: Callable[..., LoopProcess], client: Callable[..., tuple[CliResult, list[str]]]
) -> None:
    omni = root.recipe("omni")
    lp = start_loop("--debounce", "30").started()
    hold_off(root, lp)
    root.manifest((omni, [B]))
    alone = root.cli("apply", "--yes", "--json", env=ALONE)
    assert alone.rc == 1 and alone.data["error"]["code"] == "lock_held", alone
    mark = lp.mark()
    r, modules = client("apply", "--yes", "--json")
    assert r.rc == 0 and r.data["result"] == "converged", r
    assert [(a["kind"], a["result"]) for a in r.data["actions"]] == [("enter", "ok")], r
    assert not heavy(modules), heavy(modules)
    assert set(root.running()) == {root.cname(omni, B)}
    # Under the loop's pass lock, counted in its metrics like its own actions.
    lp.wait("api-exclusive", front="cli", after=mark, timeout=5)
    assert lp.metric("reconciler_actions_total", kind="enter", result="ok") == 1
    applied = [x for x in audit(root) if x["action"] == "apply" and x["front"] == "cli"]
    assert [x["outcome"] for x in applied] == ["refused", "converged"], applied  # the stand-alone one, then it
    # Text output, converged: the plan, then the one-line verdict.
    again = root.cli("apply", "--yes")
    assert again.rc == 0 and "converged in" in again.stdout and "matches its assignment" in again.stdout, again

    # A saved plan (written by the loop where the client asked, relative to its working directory), applied.
    hold_off(root, lp)
    root.manifest((omni, [A]))
    saved = subprocess.run(
        root.cli_args("plan", "--out", "saved.json"),
        cwd=root.path.parent,
        env=root.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert saved.returncode == 2 and (root.path.parent / "saved.json").exists(), saved
    r = root.cli("apply", str(root.path.parent / "saved.json"), "--json")
    assert r.rc == 0 and [a["kind"] for a in r.data["actions"]] == ["leave", "enter"], r
    assert set(root.running()) == {root.cname(omni, A)}

    # shm reclaim --confirm: the guard's two inspections, in the loop, counted in its metrics.
    stale = orphan(root, "vllm_offload_two.mmap")
    before = lp.metric("reconciler_reclaimed_bytes_total") or 0
    mark = lp.mark()
    r = root.cli("shm", "reclaim", "--confirm", "--json")
    lp.wait("api-exclusive-end", front="cli", after=mark, timeout=5)
    if r.data.get("refused"):
        # Another host's container with native offload runs on this shared engine: the guard reclaims nothing.
        assert r.rc == 1 and "native offload" in r.data["refused"] and stale.exists(), r
    else:
        assert r.rc == 0 and [f["path"] for f in r.data["reclaimed"]] == [str(stale)], r
        assert not stale.exists()
        assert (lp.metric("reconciler_reclaimed_bytes_total") or 0) - before == 1 << 20
    assert lp.proc.poll() is None


def _interactive(root: Root, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """The command line with a pseudo-terminal as its stdin (so apply asks), stdout and stderr piped."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        root.cli_args(*args), stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=root.env
    )
    os.close(follower)
    return proc, leader


def _read_until(proc: subprocess.Popen[bytes], text: bytes, timeout: float = 30) -> bytes:
    assert proc.stdout is not None
    got = b""
    deadline = time.monotonic() + timeout
    while text not in got:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, got
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, got
            got += chunk
    return got


def test_an_approval_given_after_a_change_is_refused_and_passes_go_on_while_the_prompt_waits(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    lp = start_loop("--debounce", "30").started()
    hold_off(root, lp)
    root.manifest((omni, [B]))
    proc, leader = _interactive(root, "apply")
    try:
        shown = _read_until(proc, b"Apply 1 action(s)? [y/N] ")
        assert f"enter   {omni} on {B}".encode() in shown, shown
        # While the prompt waits, the loop's pass lock is free: a confirmed reclaim, which takes it, runs now.
        mark = lp.mark()
        r = root.cli("shm", "reclaim", "--confirm", "--json", timeout=20)
        assert r.rc == 0 and r.data["confirmed"] is True, r
        lp.wait("api-exclusive-end", front="cli", after=mark, timeout=5)
        # The files change before the answer: the approval is of a plan made from other files.
        root.manifest_path.write_text(root.manifest_path.read_text() + "# edited while the prompt waited\n")
        os.write(leader, b"y\n")
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    assert proc.returncode == 1, err
    assert b"changed while the plan waited for approval; nothing was changed" in err, err
    assert b"manifests/demo.yaml edited" in err, err
    assert root.running() == {}, "nothing ran"
    # Asked again and approved with nothing changed: the plan shown is the plan run. (Another container with a GPU
    # or offload started or stopped on a shared engine meanwhile makes it stale too: asked again then.)
    for _ in range(3):
        proc, leader = _interactive(root, "apply")
        try:
            _read_until(proc, b"Apply 1 action(s)? [y/N] ")
            os.write(leader, b"y\n")
            out, err = proc.communicate(timeout=90)
        finally:
            os.close(leader)
        if not (proc.returncode == 1 and b"What changed:\n  containers:" in err):
            break
    assert proc.returncode == 0 and b"converged in" in out, (out, err)
    assert set(root.running()) == {root.cname(omni, B)}
    assert lp.proc.poll() is None


def test_ctrl_c_stops_an_apply_in_the_loop_at_a_safe_point(root: Root, start_loop: Callable[..., LoopProcess]) -> None:
    slow = root.recipe("omni", mode="start-delay=20", start_timeout_s=60)
    lp = start_loop("--debounce", "30").started()
    hold_off(root, lp)
    root.manifest((slow, [B]))
    proc = subprocess.Popen(
        root.cli_args("apply", "--yes"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=root.env
    )
    wait_until(lambda: root.running(), timeout=30, what="the enter's container")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 15, "stopped at the health wait, not after it"
    assert proc.returncode == 1, (out, err)
    assert b"SIGINT: finishing at the next safe point" in err and b"interrupted" in err, err
    assert lp.proc.poll() is None and lp.healthz()[0] in (200, 503)


def test_a_socket_left_by_a_killed_loop_is_passed_over(root: Root, start_loop: Callable[..., LoopProcess]) -> None:
    omni = root.recipe("omni")
    lp = start_loop("--debounce", "30").started()
    sock = root.lock_dir / f"reconciler-{root.host}.sock"
    assert sock.exists() and oct(sock.stat().st_mode & 0o777) == "0o600"
    lp.proc.kill()
    lp.proc.wait()
    assert sock.exists()
    root.manifest((omni, [B]))
    r = root.apply()
    assert r.rc == 0 and r.data["result"] == "converged", r
    assert root.cli("plan").rc == 0


# ---------------------------------------------------------------- planted


# A listener of uid 65534: answers anything with a forged plan, and says how many it answered.
LISTENER = r"""
import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path); os.chmod(path, 0o666); s.listen(4)
print("ready", flush=True)
n = 0
s.settimeout(1.0)
while not os.path.exists(path + ".done"):
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    n += 1
    c.sendall(b'{"out": "FORGED by nobody"}\n{"exit": 0}\n')
    c.close()
print("answered", n, flush=True)
"""


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="reconciler-control-", dir="/tmp"))
    d.chmod(0o755)
    mine = d / "nobody"
    mine.mkdir()
    os.chown(mine, 65534, 65534)
    try:
        yield mine
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_planted_socket_is_refused_and_nothing_is_sent_to_it(root: Root, nobody_dir: Path) -> None:
    root.manifest()
    attacker = Attacker()
    planted = nobody_dir / "l.sock"
    listener = attacker.popen(LISTENER, str(planted))
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        runtime = root.lock_dir
        runtime.mkdir(mode=0o700, exist_ok=True)
        target = runtime / f"reconciler-{root.host}.sock"
        # Root moved it there (a mistake, or a script tricked into it): still the other user's socket.
        os.rename(planted, target)
        for args in (("plan",), ("apply", "--yes", "--json")):
            r = root.cli(*args)
            assert r.rc == 1 and "FORGED" not in r.stdout + r.stderr, r
            no_traceback(r.stdout + r.stderr)
            assert f"{target}: it is owned by uid 65534" in r.stderr and f"rm {target}" in r.stderr, r
        # Owned by root and 0600 now, but the process listening on it is still the other user's.
        os.chown(target, 0, 0)
        target.chmod(0o600)
        r = root.cli("status")
        assert r.rc == 1 and "FORGED" not in r.stdout + r.stderr, r
        assert "of uid 65534 listens on it" in r.stderr, r
        target.unlink()
        # A runtime directory another user made holds no loop: the command runs stand-alone, and refuses that
        # directory where it uses it, as before.
        nobody_run = nobody_dir / "run"
        attacker.run("mkdir", "-m", "0700", str(nobody_run), check=True)
        listener2 = attacker.popen(LISTENER, str(nobody_run / f"reconciler-{root.host}.sock"))
        assert listener2.stdout is not None and listener2.stdout.readline().strip() == "ready"
        root.env["RECONCILER_LOCK_DIR"] = str(nobody_run)
        r = root.cli("shm", "status")
        assert r.rc == 0 and "FORGED" not in r.stdout, r
        r = root.cli("plan")
        assert r.rc == 1 and f"{nobody_dir} is owned by uid 65534" in r.stderr and "FORGED" not in r.stdout, r
        attacker.run("touch", str(nobody_run / f"reconciler-{root.host}.sock.done"), check=True)
        assert listener2.communicate(timeout=10)[0].strip() == "answered 0"
    finally:
        attacker.run("touch", str(planted) + ".done")
        attacker.run("touch", str(root.lock_dir / f"reconciler-{root.host}.sock.done"))
        listener.kill()
        listener.wait()


def test_the_loop_answers_no_client_of_another_user(
    root: Root, start_loop: Callable[..., LoopProcess], nobody_dir: Path
) -> None:
    runtime = nobody_dir.parent / "run"  # under a directory uid 65534 can pass through (pytest's own is 0700)
    root.env["RECONCILER_LOCK_DIR"] = str(runtime)
    lp = start_loop().started()
    sock = runtime / f"reconciler-{root.host}.sock"
    attacker = Attacker()
    # Opened up for this test only: without this, uid 65534 cannot even reach the socket (0700 directory, 0600 socket).
    denied = attacker.python(
        "import socket, sys\ntry:\n    socket.socket(socket.AF_UNIX).connect(sys.argv[1])\n"
        "except OSError as e:\n    print(e.errno)\n",
        str(sock),
    )
    assert denied.stdout.strip() == "13", denied
    runtime.chmod(0o711)
    sock.chmod(0o666)
    try:
        r = attacker.python(
            "import json, socket, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            # the loop may close on the peer before its request is sent: a reset or a broken pipe, no answer
            "try:\n"
            "    s.sendall(json.dumps({'argv': ['plan'], 'root': sys.argv[2]}).encode() + b'\\n')\n"
            "    print(repr(s.recv(65536)))\n"
            "except (ConnectionResetError, BrokenPipeError):\n    print(repr(b''))\n",
            str(sock),
            str(root.path),
        )
    finally:
        runtime.chmod(0o700)
        sock.chmod(0o600)
    assert r.stdout.strip() == "b''", r
    lp.wait("control-refused", uid=65534, timeout=5)
    assert lp.proc.poll() is None
    assert root.cli("plan").rc == 0


# ---------------------------------------------------------------- who did it


def test_the_audit_trail_names_the_user_of_each_command_line_action(
    root: Root, start_loop: Callable[..., LoopProcess]
) -> None:
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    root.manifest()
    lp = start_loop("--debounce", "30").started()
    for sudo in ("alice", ""):
        mark = lp.mark()
        r = root.cli("shm", "reclaim", "--confirm", "--json", env={"SUDO_USER": sudo})
        assert r.rc == 0 and r.data["confirmed"] is True, r
        lp.wait("api-exclusive-end", front="cli", after=mark, timeout=5)  # carried out by the loop
    alone = root.cli("apply", "--yes", "--json", env={**ALONE, "SUDO_USER": "bob"})
    assert alone.rc == 1 and alone.data["error"]["code"] == "lock_held", alone
    recs = [x for x in audit(root) if x["front"] == "cli"]
    assert [(x["action"], x["outcome"], x["who"], x["uid"], x.get("sudo_user")) for x in recs] == [
        ("shm-reclaim", "ok", f"{me} (sudo from alice)", os.getuid(), "alice"),
        ("shm-reclaim", "ok", me, os.getuid(), None),
        ("apply", "refused", f"{me} (sudo from bob)", os.getuid(), "bob"),
    ], recs
    table = root.cli("audit", env=ALONE)
    assert f"cli ({me} (sudo from alice))" in table.stdout, table


# Never loaded by a stand-alone plan, status or converged apply: the lanes' HTTP client (the first request to a lane
# loads it) and the front-ends' servers. (``email`` and ``importlib.resources`` are loaded all the same: pydantic's
# plugin loader imports importlib.metadata, which imports both.)
STAND_ALONE_HEAVY = (
    "urllib.request",
    "http.client",
    "docker",
    "requests",
    "starlette",
    "uvicorn",
    "mcp",
    "prometheus_client",
    "watchdog",
)


def test_a_stand_alone_plan_and_apply_load_no_client_they_do_not_use(
    root: Root, client: Callable[..., tuple[CliResult, list[str]]]
) -> None:
    """The start-up budget of the commands people wait on (docs/performance.md): a stand-alone ``plan --json`` and a
    converged ``apply --yes`` of a host whose lane has no sleep mode ask no lane anything, so they load no HTTP client
    of the lanes' and nothing of the servers. (``status`` reads each lane's gauges: it loads both.)"""
    root.manifest((root.recipe("omni"), [B]))
    assert root.apply().rc == 0
    for args in (("plan", "--json"), ("apply", "--yes", "--json")):
        r, modules = client(*args, env=ALONE)
        assert r.rc == 0, r
        bad = [m for m in modules if any(m == h or m.startswith(h + ".") for h in STAND_ALONE_HEAVY)]
        assert not bad, (args, bad)
