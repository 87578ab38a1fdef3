"""The command line against what answers on the control socket, for real: a planted fake loop (a Unix socket
server of this test, root's and 0600 where the command line looks for the loop, so every check of the socket
passes) answers garbage, cut-off frames or nothing, and a real ``reconciler`` process is run against it; and a real
``reconciler run`` is flooded with silent connections.

- A garbled, cut-off or out-of-range first answer (``{"exit": "x"}``, ``null``, ``1e999``, ``256``, ``-1``,
  ``true``, bytes that are not JSON, a frame cut short) never gives a traceback or a wrong exit code: a read-only
  command says so in one line on stderr and runs stand-alone (its own exit code and output); a destructive one
  (``apply``, ``shm reclaim --confirm``, ``adopt``), whose request may have reached a loop, fails (exit 1), names
  why, and is never run a second time stand-alone.
- Garbage after the loop took the command (its output begun) is an error, exit 1, for every command.
- A loop that takes the request and then says nothing: a read-only command runs stand-alone after the deadline,
  a destructive one fails; neither hangs.
- 40 silent connections of root to a real loop, from one process or from ten, make no command hang: the loop keeps
  slots for others (a bound per peer), refuses past its bound in all at once (the command runs stand-alone, saying
  so), and drops a connection that sends no request within its deadline.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import CliResult, LoopProcess, Root, wait_until

from attack.helpers import no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]

ALONE = {"RECONCILER_NO_LOOP": "1"}
FALLBACK = "running it stand-alone"
ACK_DEADLINE_S = 10  # reconciler.control: how long the command line waits for the loop to take a request


class FakeLoop:
    """Listens where the command line looks for the running loop: ``answer`` (bytes) to each request, then the
    connection closed; with ``answer=None`` the request is read and nothing is ever said."""

    def __init__(self, root: Root, answer: bytes | None):
        self.answer = answer
        self.requests: list[Any] = []
        self.held: list[socket.socket] = []
        d = root.lock_dir
        d.mkdir(mode=0o700, exist_ok=True)
        self.path = d / f"reconciler-{root.host}.sock"
        fd = os.open(d, os.O_PATH | os.O_DIRECTORY)
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(f"/proc/self/fd/{fd}/{self.path.name}")
        finally:
            os.close(fd)
        self.path.chmod(0o600)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            line = b""
            with contextlib.suppress(OSError):
                while not line.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    line += chunk
            try:
                self.requests.append(json.loads(line))
            except ValueError:
                self.requests.append(line)
            if self.answer is None:
                self.held.append(conn)
                continue
            with contextlib.suppress(OSError):
                conn.sendall(self.answer)
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@pytest.fixture
def fake_loop(root: Root) -> Iterator[Callable[[bytes | None], FakeLoop]]:
    made: list[FakeLoop] = []

    def make(answer: bytes | None) -> FakeLoop:
        for f in made:
            f.close()
        made.append(FakeLoop(root, answer))
        return made[-1]

    try:
        yield make
    finally:
        for f in made:
            f.close()


# First answers no loop of this version sends: each is garbled, cut off or out of range.
GARBAGE = {
    "exit as a string": b'{"exit": "x"}\n',
    "null": b"null\n",
    "1e999": b"1e999\n",
    "exit 256": b'{"exit": 256}\n',
    "exit -1": b'{"exit": -1}\n',
    "exit true": b'{"exit": true}\n',
    "exit 1e999": b'{"exit": 1e999}\n',
    "exit NaN": b'{"exit": NaN}\n',
    "not JSON": b"\x00\xff{{{ not json\n",
    "deep nesting": b"[" * 100_000 + b"\n",
    "output before an exit of 256": b'{"out": 6}\nFORGED{"exit": 256}\n',
    "a frame cut short": b'{"out": 1000}\nonly a few bytes',
    "a line cut short": b'{"exi',
    "a frame of negative size": b'{"out": -5}\n',
    "closed without a word": b"",
}


def stderr_lines(r: CliResult) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.strip()]


def test_a_garbled_first_answer_makes_a_read_only_command_run_stand_alone_saying_so(
    root: Root, fake_loop: Callable[[bytes | None], FakeLoop]
) -> None:
    root.manifest()
    alone = root.cli("plan", env=ALONE)
    assert alone.rc == 0, alone
    for what, answer in GARBAGE.items():
        fake = fake_loop(answer)
        r = root.cli("plan")
        no_traceback(r.stdout + r.stderr)
        assert (r.rc, r.stdout) == (alone.rc, alone.stdout), (what, r)
        assert "FORGED" not in r.stdout + r.stderr, (what, r)
        notes = stderr_lines(r)
        assert len(notes) == 1 and FALLBACK in notes[0] and str(fake.path) in notes[0], (what, r)
        assert len(fake.requests) == 1, (what, fake.requests)
    # Busy, with a reason that would drive the terminal: said, escaped.
    fake_loop(b'{"busy": "\\u001b[2J\\u009b31m wiped"}\n')
    r = root.cli("plan")
    assert (r.rc, r.stdout) == (alone.rc, alone.stdout), r
    assert "is busy (\\x1b[2J\\x9b31m wiped)" in r.stderr and "\x1b" not in r.stderr and "\x9b" not in r.stderr, r


def test_a_garbled_first_answer_fails_a_destructive_command_and_it_is_never_run_twice(
    root: Root, fake_loop: Callable[[bytes | None], FakeLoop]
) -> None:
    root.manifest()
    stale = root.shm / "vllm_offload_stale.mmap"
    stale.write_bytes(b"\0" * 4096)
    before = root.cli("audit", "--json", env=ALONE).data["records"]
    for what in ("exit as a string", "null", "exit 256", "not JSON", "a frame cut short", "closed without a word"):
        for args in (("shm", "reclaim", "--confirm"), ("apply", "--yes"), ("adopt", "some-container")):
            fake = fake_loop(GARBAGE[what])
            r = root.cli(*args)
            no_traceback(r.stdout + r.stderr)
            assert r.rc == 1, (what, args, r)
            assert FALLBACK not in r.stderr and "error: " in r.stderr and str(fake.path) in r.stderr, (what, r)
            assert "not run stand-alone" in r.stderr and "reconciler audit" in r.stderr, (what, r)
            assert len(fake.requests) == 1, (what, fake.requests)
    assert stale.exists(), "shm reclaim --confirm ran stand-alone"
    assert root.cli("audit", "--json", env=ALONE).data["records"] == before, "a destructive command ran stand-alone"
    # --json: the error on stdout too.
    fake_loop(GARBAGE["exit 256"])
    r = root.cli("apply", "--yes", "--json")
    assert r.rc == 1 and r.data["error"]["code"] == "loop_unclear", r


def test_garbage_after_the_loop_took_the_command_is_an_error_never_a_wrong_exit_code(
    root: Root, fake_loop: Callable[[bytes | None], FakeLoop]
) -> None:
    root.manifest()
    taken = b'{"accepted": true}\n{"out": 6}\nshown\n'
    for what, tail in (
        ("exit 256", b'{"exit": 256}\n'),
        ("exit as a string", b'{"exit": "x"}\n'),
        ("exit null", b'{"exit": null}\n'),
        ("an unknown frame", b'{"launch": "missiles"}\n'),
        ("a prompt that is no string", b'{"ask": 5}\n'),
        ("a frame cut short", b'{"err": 100}\nabc'),
        ("closed", b""),
    ):
        for args in (("plan",), ("apply", "--yes")):
            fake_loop(taken + tail)
            r = root.cli(*args)
            no_traceback(r.stdout + r.stderr)
            assert r.rc == 1 and r.stdout == "shown\n", (what, args, r)
            assert "error: " in r.stderr and FALLBACK not in r.stderr, (what, args, r)
            if args[0] == "apply":  # it may have run: never "run it again" without looking
                assert "not run stand-alone" in r.stderr and "reconciler audit" in r.stderr, (what, r)


def test_a_loop_that_takes_the_request_and_says_nothing_makes_no_command_hang(
    root: Root, fake_loop: Callable[[bytes | None], FakeLoop]
) -> None:
    root.manifest()
    alone = root.cli("plan", env=ALONE)
    fake = fake_loop(None)
    t0 = time.monotonic()
    r = root.cli("plan", timeout=60)
    assert time.monotonic() - t0 < ACK_DEADLINE_S + 15, r
    no_traceback(r.stderr)
    assert (r.rc, r.stdout) == (alone.rc, alone.stdout), r
    notes = stderr_lines(r)
    assert len(notes) == 1 and FALLBACK in notes[0] and f"within {ACK_DEADLINE_S} s" in notes[0], r
    stale = root.shm / "vllm_offload_stale.mmap"
    stale.write_bytes(b"\0" * 4096)
    t0 = time.monotonic()
    r = root.cli("shm", "reclaim", "--confirm", timeout=60)
    assert time.monotonic() - t0 < ACK_DEADLINE_S + 15, r
    no_traceback(r.stderr)
    assert r.rc == 1 and "not run stand-alone" in r.stderr and stale.exists(), r
    assert len(fake.requests) == 2
    # Ctrl-C while it waits: interrupted, as stand-alone (exit 130), never a traceback.
    proc = subprocess.Popen(root.cli_args("plan"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=root.env)
    wait_until(lambda: len(fake.requests) == 3, timeout=20, what="the request")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and err.decode().strip() == "interrupted", err


# ---------------------------------------------------------------- silent clients of a real loop

# Opens N connections to the socket and holds them, saying nothing, until killed.
SILENT = r"""
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    for _ in range(100):  # a full backlog refuses a connect at once: again, until the listener took the others
        try:
            s.connect(sys.argv[1])
            break
        except BlockingIOError:
            time.sleep(0.05)
    held.append(s)
print("holding", flush=True)
time.sleep(600)
"""


def silent(path: Path, n: int, *, procs: int = 1) -> list[subprocess.Popen[str]]:
    """``procs`` processes holding ``n`` silent connections each, started at once."""
    d = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        started = [
            subprocess.Popen(
                [sys.executable, "-c", SILENT, f"/proc/self/fd/{d}/{path.name}", str(n)],
                stdout=subprocess.PIPE,
                text=True,
                pass_fds=(d,),
            )
            for _ in range(procs)
        ]
    finally:
        os.close(d)
    for p in started:
        assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    return started


def test_forty_silent_connections_make_no_command_hang(root: Root, start_loop: Callable[..., LoopProcess]) -> None:
    root.manifest()
    lp = start_loop("--debounce", "30").started()
    sock = root.lock_dir / f"reconciler-{root.host}.sock"
    procs: list[subprocess.Popen[str]] = []
    try:
        # One process, 40 connections: it holds its own few slots, the others stay free and the loop answers.
        procs.extend(silent(sock, 40))
        r = root.cli("status", timeout=30)
        assert r.rc == 0 and FALLBACK not in r.stderr, r
        r = root.cli("shm", "reclaim", "--confirm", "--json", timeout=30)
        # Carried out by the loop: stand-alone, it would meet the host lock the loop holds.
        assert r.rc == 0 and r.data["confirmed"] is True and FALLBACK not in r.stderr, r
        lp.wait("control-busy", timeout=10)
        procs.pop().kill()
        # Ten processes of four: past the bound in all, a command is refused at once and runs stand-alone (an
        # apply then meets the host lock the loop holds: refused, nothing run twice).
        procs.extend(silent(sock, 4, procs=10))
        t0 = time.monotonic()
        status, apply = (
            subprocess.Popen(root.cli_args(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=root.env)
            for args in (("status",), ("apply", "--yes", "--json"))
        )
        out, err = status.communicate(timeout=30)
        assert status.returncode == 0 and FALLBACK.encode() in err and b"busy" in err, (out, err)
        out, err = apply.communicate(timeout=30)
        assert apply.returncode == 1 and json.loads(out)["error"]["code"] == "lock_held", (out, err)
        assert time.monotonic() - t0 < 20
        # The loop drops those that sent no request within its deadline: it answers again, the flood still held.
        lp.wait("control-silent", timeout=20)
        wait_until(
            lambda: root.cli("shm", "reclaim", "--confirm", timeout=30).rc == 0,
            timeout=20,
            what="the loop answers again",
        )
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert lp.proc.poll() is None


# ---------------------------------------------------------------- files named by the command, where the caller lives


def test_plan_out_and_apply_file_are_the_callers_files_also_when_the_loop_has_a_private_tmp(
    root: Root, start_loop: Callable[..., LoopProcess], tmp_path: Path
) -> None:
    # The loop sees its own tmpfs on this directory (a unit with PrivateTmp), the command line the real one.
    private = tmp_path / "tmp"
    private.mkdir()
    loop_root = copy.copy(root)
    plain = root.cli_args

    def in_own_namespace(*args: str) -> list[str]:
        mount = 'mount -t tmpfs -o size=1m,mode=1777 tmpfs "$0" && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(private), *plain(*args)]

    loop_root.cli_args = in_own_namespace  # type: ignore[method-assign]
    root.manifest()
    lp = start_loop("--debounce", "30", r=loop_root).started()
    loops_view = Path(f"/proc/{lp.proc.pid}/root") / str(private).lstrip("/")
    assert loops_view.is_dir() and not (private / "marker").exists()
    (loops_view / "marker").write_text("the loop's own /tmp")
    assert not (private / "marker").exists(), "the loop runs in a mount namespace of its own"

    saved = private / "p.plan"
    r = root.cli("plan", "--out", str(saved))
    assert r.rc == 0 and f"plan saved to {saved}" in r.stderr and FALLBACK not in r.stderr, r
    st = saved.stat()
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (os.getuid(), "0o600"), st
    assert json.loads(saved.read_text())["host"] == root.host
    assert not (loops_view / "p.plan").exists(), "written where the loop lives, not where the caller does"
    # The loop's /tmp holds another plan under the same name: what is applied is the caller's.
    doc = json.loads(saved.read_text())
    (loops_view / "p.plan").write_text(json.dumps({**doc, "host": "some-other-host"}))
    r = root.cli("apply", str(saved), "--json")
    assert r.rc == 0 and r.data["result"] == "converged", r
    lp.wait("api-exclusive", front="cli", timeout=5)  # carried out by the loop
    # A relative name is the caller's working directory's.
    rel = subprocess.run(
        root.cli_args("plan", "--out", "rel.plan"),
        cwd=private,
        env=root.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert rel.returncode == 0 and "plan saved to rel.plan;" in rel.stderr, rel
    assert (private / "rel.plan").exists() and not (loops_view / "rel.plan").exists()
    missing = root.cli("apply", str(private / "nothing.plan"))
    assert missing.rc == 1 and f"{private / 'nothing.plan'}: no such plan file" in missing.stderr, missing
    assert lp.proc.poll() is None
