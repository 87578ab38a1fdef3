"""The HTTP JSON API of ``reconciler run``, for real: a real loop process (tests/e2e_helpers.py ``LoopProcess``) on a
real engine and a real tmpfs, asked with a real HTTP client (urllib), with real processes mapping offload files.

- the token: none -> 401, a wrong one -> 401, another scheme -> 401, on every /v1 route and /mcp, reads included;
  /metrics and /healthz stay open; no answer and no log line carries the token;
- reads and writes with the token, each body the command line's --json; the reclaim dry run removes nothing, the
  confirmed one removes exactly the orphans; a saved plan applies, and is refused as stale after an edit;
- a reclaim asked for while a native-offload container runs is refused (409) and removes nothing;
- bad requests: wrong types, a plan id that is a path, a body over the limit, not JSON;
- the listener: loopback unless --api-allow-remote, and then only with a token given explicitly; a token file
  readable by others is refused; without a token a 0600 one is generated under the state dir;
- each destructive call is in the audit trail with its caller (api and the token file's name);
- concurrency: a reclaim asked for during a pass waits for the pass to end (the pass lock), and both complete.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import LoopProcess, Root, free_port, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"
TOKEN = "t0ken-for-the-api-tests-" + "x" * 16
MIB = 1 << 20

HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
os.close(fd)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.read()
"""


# ---------------------------------------------------------------- helpers


class Api:
    """A client of one loop's API: ``get``/``post`` give (status, headers, JSON body or text)."""

    def __init__(self, base: str, token: str | None):
        self.base = base
        self.token = token

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = ...,
        raw: bytes | None = None,  # type: ignore[assignment]
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> tuple[int, dict[str, str], Any]:
        tok = self.token if token is ... else token
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None and raw is None:
            req.add_header("Content-Type", "application/json")
        if tok is not None:
            req.add_header("Authorization", f"Bearer {tok}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, hdrs, text = resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, hdrs, text = exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()
        try:
            return status, hdrs, json.loads(text)
        except ValueError:
            return status, hdrs, text

    def get(self, path: str, **kw: Any) -> tuple[int, dict[str, str], Any]:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, str], Any]:
        return self.call("POST", path, body, **kw)


def token_file(tmp_path: Path, value: str = TOKEN, mode: int = 0o600, name: str = "ops-token") -> Path:
    path = tmp_path / name
    path.write_text(value + "\n")
    path.chmod(mode)
    return path


class Holder:
    """A real process that maps an offload file (1 MiB) and keeps it mapped until closed."""

    def __init__(self, path: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def orphan(path: Path, size: int = 2 * MIB) -> Path:
    path.write_bytes(b"\xab" * size)
    return path


@pytest.fixture
def shm_files(root: Root) -> Iterator[dict[str, Any]]:
    """On the root's tmpfs: one file mapped by a live process, two orphans (unmapped, unopened)."""
    mapped = root.shm / "vllm_offload_live.mmap"
    holder = Holder(mapped)
    orphans = [orphan(root.shm / "vllm_offload_dead1.mmap"), orphan(root.shm / "vllm_offload_dead2.mmap", 3 * MIB)]
    try:
        yield {"mapped": mapped, "holder": holder, "orphans": orphans}
    finally:
        holder.close()


@pytest.fixture
def loop(root: Root, tmp_path: Path) -> Iterator[tuple[LoopProcess, Api]]:
    """A real `reconciler run` on an empty manifest, its API behind a token file of the test's own."""
    root.manifest()
    tf = token_file(tmp_path)
    lp = LoopProcess(root, "--api-token-file", str(tf)).started()
    try:
        yield lp, Api(f"http://{lp.addr}", TOKEN)
    finally:
        lp.stop()


@pytest.fixture
def quiet_loop(root: Root, tmp_path: Path, image: str) -> Iterator[tuple[LoopProcess, Api]]:
    """A real `reconciler run` that cannot act: its manifest gives slot A to omni, and a container the tool does not
    own holds slot A, so every pass is blocked and changes nothing (not even the orphans a test makes, which an
    unblocked pass would reclaim by itself whenever an engine event, from any container, wakes it)."""
    omni = root.recipe("omni")
    root.run_unmanaged(
        "holder", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}", "-v", "/usr:/usr:ro", image, "sleep", "300"
    )
    root.manifest((omni, [A]))
    tf = token_file(tmp_path)
    lp = LoopProcess(root, "--api-token-file", str(tf))
    try:
        lp.wait("pass", result="blocked", timeout=30)
        yield lp, Api(f"http://{lp.addr}", TOKEN)
    finally:
        lp.stop()


def audit(api: Api, **match: Any) -> list[dict[str, Any]]:
    status, _, body = api.get("/v1/audit")
    assert status == 200, body
    return [r for r in body["records"] if all(r.get(k) == v for k, v in match.items())]


# ---------------------------------------------------------------- the token


READS = ["/v1/status", "/v1/plan", "/v1/plan?save=true", "/v1/shm", "/v1/audit", "/v1/openapi.json"]
WRITES = ["/v1/shm/reclaim", "/v1/apply"]


def test_every_api_and_mcp_route_needs_the_token(
    quiet_loop: tuple[LoopProcess, Api], root: Root, shm_files: dict[str, Any]
) -> None:
    lp, api = quiet_loop
    before = sorted(p.name for p in root.shm.iterdir())
    # (``/`` is the status page: without its session cookie it answers its login form; tests/real/test_page.py.)
    for path in READS + WRITES + ["/mcp", "/v1", "/v1/nothing", "/nothing", "//v1/status", "/V1/status"]:
        for method in ("GET", "POST"):
            body = {"confirm": True} if method == "POST" else None
            for tok, why in (
                (None, "no bearer token"),
                ("wrong-" + TOKEN[6:], "wrong token"),
                (TOKEN[:-1], "wrong token"),
            ):
                status, hdrs, answer = api.call(method, path, body, token=tok)
                assert status == 401, (method, path, tok, status, answer)
                assert why in answer["error"], answer
                assert hdrs.get("www-authenticate", "").startswith("Bearer"), hdrs
            # Another scheme carrying the right token is still no bearer token.
            status, _, _ = api.call(method, path, body, token=None, headers={"Authorization": f"Basic {TOKEN}"})
            assert status == 401, (method, path)
    assert sorted(p.name for p in root.shm.iterdir()) == before, "nothing was removed without the token"
    records = audit(api, front="api")
    assert [r for r in records if r["action"] != "authenticate"] == [], "no call without the token reached the service"
    # Each failed authentication is audited with its reason and peer, at most REFUSALS_AUDITED a peer in a window
    # (96 here, all of root's).
    from reconciler.api.limits import REFUSALS_AUDITED

    assert len(records) == REFUSALS_AUDITED and {r["outcome"] for r in records} == {"refused"}, records
    assert {r["reason"] for r in records} >= {"wrong token"} and all(r["who"].startswith("127.0.0.1:") for r in records)
    # /metrics and /healthz stay open, as before (Prometheus and supervisors).
    status, _, text = api.get("/metrics", token=None)
    assert status == 200 and "reconciler_reconcile_passes_total" in text
    status, _, health = api.get("/healthz", token=None)
    assert status == 200 and health["ok"] is True and health["passes"] >= 1, health
    # Refusals are logged, never with the token.
    assert lp.find("api-refused", reason="wrong token")
    assert TOKEN not in lp.log() and TOKEN[:-1] not in "\n".join(lp.other)
    logged = "\n".join(json.dumps(e.data) for e in lp.events) + "\n".join(lp.other)
    assert TOKEN[:20] not in logged
    start = lp.find("api")[0]
    assert start["caller"] == "ops-token" and start["mcp"].endswith("/mcp"), start


# ---------------------------------------------------------------- reads and writes


def test_reads_and_writes_with_the_token(
    quiet_loop: tuple[LoopProcess, Api], root: Root, shm_files: dict[str, Any]
) -> None:
    lp, api = quiet_loop
    mapped, orphans = shm_files["mapped"], shm_files["orphans"]

    # Reads: the command line's --json.
    status, hdrs, shm = api.get("/v1/shm")
    assert status == 200 and hdrs["x-reconciler-exit-code"] == "0", shm
    cli = root.shm_status()
    assert shm == cli, "GET /v1/shm is `shm status --json`"
    states = {Path(f["path"]).name: f["state"] for f in shm["files"]}
    assert states == {
        "vllm_offload_live.mmap": "owned",
        "vllm_offload_dead1.mmap": "orphan",
        "vllm_offload_dead2.mmap": "orphan",
    }, states
    [live] = [f for f in shm["files"] if f["path"] == str(mapped)]
    assert shm_files["holder"].proc.pid in [o["pid"] for o in live["owners"]], live

    status, _, st = api.get("/v1/status")
    assert status == 200 and set(st) == set(root.status()), st
    status, hdrs, plan = api.get("/v1/plan")
    assert status == 200 and "plan_id" not in plan and plan["blocked"] and hdrs["x-reconciler-exit-code"] == "3", plan
    status, _, spec = api.get("/v1/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.1") and "/v1/shm/reclaim" in spec["paths"], spec

    # The reclaim's dry run names the orphans and removes nothing.
    status, hdrs, dry = api.post("/v1/shm/reclaim", {})
    assert status == 200 and dry["confirmed"] is False, dry
    assert sorted(f["path"] for f in dry["would_reclaim"]) == sorted(map(str, orphans)), dry
    assert all(p.exists() for p in [mapped, *orphans])
    assert audit(api, front="api") == [], "a dry run changes nothing and is not an action"

    # Confirmed: exactly the orphans go; the mapped file stays.
    status, hdrs, done = api.post("/v1/shm/reclaim", {"confirm": True})
    assert status == 200 and hdrs["x-reconciler-exit-code"] == "0", done
    assert done["confirmed"] and done["verified"], done
    assert sorted(f["path"] for f in done["reclaimed"]) == sorted(map(str, orphans)), done
    assert done["reclaimed_bytes"] == 5 * MIB, done
    assert mapped.exists() and not any(p.exists() for p in orphans)
    [rec] = audit(api, front="api", action="shm-reclaim")
    assert rec["who"] == "ops-token" and rec["outcome"] == "ok" and rec["bytes_freed"] == 5 * MIB, rec
    assert sorted(rec["paths"]) == sorted(map(str, orphans)), rec
    # It ran between passes, under the pass lock.
    assert lp.find("api-exclusive", front="api") and lp.find("api-exclusive-end", front="api")

    # A saved plan is applied as it stands (here blocked: 409, exit 3); once the host changed, the same plan is
    # refused as stale, with what changed.
    status, _, saved = api.get("/v1/plan?save=true")
    assert status == 200 and len(saved["plan_id"]) == 32 and saved["blocked"], saved
    for _ in range(10):
        status, _, saved = api.get("/v1/plan?save=true")
        status, hdrs, applied = api.post("/v1/apply", {"plan_id": saved["plan_id"]})
        if applied["result"] != "stale":
            break
        assert not any(root.tag in c for c in applied["changes"]), applied["changes"]
    assert status == 409 and applied["result"] in ("blocked", "stale"), applied
    assert hdrs["x-reconciler-exit-code"] == {"blocked": "3", "stale": "1"}[applied["result"]]
    mark = lp.mark()
    for name in root.unmanaged():
        root.api.remove_container(name["Id"], force=True)
    lp.wait("pass", after=mark, result="converged", timeout=60)
    status, hdrs, stale = api.post("/v1/apply", {"plan_id": saved["plan_id"]})
    assert status == 409 and stale["result"] == "stale" and hdrs["x-reconciler-exit-code"] == "1", stale
    assert stale["changes"] and stale["plan"]["actions"] == [], stale
    assert audit(api, front="api", action="apply")[-1]["outcome"] == "stale"
    since = audit(api, front="api")[-1]["time"]
    status, _, recent = api.get(f"/v1/audit?since={since}")
    assert status == 200 and [r["outcome"] for r in recent["records"] if r["front"] == "api"] == ["stale"], recent
    # Once nothing changes between the plan and its apply, it is carried out. (A plan's fingerprint covers every
    # container on the engine: one that another test starts or stops in between makes it stale; plan again then.)
    for _ in range(10):
        status, _, fresh = api.get("/v1/plan?save=true")
        status, _, applied = api.post("/v1/apply", {"plan_id": fresh["plan_id"]})
        if applied["result"] != "stale":
            break
        assert not any(root.tag in c for c in applied["changes"]), applied["changes"]
    assert (status == 200 and applied["result"] == "converged") or applied["result"] == "stale", applied


def test_bad_requests_are_refused_and_change_nothing(
    quiet_loop: tuple[LoopProcess, Api], root: Root, shm_files: dict[str, Any]
) -> None:
    _, api = quiet_loop
    orphans = shm_files["orphans"]
    cases: list[tuple[str, Any, int]] = [
        ("/v1/shm/reclaim", {"confirm": "yes"}, 400),
        ("/v1/shm/reclaim", {"confirm": 1}, 400),
        ("/v1/shm/reclaim", {"confirm": True, "force": True}, 400),
        ("/v1/shm/reclaim", [True], 400),
        ("/v1/apply", {}, 400),
        ("/v1/apply", {"plan_id": "../../../etc/passwd"}, 400),
        ("/v1/apply", {"plan_id": str(root.path / "plan.json")}, 400),
        ("/v1/apply", {"plan_id": "0" * 32}, 409),  # well-formed, but no such plan
    ]
    for path, body, want in cases:
        status, _, answer = api.post(path, body)
        assert status == want, (path, body, status, answer)
        assert "error" in answer, answer
    status, _, answer = api.post(
        "/v1/shm/reclaim", raw=b"confirm=true", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 400, answer
    status, _, answer = api.post("/v1/shm/reclaim", raw=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400, answer
    big = json.dumps({"confirm": True, "paths": ["x" * 1000] * 80}).encode()
    status, _, answer = api.post("/v1/shm/reclaim", raw=big, headers={"Content-Type": "application/json"})
    assert status == 413, answer
    status, _, answer = api.get("/v1/plan?save=maybe")
    assert status == 400, answer
    status, _, answer = api.get("/v1/audit?since=yesterday-ish")
    assert status == 400, answer
    # A route that does not exist, or a method a route does not take: JSON too, saying where to look (issue 44).
    status, hdrs, answer = api.get("/v1/nope")
    assert status == 404 and isinstance(answer, dict) and "no such route" in answer["error"], (status, answer)
    assert hdrs["content-type"].startswith("application/json"), hdrs
    status, hdrs, answer = api.get("/v1/apply")
    assert status == 405 and isinstance(answer, dict), (status, answer)
    assert "does not take GET; it takes POST" in answer["error"] and hdrs.get("allow") == "POST", (answer, hdrs)
    assert all(p.exists() for p in orphans), "nothing was removed by a refused request"


def test_a_reclaim_while_a_settled_offload_lane_runs_removes_an_orphan_and_never_the_lanes_file(
    loop: tuple[LoopProcess, Api], root: Root
) -> None:
    """docs/design.md, safety rule 2: a running offload lane that this install saw healthy and that is seen holding
    its own file keeps nothing else from reclaim: another lane's orphan goes, its own file stays (owned)."""
    lp, api = loop
    lane = root.recipe("deepseek-256k-offload", offload_mib=8)
    mark = lp.mark()
    root.manifest((lane, [A, B]))
    lp.wait("pass", after=mark, result="converged", timeout=90)
    [own] = [f for f in root.shm.iterdir() if f.name.startswith("vllm_offload_")]
    stray = orphan(root.shm / "vllm_offload_stray.mmap")
    status, hdrs, answer = api.post("/v1/shm/reclaim", {"confirm": True})
    assert status == 200 and hdrs["x-reconciler-exit-code"] == "0", answer
    assert not answer.get("refused"), answer
    # The orphan is gone (by this reclaim, or by a pass of the loop just before it); the lane's file is kept.
    assert not stray.exists() and own.exists(), answer
    assert [k["path"] for k in answer["kept"]] == [str(own)] and answer["kept"][0]["state"] == "owned", answer
    [rec] = audit(api, front="api", action="shm-reclaim")
    assert rec["outcome"] == "ok", rec


# ---------------------------------------------------------------- the listener and its token


def test_loopback_unless_allowed_with_a_token_of_ones_own(root: Root, tmp_path: Path) -> None:
    root.manifest()
    port = free_port()
    r = root.cli("run", "--metrics-addr", f"0.0.0.0:{port}", timeout=30)
    assert r.rc == 1 and "not a loopback address" in r.stderr and "--api-allow-remote" in r.stderr, r
    r = root.cli("run", "--metrics-addr", f"0.0.0.0:{port}", "--api-allow-remote", timeout=30)
    assert r.rc == 1 and "needs a token given explicitly" in r.stderr, r
    loose = token_file(tmp_path, mode=0o644, name="loose")
    r = root.cli("run", "--api-token-file", str(loose), timeout=30)
    assert r.rc == 1 and "is readable by others" in r.stderr and TOKEN not in r.stderr + r.stdout, r
    short = token_file(tmp_path, value="short", name="short")
    r = root.cli("run", "--api-token-file", str(short), timeout=30)
    assert r.rc == 1 and "at least 16" in r.stderr, r
    assert "Traceback" not in r.stderr

    # With the flag and a token file, another address of this machine is served (here: the first non-loopback one),
    # over plain HTTP only where host.yaml says so (api.insecure; else TLS: tests/real/test_api_tls.py).
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("no non-loopback address on this machine")
    tf = token_file(tmp_path, name="remote-token")
    r = root.cli("run", "--metrics-addr", f"{addr}:{port}", "--api-allow-remote", "--api-token-file", str(tf))
    assert r.rc == 1 and "without TLS" in r.stderr and "api: {insecure: true}" in r.stderr, r
    host_file = root.path / "configs" / "host.yaml"
    host_file.write_text(host_file.read_text() + "api: {insecure: true}\n")
    r = subprocess.Popen(
        root.cli_args(
            "run",
            "--metrics-addr",
            f"{addr}:{port}",
            "--api-allow-remote",
            "--api-token-file",
            str(tf),
            "--log-format",
            "json",
        ),
        env=root.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        api = Api(f"http://{addr}:{port}", TOKEN)
        wait_until(lambda: _answers(api), timeout=20, what="the remote listener")
        assert api.get("/v1/shm", token=None)[0] == 401
        assert api.get("/v1/shm")[0] == 200
    finally:
        r.terminate()
        r.wait(timeout=20)


def _answers(api: Api) -> bool:
    try:
        return api.get("/healthz", token=None, timeout=2)[0] in (200, 503)
    except OSError:
        return False


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel only picks a source address
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_without_a_token_one_is_generated_owner_only(root: Root) -> None:
    root.manifest()
    env_before = root.env.pop("RECONCILER_API_TOKEN", None)
    lp = LoopProcess(root).started()
    try:
        path = Path(root.env["RECONCILER_STATE_DIR"]) / root.host / "api-token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        value = path.read_text().strip()
        assert len(value) >= 32
        api = Api(f"http://{lp.addr}", value)
        assert api.get("/v1/status")[0] == 200
        assert api.get("/v1/status", token=None)[0] == 401
        assert value not in lp.log()
        [start] = lp.find("api")
        assert start["token_from"] == f"{path} (generated)" and start["caller"] == "api-token", start
    finally:
        lp.stop()
        if env_before is not None:
            root.env["RECONCILER_API_TOKEN"] = env_before
    # The environment's token, named "env" in the audit, wins over the generated file.
    root.env["RECONCILER_API_TOKEN"] = TOKEN
    lp = LoopProcess(root).started()
    try:
        api = Api(f"http://{lp.addr}", TOKEN)
        assert api.get("/v1/shm")[0] == 200 and api.get("/v1/shm", token=value)[0] == 401
        assert api.post("/v1/shm/reclaim", {"confirm": True})[0] == 200
        [rec] = audit(api, front="api", action="shm-reclaim")
        assert rec["who"] == "env", rec
    finally:
        lp.stop()


# ---------------------------------------------------------------- concurrency


def test_a_reclaim_during_a_pass_waits_for_it_and_both_complete(loop: tuple[LoopProcess, Api], root: Root) -> None:
    """The pass enters a lane that takes 2 s to start; a reclaim asked for meanwhile (of orphans made after the pass
    started) waits for the pass to end: its answer comes after the pass's log line, and in the log its exclusive
    section starts after the pass ended, with no pass inside it. The lane came up, every orphan went exactly once,
    and every action is in the audit trail."""
    lp, api = loop
    omni = root.recipe("omni", mode="start-delay=2")
    mark = lp.mark()
    root.manifest((omni, [B]))
    lp.wait("pass-start", after=mark, timeout=30)
    # Orphans made after the pass planned: its own actions do not name them; the reclaim asked for now does.
    orphans = [orphan(root.shm / f"vllm_offload_race{i}.mmap") for i in range(3)]
    answered: dict[str, Any] = {}

    def ask() -> None:
        answered["sent"] = time.time()
        answered["reply"] = api.post("/v1/shm/reclaim", {"confirm": True}, timeout=90)
        answered["at"] = time.time()

    t = threading.Thread(target=ask)
    t.start()
    t.join(timeout=120)
    status, _, done = answered["reply"]
    [end] = lp.wait("pass", after=mark, timeout=30)
    assert end["result"] == "converged", end
    assert status == 200 and done["confirmed"] and done["verified"] and not done["errors"], done
    assert answered["sent"] < end.at <= answered["at"], "the reclaim was asked for during the pass, answered after"
    events = [e for e in lp.events[mark:] if e["event"] in ("pass-start", "pass", "api-exclusive", "api-exclusive-end")]
    names = [e["event"] for e in events]
    i = names.index("api-exclusive")
    assert names[i + 1] == "api-exclusive-end", names
    assert names.index("pass") < i, f"the reclaim's exclusive section began after the pass ended: {names}"
    assert events[i]["waited_s"] > 0.5, events[i]
    assert root.running().keys() == {root.cname(omni, B)}, "the pass's enter completed"
    # Nothing lost, nothing done twice: each orphan was removed once, by the pass (which plans again after each
    # action, so it may take them) or by the reclaim that waited for it, and the two account for every byte.
    assert not any(p.exists() for p in orphans)
    records = audit(api)
    loop_freed = sum(r["bytes_freed"] for r in records if r["front"] == "loop" and r["action"] == "reclaim")
    [rec] = [r for r in records if r["front"] == "api"]
    assert rec["action"] == "shm-reclaim" and rec["outcome"] == "ok", rec
    assert rec["bytes_freed"] == done["reclaimed_bytes"]
    assert loop_freed + rec["bytes_freed"] == 3 * 2 * MIB, records
    assert next(r["action"] for r in records if r["front"] == "loop") == "enter", records
