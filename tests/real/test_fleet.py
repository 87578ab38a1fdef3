"""``reconciler fleet status --fleet FILE`` (reconciler/service/fleet.py): hosts side by side, each read through its
own running loop's API with its token, in parallel, an unreachable one shown as such within its timeout and the
others still shown. Real loops on the real engine, a real HTTP client, the command as a whole process; a fleet file
with a mistake refused with its line, a token never printed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import LoopProcess, Root, free_port, make_root

from real.test_api import TOKEN, token_file
from reconciler.store.lock import HostLock

A, B = "dark-compute-a", "dark-compute-b"


def fleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "fleet", "status", "--fleet", str(tmp_path / "fleet.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_fleet_status_shows_every_host_and_an_unreachable_one_as_such(
    root: Root, tmp_path: Path, tmpfs_dir: Path, docker_api: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = make_root(tmp_path / "second", shm=tmpfs_dir, api=docker_api, name="fleet-second")
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    tf = token_file(tmp_path)
    loops = [LoopProcess(root, "--api-token-file", str(tf)), LoopProcess(second, "--api-token-file", str(tf))]
    # A host that takes the connection and never answers, and one where nothing listens. The silent one is a loop
    # as a client proves one (a process of root's holding its host's lock file and the listening socket), so the
    # request is sent and its answer waited for.
    monkeypatch.setenv("RECONCILER_LOCK_DIR", str(tmp_path / "silent-run"))
    silent_lock = HostLock("silent", command="run").acquire()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        for lp in loops:
            lp.wait("pass", result="converged", timeout=60)
        hosts = [
            {"name": root.host, "url": f"http://{loops[0].addr}", "token_file": str(tf)},
            {"name": second.host, "url": f"http://{loops[1].addr}", "token_file": str(tf)},
            {"name": "silent", "url": f"http://127.0.0.1:{silent.getsockname()[1]}", "token_file": str(tf)},
            {"name": "gone", "url": f"http://127.0.0.1:{free_port()}", "token_file": str(tf)},
        ]
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"hosts": hosts, "timeout_s": 2}))
        t0 = time.monotonic()
        r = fleet(tmp_path, "--json")
        took = time.monotonic() - t0
        assert r.returncode == 1, r  # a host did not answer
        data = json.loads(r.stdout)
        by = {h["name"]: h for h in data["hosts"]}
        assert [h["name"] for h in data["hosts"]] == [root.host, second.host, "silent", "gone"]
        assert by[root.host]["verdict"] == "converged" and by[second.host]["verdict"] == "converged", by
        (lane,) = by[root.host]["lanes"]
        assert lane["recipe"] == omni and lane["slots"] == [B], lane
        slots = {s["slot"]: s for s in by[root.host]["slots"]}
        assert slots[B]["desired"] == omni and [h["recipe"] for h in slots[B]["holders"]] == [omni]
        assert slots[A]["holders"] == [] and by[second.host]["lanes"] == []
        assert by["silent"]["reachable"] is False and "within 2 s" in by["silent"]["error"], by["silent"]
        assert by["silent"]["verdict"] == "unreachable", by["silent"]
        # Nothing listens: "refused", not a timeout (issue 44, item 8).
        assert by["gone"]["reachable"] is False and by["gone"]["verdict"] == "refused", by["gone"]
        assert "refused the connection" in by["gone"]["error"], by["gone"]
        assert data["unreachable"] == ["silent", "gone"]
        # In parallel: the silent host's timeout is waited once, not once per host.
        assert took < 2 * 2 + 5, took
        assert TOKEN not in r.stdout + r.stderr

        text = fleet(tmp_path)
        assert text.returncode == 1
        lines = text.stdout.splitlines()
        assert lines[0].split() == [
            "HOST",
            "VERDICT",
            "COMMIT",
            "TOPOLOGY",
            "SLOT",
            "WANT",
            "HAS",
            "FREE",
            "VRAM",
            "TMPFS",
        ]
        assert any(ln.startswith(root.host) and "converged" in ln for ln in lines), text.stdout
        assert any(omni in ln and B in ln for ln in lines), text.stdout
        assert any(ln.startswith("silent") and "unreachable" in ln for ln in lines), text.stdout
        assert any(ln.startswith("gone") and "refused" in ln for ln in lines), text.stdout
        assert any(ln.startswith("gone: ") and "refused the connection" in ln for ln in lines), text.stdout
        assert TOKEN not in text.stdout + text.stderr

        # A wrong token: that host is refused and says so; the others are unaffected.
        wrong = tmp_path / "wrong-token"
        wrong.write_text("w" * 40)
        wrong.chmod(0o600)
        hosts[1]["token_file"] = str(wrong)
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"hosts": hosts[:2], "timeout_s": 2}))
        r = fleet(tmp_path, "--json")
        by = {h["name"]: h for h in json.loads(r.stdout)["hosts"]}
        assert r.returncode == 1 and by[root.host]["reachable"] and "401" in by[second.host]["error"], by
        assert by[second.host]["verdict"] == "unauthorized", by[second.host]
        text = fleet(tmp_path)
        assert any(ln.startswith(second.host) and "unauthorized" in ln for ln in text.stdout.splitlines()), text
    finally:
        silent.close()
        silent_lock.release()
        for lp in loops:
            lp.stop()
        second.cleanup()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("hosts: []\n", "fleet.yaml:1: hosts:"),
        ("hosts:\n  - {name: a, url: 'ftp://x:1'}\n", "fleet.yaml:2: hosts[0].url"),
        ("hosts:\n  - {name: a, url: 'http://u:secret@x:1'}\n", "no credentials in the URL"),
        ("hosts:\n  - {name: a, url: 'https://x:1'}\n  - {name: a, url: 'https://y:1'}\n", "'a' is named twice"),
        ("hosts:\n  - {name: a, url: 'http://x:1', tokn: f}\n", "tokn"),
        ("hosts:\n  - {name: a, url: 'http://10.0.0.1:9464'}\n", "plain HTTP off loopback sends the token in clear"),
        ("hosts:\n  - {name: a, url: 'http://127.0.0.1:9464', ca: /x/ca.pem}\n", "a CA verifies an https://"),
    ],
)
def test_a_fleet_file_with_a_mistake_is_refused_with_its_line(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "fleet.yaml").write_text(text)
    r = fleet(tmp_path)
    assert r.returncode == 1 and said in r.stderr, r
    assert "Traceback" not in r.stderr and "secret" not in r.stderr


def test_one_prometheus_over_the_fleet_names_the_blocked_host_in_its_alert(
    root: Root, tmp_path: Path, tmpfs_dir: Path, docker_api: object, image: str
) -> None:
    """examples/prometheus-fleet.yml's scrape job over two real loops, a real Prometheus with the shipped rules
    (their for: shortened, the expressions and summaries as shipped): ReconcilerBlocked fires for the blocked host
    alone, its instance and summary naming that host."""
    import urllib.request

    from e2e_helpers import fleet_prometheus, stop_process, wait_until

    check = subprocess.run(
        # The syntax: its CA and token files are the operator's (tests/real/test_api_tls.py checks it with real ones).
        ["promtool", "check", "config", "--syntax-only", "examples/prometheus-fleet.yml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    second = make_root(tmp_path / "second", shm=tmpfs_dir, api=docker_api, name="fleet-prom")
    omni = root.recipe("omni")
    root.run_unmanaged(
        "holder", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}", "-v", "/usr:/usr:ro", image, "sleep", "300"
    )
    root.manifest((omni, [A]))  # a container the tool does not own holds A: every pass is blocked
    loops = [LoopProcess(root), LoopProcess(second)]
    prom, base = fleet_prometheus(tmp_path, [(lp.addr, r.host) for lp, r in zip(loops, (root, second), strict=True)])
    try:
        loops[0].wait("pass", result="blocked", timeout=60)
        loops[1].wait("pass", result="converged", timeout=60)

        def firing() -> list[dict[str, object]] | None:
            try:
                with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=5) as resp:
                    alerts = json.loads(resp.read())["data"]["alerts"]
            except OSError:  # Prometheus still starting
                return None
            blocked = [a for a in alerts if a["labels"]["alertname"] == "ReconcilerBlocked" and a["state"] == "firing"]
            return blocked or None

        def ask(path: str) -> str:
            with urllib.request.urlopen(f"{base}{path}", timeout=5) as resp:
                return resp.read().decode()[:3000]

        try:
            (alert,) = wait_until(firing, timeout=60, what="ReconcilerBlocked firing in Prometheus")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\ntargets: {ask('/api/v1/targets')}\n"
                f"blocked: {ask('/api/v1/query?query=reconciler_blocked_changes')}\nrules: {ask('/api/v1/rules')}"
            ) from None
        assert alert["labels"]["instance"] == root.host and alert["labels"]["host"] == root.host, alert
        assert root.host in alert["annotations"]["summary"] and second.host not in alert["annotations"]["summary"]
    finally:
        stop_process(prom)
        for lp in loops:
            lp.stop()
        second.cleanup()
