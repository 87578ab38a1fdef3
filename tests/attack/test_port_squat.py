"""A local user squats a lane's port, for real: uid 65534 binds the lane's health port on the host's network (an HTTP
server that answers 200 to everything and records every request it gets), once before the enter and once between
its preflight and the engine's server listening (the stand-in's start delayed: vLLM's API server listens only once
its engine is up). A real ``reconciler apply`` on the real engine fails the enter naming the squatter (its pid and
user, read from /proc/net/tcp and /proc/PID/fd, never asked), and no request, health check or probe, reaches it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from e2e_helpers import Root, stop_process, wait_until

from attack.helpers import Attacker, no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"

# The squatter: answers every GET and POST with 200 and an empty JSON object, and appends each request line to
# the record file (flushed at once), so anything that reached it is seen.
SQUATTER = r"""
import http.server, sys
port, record = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        with open(record, "a") as fh:
            fh.write(self.requestline + "\n")
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
print("listening", flush=True)
srv.serve_forever()
"""


def squat(attacker: Attacker, port: int, record: Path) -> subprocess.Popen[str]:
    proc = attacker.popen(SQUATTER, str(port), str(record))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "listening", proc.stderr.read() if proc.stderr else line
    return proc


def failed_enter(res: object, data: dict) -> dict:  # type: ignore[type-arg]
    assert data["result"] == "failed", res
    [enter] = [a for a in data["actions"] if a["kind"] == "enter"]
    assert enter["result"] == "failed", enter
    return enter  # type: ignore[no-any-return]


def test_a_port_squatted_before_the_enter_fails_its_preflight_naming_the_squatter(
    root: Root, attacker: Attacker, public: Path
) -> None:
    omni = root.recipe("omni")
    port = root.port_of(omni)
    root.manifest((omni, [B]))
    record = public / "received"
    proc = squat(attacker, port, record)
    try:
        res = root.apply()
    finally:
        stop_process(proc)
    # The plan already sees the squatter (a knowable failure of the enter): blocked, naming it, nothing created;
    # the enter's own preflight (tests/real/test_health_probe.py) names it the same way should it appear later.
    assert res.rc == 3 and res.data["result"] == "blocked" and res.data["actions"] == [], res
    no_traceback(res.stdout + res.stderr)
    reasons = " | ".join(b["reason"] for b in res.data["final"]["blockers"] or res.data["plan"]["blockers"])
    assert f"port {port}" in reasons and f"pid {proc.pid}" in reasons, reasons
    assert root.containers() == [], "refused before create"
    assert not record.exists() or record.read_text() == "", f"the squatter was asked: {record.read_text()}"


def test_a_port_squatted_while_the_engine_starts_fails_the_enter_and_no_probe_reaches_the_squatter(
    root: Root, attacker: Attacker, public: Path
) -> None:
    omni = root.recipe("omni", start_timeout_s=30)
    port = root.port_of(omni)
    # vLLM's API server listens only once its engine is up: the stand-in's start waits 8 s before it binds.
    data = root.recipe_data(omni)
    data["container"]["command"] = ["sh", "-c", "sleep 8; exec " + shlex.join(data["container"]["command"])]
    root.write_recipe(omni, data)
    root.manifest((omni, [B]))
    record = public / "received"
    apply = subprocess.Popen(
        root.cli_args("apply", "--yes", "--json"),
        env=root.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc = None
    try:
        # After the preflight, while the engine is up but its server does not listen yet: the squatter binds.
        wait_until(lambda: root.cname(omni, B) in root.running(), timeout=30, what="the lane's container running")
        proc = squat(attacker, port, record)
        out, err = apply.communicate(timeout=90)
    finally:
        if apply.poll() is None:
            apply.kill()
        if proc is not None:
            stop_process(proc)
    assert apply.returncode == 1, (out, err)
    no_traceback(out + err)
    enter = failed_enter(out, json.loads(out))
    detail = enter["detail"]
    assert proc is not None
    assert f"port {port} (health.url)" in detail and "not by a process of the container" in detail, enter
    assert f"pid {proc.pid} (python3, uid 65534 (nobody)) listening on 127.0.0.1:{port}" in detail, enter
    assert "healthy" not in detail.split("failed:")[0], enter
    time.sleep(0.5)
    assert not record.exists() or record.read_text() == "", f"the squatter was asked: {record.read_text()}"
    assert not root.running(), "the failed lane was stopped"
