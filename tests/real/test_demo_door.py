"""The demo's front-door step (examples/demo/run.sh, step 13) on a root of its own: sleeping lanes on standby as
examples/demo/sleeping has them (the split, chat-a and chat-b, and the TP=2 lane tp2), the alias ``chat`` for chat-a,
``reconciler door`` as its own process, and the demo's client (examples/demo/door-client.py) asking ``chat`` through
the door while the host switches to the exclusive topology and back with ``reconciler switch --wait``: every request
is answered whole, across the two switches the client saw itself, and the client's exit code says so. A client whose
requests fail exits non-zero (the demo then fails), and the sleeping lanes' manifest carries the alias the client
asks for.

The demo itself runs on fixed names and ports (the host ``demo``, 9466); this runs the same pieces on the test's own
host, ports and tmpfs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, Root, free_port, stop_process, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.root]

CLIENT = REPO / "examples" / "demo" / "door-client.py"
A, B = "dark-compute-a", "dark-compute-b"


def _models(url: str) -> dict[str, str]:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
            data = json.loads(r.read())["data"]
    except (OSError, ValueError, KeyError):
        return {}
    return {m["id"]: m["reconciler"]["state"] for m in data}


def _client(url: str, model: str, stop: Path, *extra: str) -> subprocess.Popen[str]:
    args = [sys.executable, str(CLIENT), "--base-url", url + "/v1", "--model", model, "--until", str(stop), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str], stop: Path) -> tuple[int, str]:
    stop.touch()
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def test_the_demo_client_asks_one_alias_through_two_switches_and_sees_no_error(root: Root, tmp_path: Path) -> None:
    ca, cb = root.sleeping_recipe("chat-a"), root.sleeping_recipe("chat-b")
    big = root.sleeping_recipe("tp2", tp=2)
    root.write_manifest_text(
        f"host: {root.host}\ntopology: split\nstandby: [split, exclusive]\ntopologies:\n"
        f"  split:\n    - {{recipe: {ca}, gpus: [{A}]}}\n    - {{recipe: {cb}, gpus: [{B}]}}\n"
        f"  exclusive:\n    - {{recipe: {big}, gpus: [{A}, {B}]}}\n"
        f"aliases:\n  chat: {ca}\n"
    )
    up = root.apply()
    assert up.rc == 0, up.stdout + up.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    door = subprocess.Popen(
        root.cli_args("door", "--listen", f"127.0.0.1:{port}"),
        env=root.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: _models(url).get("chat") == "serving", timeout=30, what="the door serves chat")
        stop = tmp_path / "client-stop"
        client = _client(url, "chat", stop, "--min-switches", "2")
        try:
            time.sleep(1.5)
            to = root.cli("switch", "exclusive", "--wait")
            assert to.rc == 0, to.stdout + to.stderr
            wait_until(lambda: _models(url).get("chat") == "asleep", timeout=10, what="chat asleep at the door")
            time.sleep(1.5)  # the client's request for chat is held meanwhile
            back = root.cli("switch", "split", "--wait")
            assert back.rc == 0, back.stdout + back.stderr
            wait_until(lambda: _models(url).get("chat") == "serving", timeout=10, what="chat serving again")
            time.sleep(1.0)
        finally:
            rc, out = _finish(client, stop)
        print(out)  # what the demo prints (pytest -s shows it)
        m = re.search(r"^door client: (\d+) requests, 0 errors across (\d+) switches", out, re.M)
        assert rc == 0 and m, out
        assert int(m.group(1)) >= 3 and int(m.group(2)) == 2, out
        assert "failed" not in out, out

        # What the demo relies on to fail: a client that meets an error exits non-zero and says why.
        stop2 = tmp_path / "client-stop-2"
        bad = _client(url, "no-such-alias", stop2)
        time.sleep(1.0)
        rc, out = _finish(bad, stop2)
        assert rc == 1, out
        assert "failed: HTTP 404" in out and re.search(r"requests, [1-9]\d* errors", out), out
    finally:
        stop_process(door)
        log = door.stdout.read() if door.stdout else ""
        assert "Traceback" not in log, log


def _doc(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_the_demo_manifest_names_the_alias_its_client_asks_for() -> None:
    demo = REPO / "examples" / "demo"
    assert _doc(demo / "sleeping" / "demo.yaml")["aliases"] == {"chat": "chat-a"}
    run = (demo / "run.sh").read_text()
    assert "door-client.py" in run and "--model chat" in run and "--min-switches 2" in run
    # The teardown stops a door the demo left, as it stops everything else of the demo.
    teardown = run.split('if [ "${1:-}" = "--teardown" ]; then', 1)[1].split("\nfi\n", 1)[0]
    assert "stop_door" in teardown
