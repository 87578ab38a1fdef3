"""What a newcomer trips over, each pinned by a test: ``status`` with invalid files, a JSON error object on every
failed ``--json`` command, ``gpu n/a`` without GPU telemetry, log values cut at a word (never in JSON), ISO 8601
times with their zone, the audit's text table, ``run --help`` with its defaults, and the API's and MCP's actions in
the running loop's metrics.

The pure ones run on values; ``status``, the JSON errors and the metrics drive the real command line and a real loop
(tests/e2e_helpers.py) on a real engine and tmpfs.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.base.units import clip, iso_time
from reconciler.loop.log import Log

ISO_ZONED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?(Z|[+-]\d\d:\d\d)"


# ---------------------------------------------------------------- pure


@pytest.mark.parametrize("limit", range(5, 90, 7))
def test_clip_never_cuts_inside_a_word(limit: int) -> None:
    text = "enter deepseek-256k-offload on dark-compute-a,dark-compute-b failed: ERROR Engine core initialization"
    out = clip(text, limit)
    assert out.endswith(" …")
    kept = out[:-2]
    assert text.startswith(kept)
    # the cut falls on a boundary: the next character of the original is a separator, or the kept part ends in one
    nxt = text[len(kept)] if len(kept) < len(text) else " "
    assert kept[-1:] in " ,;:/)" or nxt in " ,;:/)", (limit, out)
    assert clip(text, len(text)) == text
    assert clip("x" * 300, 20) == "x" * 300  # one unbroken word: long, never wrong


def test_the_text_log_cuts_long_values_at_a_word_and_json_never() -> None:
    detail = " ".join(f"word{n:03d}" for n in range(100))  # 799 characters
    text, js = io.StringIO(), io.StringIO()
    Log("text", text)("action", detail=detail)
    Log("json", js)("action", detail=detail)
    shown = re.search(r'detail="([^"]*)"', text.getvalue()).group(1)  # type: ignore[union-attr]
    assert shown.endswith(" …") and len(shown) <= Log.TEXT_FIELD_MAX + 2
    assert all(re.fullmatch(r"word\d{3}", w) for w in shown[:-2].split()), shown  # whole words only
    assert json.loads(js.getvalue())["detail"] == detail


def test_log_times_and_the_backoff_line_are_iso_8601_with_the_zone(tmp_path: Path) -> None:
    from reconciler.apply.results import Outcome
    from reconciler.loop import Loop
    from reconciler.loop.backoff import Backoff
    from reconciler.plan.actions import Action, ActionKind

    out = io.StringIO()
    loop = Loop(str(tmp_path), log=Log("text", out), backoff=Backoff(base_s=30))
    enter = Action(ActionKind.ENTER, reason="wanted", recipe="omni", gpus=("dark-compute-b",), recipe_hash="h")
    loop._on_outcome(Outcome(enter, "failed", 1.0, detail="health check did not pass"))
    line = next(ln for ln in out.getvalue().splitlines() if " backoff " in ln)
    ts, _, rest = line.partition(" ")
    assert re.fullmatch(ISO_ZONED, ts), line
    until = re.search(r"until=(\S+)", rest).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(ISO_ZONED, until), line  # not a raw epoch
    from datetime import datetime

    at = datetime.fromisoformat(until.replace("Z", "+00:00")).timestamp()
    assert abs(at - loop.backoff.entries["omni@dark-compute-b"].until) <= 0.06, line  # the loop logs it to 0.1 s
    js = io.StringIO()
    Log("json", js)("backoff", until=at)
    assert json.loads(js.getvalue())["until"] == at  # machines keep the number


def test_iso_time_carries_the_local_zone() -> None:
    assert re.fullmatch(ISO_ZONED, iso_time(0.0))
    assert iso_time(0.0, utc=True) == "1970-01-01T00:00:00Z"


def test_the_plan_header_says_gpu_n_a_without_gpu_telemetry() -> None:
    from reconciler.cli.render import Style, render_plan
    from reconciler.plan.actions import Plan
    from reconciler.plan.observed import GpuView, Reading, observation

    def header(telemetry: str) -> str:
        obs = observation(
            "demo", gpus=GpuView(telemetry=telemetry, reading=Reading("gpu", True, "GPU occupancy from Docker alone"))
        )
        return render_plan(Plan(host="demo"), obs, Style(color=False)).splitlines()[0]

    assert header("none") == "host demo  (docker ok, proc ok, gpu n/a)"
    assert header("nvml").endswith("gpu ok)")


def test_the_audit_table_has_a_header_aligned_columns_the_zone_and_the_failures_own_reason() -> None:
    from reconciler.cli.render import render_audit

    t = 1_796_106_835.3
    records = [
        {
            "time": t,
            "front": "cli",
            "who": "",
            "action": "apply",
            "outcome": "converged",
            "seconds": 3.21,
            "bytes_freed": 64 << 20,
            "reason": "reclaim 2 orphan offload file(s)",
        },
        {
            "time": t,
            "front": "api",
            "who": "api-token",
            "action": "shm-reclaim",
            "outcome": "ok",
            "seconds": 0.5,
            "bytes_freed": 3 << 20,
            "reason": "1 orphan offload file(s)",
        },
        {
            "time": t,
            "front": "mcp",
            "who": "stdio",
            "action": "shm-reclaim",
            "outcome": "refused",
            "seconds": 0.1,
            "bytes_freed": 0,
            "reason": "running container(s) with native offload: lane",
        },
        {
            "time": t,
            "front": "loop",
            "who": "",
            "action": "enter",
            "target": "lane@dark-compute-a",
            "outcome": "failed",
            "seconds": 12.0,
            "reason": "manifest gives dark-compute-a to lane",
            "detail": "health check did not pass within 10 s",
        },
    ]
    lines = render_audit(records).splitlines()
    assert lines[0].split() == ["TIME", "BY", "ACTION", "OUTCOME", "SECONDS", "FREED", "WHAT"]
    cols = [lines[0].index(h) for h in ("BY", "ACTION", "OUTCOME", "FREED", "WHAT")]
    for row in lines[1:]:
        assert all(row[c - 2 : c] == "  " and row[c] != " " for c in cols), (row, lines)  # aligned under the header
        assert re.match(ISO_ZONED + "  ", row), row
    assert "api (api-token)" in lines[2] and "mcp (stdio)" in lines[3]
    assert lines[4].endswith("lane@dark-compute-a: health check did not pass within 10 s")  # its own error
    assert "manifest gives" not in lines[4]
    assert "reclaim reclaim" not in "\n".join(lines)


def test_the_apply_summary_names_a_reclaim_once() -> None:
    from reconciler.plan.actions import Action, ActionKind, Plan
    from reconciler.service.apply_session import _summary

    p = Plan(host="demo", actions=(Action(ActionKind.RECLAIM, reason="orphans", paths=("/x/a", "/x/b")),))
    assert _summary(p) == "reclaim 2 orphan offload file(s)"


def test_run_help_shows_its_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "reconciler", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    ).stdout
    # each option's entry (its first line starts with two spaces and a dash), wrapped lines joined
    entries = {}
    options, _, epilog = out.split("options:", 1)[1].partition("\nSignals:")
    assert "SIGHUP" in epilog and "SIGTERM" in epilog and "lanes keep running" in " ".join(epilog.split()), out
    for chunk in re.split(r"\n(?=  -)", options):
        if chunk.split():
            entries[chunk.split()[0].rstrip(",")] = " ".join(chunk.split())
    for flag, default in [
        ("--metrics-addr", "127.0.0.1:9464"),
        ("--resync", "60"),
        ("--debounce", "0.1"),
        ("--log-format", "text"),
        ("--backoff-base", "10"),
        ("--backoff-max", "600"),
    ]:
        assert entries[flag].endswith(f"(default: {default})"), (flag, out)


# ---------------------------------------------------------------- real command line, engine, loop


@pytest.mark.docker
@pytest.mark.root
def test_json_errors_are_objects_on_stdout(root, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    root.manifest_path.write_text("host: [\n")
    for args in (("plan", "--json"), ("apply", "--yes", "--json"), ("status", "--json"), ("validate", "--json")):
        r = root.cli(*args)
        assert r.rc == 1, r
        err = r.data["error"]
        assert err["code"] == "config_invalid" and err["problems"][0]["path"] == "manifests/demo.yaml", r
    root.manifest()
    from reconciler.store.lock import HostLock

    monkeypatch.setenv("RECONCILER_LOCK_DIR", root.env["RECONCILER_LOCK_DIR"])
    with HostLock(root.host, command="test"):  # as a running loop would hold it
        held = root.cli("apply", "--yes", "--json")
    assert held.rc == 1 and held.data["error"]["code"] == "lock_held", held
    assert held.data["error"]["message"].startswith("another reconciler holds"), held


@pytest.mark.docker
@pytest.mark.root
def test_status_with_invalid_files_shows_the_host_and_the_last_valid_desired_state(root, start_loop) -> None:  # type: ignore[no-untyped-def]
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    lp = start_loop().started()
    lp.wait("action", kind="enter", result="ok", timeout=60)
    good = root.manifest_path.read_text()
    root.write_manifest_text(good.replace("dark-compute-b", "dark-compute-z"))
    lp.wait("config-kept", timeout=20)
    r = root.cli("status")
    assert r.rc == 1, r
    out = r.stdout
    assert "files invalid" in out and "manifests/demo.yaml:" in out and "dark-compute-z" in out, out
    assert "desired below: the running loop's last valid desired state" in out, out
    name = root.cname(omni, "dark-compute-b")
    assert re.search(rf"dark-compute-b\s+want {re.escape(omni)}\s+has {re.escape(name)} \(managed", out), out
    assert out.rstrip().endswith(
        "files invalid (exit 1): the host matches the last valid desired state above; "
        "fix the files (`reconciler validate`)"
    ), out
    j = root.cli("status", "--json")
    assert j.rc == 1 and j.data["error"]["code"] == "config_invalid", j
    assert j.data["slots"]["dark-compute-b"]["desired"] == omni and j.data["converged"] is True, j
    lp.stop()
    # without a loop: the last converged topology, said so
    r = root.cli("status", "--json")
    assert r.rc == 1 and r.data["desired_from"].startswith("the last converged topology"), r
    assert r.data["slots"]["dark-compute-b"]["desired"] == omni, r
    # a host file that does not validate leaves nothing to observe by: the error alone, exit 1, no traceback
    host = root.path / "configs" / "host.yaml"
    host.write_text(host.read_text() + "bogus: 1\n")
    r = root.cli("status")
    assert r.rc == 1 and "configs/host.yaml" in r.stderr and "Traceback" not in r.stderr, r


@pytest.mark.docker
@pytest.mark.root
def test_actions_through_the_api_and_mcp_count_in_the_loops_metrics(root, start_loop, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import urllib.request

    root.manifest()
    token = "a-token-for-the-metrics-test-0123456789"
    tf = tmp_path / "token"
    tf.write_text(token)
    tf.chmod(0o600)
    lp = start_loop("--api-token-file", str(tf)).started()
    assert (lp.metric("reconciler_reclaimed_bytes_total") or 0) == 0
    (root.shm / "vllm_offload_dead.mmap").write_bytes(b"\1" * (3 << 20))

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"http://{lp.addr}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def get(path: str) -> dict:
        req = urllib.request.Request(f"http://{lp.addr}{path}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    # The loop may wake (any engine event) and reclaim an orphan first: then the front-end's call finds nothing,
    # and it is tried again with a new orphan. Whoever freed them, the metric must add up to the audit trail.
    for n in range(5):
        got = post("/v1/shm/reclaim", {"confirm": True})
        if got["reclaimed_bytes"]:
            break
        (root.shm / f"vllm_offload_dead-{n}.mmap").write_bytes(b"\1" * (3 << 20))
    assert got["reclaimed_bytes"] == 3 << 20, got
    for n in range(5):
        (root.shm / f"vllm_offload_apply-{n}.mmap").write_bytes(b"\1" * (1 << 20))
        plan = get("/v1/plan?save=true")
        if [a["kind"] for a in plan["actions"]] == ["reclaim"]:
            done = post("/v1/apply", {"plan_id": plan["plan_id"]})
            if done["result"] == "converged" and done["actions"]:
                break
    else:
        pytest.fail("no apply through the API found an orphan to reclaim")
    records = get("/v1/audit")["records"]
    api_actions = [a for r in records if r["front"] == "api" and r["action"] == "apply" for a in r["actions"]]
    assert [a["kind"] for a in api_actions if a["result"] == "ok"] == ["reclaim"], records
    loop_reclaims = [r for r in records if r["front"] == "loop" and r["action"] == "reclaim" and r["outcome"] == "ok"]
    assert lp.metric("reconciler_actions_total", kind="reclaim", result="ok") == 1 + len(loop_reclaims)
    freed = sum(r.get("bytes_freed") or 0 for r in records)
    assert freed >= 4 << 20 and lp.metric("reconciler_reclaimed_bytes_total") == freed, records


def _help(*argv: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *argv, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    ).stdout


@pytest.mark.parametrize(
    "argv",
    [
        ("validate",),
        ("plan",),
        ("apply",),
        ("status",),
        ("audit",),
        ("probe",),
        ("adopt",),
        ("run",),
        ("mcp",),
        ("shm", "status"),
        ("shm", "reclaim"),
        ("shm",),
    ],
)
def test_every_subcommand_help_says_what_it_does(argv: tuple[str, ...]) -> None:
    out = _help(*argv)
    usage, _, rest = out.partition("\n\n")
    assert usage.startswith("usage: reconciler"), out
    # the line after the usage is a description, not straight into the options
    assert rest.split("\n", 1)[0] and not rest.startswith(("options:", "positional arguments:")), out


def test_mcp_takes_no_json_flag_and_the_top_level_help_names_every_mcp_tool() -> None:
    assert "--json" not in _help("mcp")
    top = " ".join(_help().split())
    for tool in ("host_status", "host_plan", "host_shared_memory", "host_probe", "host_manage"):
        assert tool in top, tool


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_a_root_that_is_no_directory_is_said_so_once(tmp_path: Path, what: str) -> None:
    root = tmp_path / "nowhere"
    if what == "a file":
        root.write_text("")
    for cmd in ("validate", "plan", "status"):
        r = subprocess.run(
            [sys.executable, "-m", "reconciler", "--root", str(root), cmd],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "RECONCILER_NO_LOOP": "1"},
        )
        why = "no such directory" if what == "missing" else "not a directory"
        assert r.returncode == 1 and "Traceback" not in r.stderr, r
        assert (
            r.stderr.splitlines()[0]
            == f"{root}: {why}: give --root (or $RECONCILER_ROOT) the directory holding configs/ and manifests/"
        ), r.stderr
        assert "configs/host.yaml: file not found" not in r.stderr, r.stderr
