"""What the attack tests share: an unprivileged user (uid 65534, ``nobody``, through ``setpriv``) who runs the
system's Python (the project's virtual environment lies under /root, out of its reach), and the content of a
root-only file that no attack may change. The fixtures are in conftest.py beside this file.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

NOBODY = 65534
PYTHON = "/usr/bin/python3"  # the attacker's: stdlib only
PRECIOUS = "root's own data, never to be truncated or overwritten\n"


@dataclass(frozen=True)
class Attacker:
    """Runs commands as uid/gid 65534 with no supplementary groups."""

    def run(
        self,
        *argv: str,
        timeout: float = 60,
        check: bool = False,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *argv]
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            input=input,
            env=env or {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )

    def python(
        self, code: str, *args: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.run(PYTHON, "-c", code, *args, timeout=timeout, check=check)

    def popen(self, code: str, *args: str) -> subprocess.Popen[str]:
        return as_user(NOBODY, code, *args)


def as_user(uid: int, code: str, *args: str) -> subprocess.Popen[str]:
    """The system's Python running ``code`` as ``uid`` (no groups), its stdin and stdout piped."""
    cmd = ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", PYTHON, "-c", code, *args]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


# Forks a child every PERIOD seconds, each sleeping LIFE seconds, for at most TOTAL seconds, then stops by itself.
# The kernel reaps the children (SIGCHLD ignored), as make reaps its own. Its own session, so the teardown ends the
# whole group.
STORM = """
import os, signal, sys, time
period, life, total = (float(a) for a in sys.argv[1:4])
os.setsid()
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
print("ready", flush=True)
end = time.monotonic() + total
due = time.monotonic()
while time.monotonic() < end:
    if os.fork() == 0:
        time.sleep(life)
        os._exit(0)
    due += period
    time.sleep(max(0.0, due - time.monotonic()))
"""

# A process that maps the file (and keeps it mapped, its descriptor closed) until stdin closes.
HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 0)
os.close(fd)
print("mapped", flush=True)
sys.stdin.read()
"""
