"""A local user takes the loop's own port, for real: uid 65534 binds the loop's ``--metrics-addr`` while the loop is
down (an HTTP server answering like the loop: ``/healthz`` "converged", ``/v1/status`` a converged host) and records
every request's headers. A real ``reconciler run`` starts meanwhile on the real engine: it stays up, reconciles a
manifest edit, and says the listener is not bound and who holds it (its log, systemd's STATUS, ``status`` as text and
JSON); ``fleet status`` and the canary check of ``source.after`` refuse to send the token there, saying why; no
token ever reaches the squatter; and once it exits the loop binds within its backoff, after which the same client
proves the listener the loop's and is answered.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import LoopProcess, Root, free_port, http_get, stop_process, wait_until

from attack.helpers import Attacker, no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"
TOKEN = "squat-test-token-" + "k" * 24

# The squatter: answers like a converged loop and appends each request's line and headers to the record (flushed).
SQUATTER = r"""
import http.server, json, sys
port, record, host = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        with open(record, "a") as fh:
            fh.write(json.dumps({"line": self.requestline, "headers": dict(self.headers)}) + "\n")
        doc = {"ok": True, "verdict": "converged"} if self.path == "/healthz" else {
            "host": host, "converged": True, "plan": {}, "slots": {}, "source": {}}
        body = json.dumps(doc).encode()
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


def _fleet(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "fleet", "status", "--fleet", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _notes(sock: socket.socket, got: list[str]) -> list[str]:
    """The sd_notify messages received so far."""
    while True:
        try:
            got.append(sock.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            return got


def test_a_port_taken_by_another_user_never_ends_the_loop_and_never_gets_a_token(
    root: Root, attacker: Attacker, public: Path, scratch: Path, tmp_path: Path, loops: list[LoopProcess]
) -> None:
    from reconciler.load.source_sync import _canaries
    from reconciler.model.source import SourceConfig

    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    port = free_port()
    addr = f"127.0.0.1:{port}"
    record = public / "received"
    squatter = attacker.popen(SQUATTER, str(port), str(record), root.host)
    assert squatter.stdout is not None
    assert squatter.stdout.readline().strip() == "listening"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(scratch / "notify.sock"))
    notify.setblocking(False)
    root.env.update(NOTIFY_SOCKET=str(scratch / "notify.sock"))
    notes: list[str] = []
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        yaml.safe_dump({"hosts": [{"name": root.host, "url": f"http://{addr}", "token_file": str(token_file)}]})
    )
    try:
        lp = LoopProcess(root, "--metrics-addr", addr, "--api-token-file", str(token_file))
        loops.append(lp)
        # The loop starts, says who holds its address, and goes on reconciling (main: "cannot start", exit 1).
        lp.wait("http-listener-unbound", timeout=30, holder=lambda h: f"pid {squatter.pid} (python3" in h)
        lp.started()
        assert lp.proc.poll() is None, lp.log()
        unbound = wait_until(
            lambda: [n for n in _notes(notify, notes) if n.startswith("STATUS=listener") and "not bound" in n],
            timeout=10,
            what="systemd's STATUS saying the listener is not bound",
        )
        assert f"pid {squatter.pid}" in unbound[-1] and "nobody" in unbound[-1], unbound

        # status says so, as JSON and as text
        st = root.cli("status", "--json")
        listener = st.data["loop"]["listener"]
        assert listener["bound"] is False and listener["addr"] == addr, listener
        assert "in use" in listener["error"] and f"pid {squatter.pid}" in listener["holder"], listener
        text = root.cli("status")
        assert f"listener {addr} NOT BOUND" in text.stdout and f"pid {squatter.pid}" in text.stdout, text

        # A manifest edit is converged meanwhile.
        omni = root.recipe("omni")
        mark = lp.mark()
        root.manifest((omni, [B]))
        lp.wait("action", kind="enter", result="ok", after=mark, timeout=90)
        lp.wait("pass", result="converged", after=mark, timeout=60)
        assert root.cname(omni, B) in root.running()

        # fleet status and the canary check refuse to send the token to the squatter, and say why.
        r = _fleet(fleet_file)
        no_traceback(r.stdout + r.stderr)
        assert r.returncode == 1, r
        (row,) = json.loads(r.stdout)["hosts"]
        assert row["reachable"] is False and row["verdict"] == "unreachable", row
        assert f"the token was not sent to http://{addr}" in row["error"], row
        assert f"pid {squatter.pid} (python3, uid 65534 (nobody))" in row["error"], row
        assert "another user took the loop's port" in row["error"], row
        source = SourceConfig(git="https://git.example.com/fleet.git", after=[root.host], fleet=str(fleet_file))
        converged, waiting, failed = _canaries(source, "a" * 40)
        assert not converged and failed is None, waiting
        assert "the token was not sent" in waiting[root.host] and "nobody" in waiting[root.host], waiting
        received = record.read_text() if record.exists() else ""
        assert TOKEN not in received and received == "", f"the squatter was asked: {received}"
    finally:
        stop_process(squatter)
    gone_at = time.time()

    # Once the squatter is gone, the loop binds within its backoff, and the client proves it the loop's.
    last = [e for e in lp.find("http-listener-unbound") if e.at <= gone_at][-1]
    bound = lp.wait("http-listener-bound", timeout=40)[0]
    assert bound.at - gone_at <= float(last["retry_in_s"]) + 3, (bound.data, last.data)
    assert http_get(f"http://{addr}/healthz")[0] == 200
    assert root.cli("status", "--json").data["loop"]["listener"]["bound"] is True
    wait_until(
        lambda: any(n == f"STATUS=listener {addr} serving" for n in _notes(notify, notes)),
        timeout=10,
        what="systemd's STATUS saying the listener serves",
    )
    r = _fleet(fleet_file)
    (row,) = json.loads(r.stdout)["hosts"]
    # Answered by the loop itself (its verdict is whatever its last look found: this machine's /proc may churn).
    assert r.returncode == 0 and row["reachable"] and row["host"] == root.host and not row["error"], r.stdout
    assert TOKEN not in (record.read_text() if record.exists() else "")
    assert lp.proc.poll() is None and not lp.find("exit"), lp.log()
    notify.close()


def test_fleet_status_and_the_canary_check_send_no_token_to_a_listener_not_proven_the_loops(
    attacker: Attacker, public: Path, tmp_path: Path
) -> None:
    """No loop at all: a listener of uid 65534, and one of root's that holds no lock file of the host, each on
    loopback. Neither is sent a request; each refusal says why (main sent both the token)."""
    from reconciler.load.source_sync import _canaries
    from reconciler.model.source import SourceConfig

    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    record = public / "received"
    port = free_port()
    squatter = attacker.popen(SQUATTER, str(port), str(record), "gpu-box")
    assert squatter.stdout is not None and squatter.stdout.readline().strip() == "listening"
    own_port = free_port()
    root_owned = subprocess.Popen(
        ["/usr/bin/python3", "-c", SQUATTER, str(own_port), str(record), "gpu-box"], stdout=subprocess.PIPE, text=True
    )
    assert root_owned.stdout is not None and root_owned.stdout.readline().strip() == "listening"
    fleet_file = tmp_path / "fleet.yaml"
    try:
        for url, says in (
            (f"http://127.0.0.1:{port}", f"pid {squatter.pid} (python3, uid 65534 (nobody))"),
            (f"http://localhost:{own_port}", "which holds no lock file of host 'gpu-box'"),
        ):
            fleet_file.write_text(
                yaml.safe_dump({"hosts": [{"name": "gpu-box", "url": url, "token_file": str(token_file)}]})
            )
            r = _fleet(fleet_file)
            no_traceback(r.stdout + r.stderr)
            (row,) = json.loads(r.stdout)["hosts"]
            assert r.returncode == 1 and row["reachable"] is False, row
            assert f"the token was not sent to {url}" in row["error"] and says in row["error"], row
            source = SourceConfig(git="https://git.example.com/fleet.git", after=["gpu-box"], fleet=str(fleet_file))
            converged, waiting, _ = _canaries(source, "a" * 40)
            assert not converged and "the token was not sent" in waiting["gpu-box"] and says in waiting["gpu-box"]
    finally:
        stop_process(squatter)
        stop_process(root_owned)
    received = record.read_text() if record.exists() else ""
    assert received == "" and TOKEN not in received, f"a listener not proven the loop's was asked: {received}"
