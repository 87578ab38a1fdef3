"""The host's status page without a browser: its rendering (every value escaped, every value through the redaction
boundary, ``sleeping`` shown when the status carries it and not needed when it does not), and its safety against a
real `reconciler run` on the real engine, asked with a real HTTP client (urllib): the login (a wrong token refused,
counted and audited like a failed API login; the session cookie HttpOnly and SameSite=Strict; no token in a URL),
the Host check, the CSP on every answer, the CSRF token on every action, a stale plan refused, the page whole
without JavaScript. The browser's own test is tests/real/test_page_browser.py.
"""

from __future__ import annotations

import http.client
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from e2e_helpers import LoopProcess, Root

from reconciler.api.page import handlers, snapshot, view
from reconciler.api.page.snapshot import PageData, live_html, page_data
from reconciler.base.errors import ReconcilerError

A, B = "dark-compute-a", "dark-compute-b"
TOKEN = "t0ken-for-the-page-unit-" + "z" * 16
HOSTILE = '<script>alert("x")</script>"onmouseover="x'
SECRET = "hf_" + "Q" * 30


def status_doc(**container: Any) -> dict[str, Any]:
    c = {
        "name": "reconciler-omni-b",
        "id": "abc",
        "state": "running",
        "recipe": "omni",
        "slots": [B],
        "owner": "ours",
        "healthy": True,
        "preserved": False,
        **container,
    }
    slot_b = {"desired": "omni", "index": 1, "containers": [c], "processes": [], "free": False, "unknown": []}
    slot_a = {"desired": None, "index": 0, "containers": [], "processes": [], "free": True, "unknown": []}
    return {
        "host": "demo",
        "converged": True,
        "sources": {"docker": "ok", "proc": "ok", "gpu": "ok"},
        "slots": {A: slot_a, B: slot_b},
        "containers": [c],
        "install_id": "i1",
        "shm": {"dir": "/dev/shm", "tmpfs": {"size_bytes": 100, "used_bytes": 0, "free_bytes": 100}, "files": {}},
        "plan": {"changes": False, "blocked": False, "actions": [], "blockers": [], "held": [], "fallbacks": []},
    }


def data(status: dict[str, Any], **kw: Any) -> PageData:
    return PageData(
        status=status, files=kw.pop("files", []), audit=kw.pop("audit", []), health=None, recipes={}, progress={}, **kw
    )


# ---------------------------------------------------------------- rendering


def test_every_value_is_escaped() -> None:
    st = status_doc(name=HOSTILE)
    st["host"] = HOSTILE
    st["plan"]["blockers"] = [{"recipe": "omni", "gpus": [B], "holder": HOSTILE, "cause": "x", "reason": HOSTILE}]
    files = [{"path": "/dev/shm/" + HOSTILE, "state": "orphan", "allocated_bytes": 1, "owners": []}]
    audit = [{"time": 1.0, "front": "web", "who": HOSTILE, "action": "apply", "outcome": "ok", "reason": HOSTILE}]
    html = live_html(data(st, files=files, audit=audit))
    assert "<script" not in html and '"onmouseover' not in html, html
    assert html.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&quot;onmouseover=&quot;x") >= 5


def test_what_the_page_shows_comes_through_the_redaction_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret that a source let through (a process's command line, a reason, an audit record, a file's owner, the
    loop's health) is masked on its way into the page, as on its way out of the API."""

    class Result:
        observed = type("Observed", (), {"shm": None})()

        def to_json(self) -> dict[str, Any]:
            st = status_doc()
            st["slots"][B]["processes"] = [{"pid": 7, "container": None, "command": f"vllm --hf-token {SECRET}"}]
            st["plan"]["actions"] = [{"kind": "enter", "recipe": "omni", "gpus": [B], "reason": f"HF_TOKEN={SECRET}"}]
            return st

    class Records:
        records: ClassVar = [
            {"who": "x", "action": "apply", "outcome": "ok", "reason": f"Authorization: Bearer {SECRET}"}
        ]

    class Service:
        def status(self) -> Result:
            return Result()

        def audit(self, *, since: float) -> Records:
            return Records()

        def desired(self) -> Any:
            raise ReconcilerError("the files do not validate")

    class Shm:
        def __init__(self, view: Any):
            pass

        def to_json(self) -> dict[str, Any]:
            owner = {"pid": 7, "container": f"API_KEY={SECRET}", "via": "map"}
            return {"files": [{"path": "/dev/shm/vllm_offload_x.mmap", "state": "owned", "owners": [owner]}]}

    monkeypatch.setattr(snapshot, "ShmStatusResult", Shm)
    health = {"last_pass": {"result": f"token={SECRET}", "at": 1.0}}
    got = page_data(Service(), health=health, progress={}, busy=False)  # type: ignore[arg-type]
    html = live_html(got)
    assert SECRET not in html and "***" in html, html


def test_sleeping_is_shown_when_the_status_carries_it_and_not_needed_when_it_does_not() -> None:
    asleep = status_doc(sleeping=True)
    assert view.slot_state(asleep["slots"][B]) == "asleep"
    [lane] = view.lanes_of(asleep)
    assert view.lane_phase(lane, asleep["plan"]) == "asleep"
    assert 'data-phase="asleep"' in live_html(data(asleep))
    for doc in (status_doc(sleeping=False), status_doc(sleeping=None), status_doc()):  # the last: no key at all
        assert view.slot_state(doc["slots"][B]) == "serving"
        assert 'data-lane="omni" data-phase="serving"' in live_html(data(doc))


def test_a_standby_lane_asleep_beside_the_running_one_is_wanted_and_asleep_and_each_lane_shows_its_server() -> None:
    """A lane of a standby topology is not on a slot's desired, yet it is wanted: asleep, never 'no longer wanted'."""
    st = status_doc(vllm={"version": "0.11.2", "gauges": {"requests_running": 2.0, "kv_cache_usage_ratio": 0.25}})
    big = {**st["containers"][0], "name": "reconciler-tp2-a-b", "id": "def", "recipe": "tp2", "slots": [A, B]}
    big.update(sleeping=True, vllm=None)
    st["containers"].append(big)
    st["slots"][B]["containers"].append(big)
    st["standby"] = [{"recipe": "tp2", "gpus": [A, B]}]
    html = live_html(data(st))
    assert 'data-lane="tp2" data-phase="asleep"' in html, html
    assert "no longer wanted" not in html
    assert "vLLM 0.11.2; 2 running, 0 waiting; KV cache 25 % used" in html
    # Without standby: the same container is a lane no longer wanted, leaving.
    del st["standby"]
    assert 'data-lane="tp2" data-phase="leaving"' in live_html(data(st))


def test_the_session_cookie_is_secure_over_tls() -> None:
    from reconciler.api.page.sessions import cookie_header

    assert cookie_header("abc", secure=True) == "reconciler_session=abc; Path=/; HttpOnly; SameSite=Strict; Secure"
    assert "Secure" not in cookie_header("abc", secure=False)
    assert cookie_header("", secure=True, clear=True).endswith("Max-Age=0; Secure")


def test_each_cards_free_vram_of_the_last_hour_is_drawn_without_a_style() -> None:
    snap = snapshot.Snapshot("/nonexistent", lambda: None)  # type: ignore[arg-type,return-value]
    st = status_doc()
    st["slots"][B].update(memory_total_bytes=100 << 30, memory_used_bytes=60 << 30, memory_free_bytes=40 << 30)
    snap._vram[B] = snapshot.deque([(time.time() - 2 * snapshot.HISTORY_S, 1), (time.time() - 600, 30 << 30)])
    history = snap._remember_vram(st)
    assert [free for _, free in history[B]] == [30 << 30, 40 << 30], "an hour kept, what is older dropped"
    assert A not in history, "a card without telemetry has no history"
    html = live_html(data(st, vram_history=history))
    assert '<svg class="spark"' in html and "<polyline points=" in html
    assert "free VRAM over the last 10 min: 30.0 GiB to 40.0 GiB" in html
    assert "style=" not in html


# ---------------------------------------------------------------- against a real loop


class Client:
    """A browser's part, by hand: a cookie jar of one cookie, forms sent as a browser sends them."""

    def __init__(self, addr: str):
        self.host, port = addr.split(":")
        self.port = int(port)
        self.cookie = ""

    def call(
        self, method: str, path: str, form: dict[str, Any] | None = None, *, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        body = urllib.parse.urlencode(form, doseq=True) if form is not None else None
        hdrs = {"Host": f"{self.host}:{self.port}"}
        if body is not None:
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
            hdrs["Origin"] = f"http://{self.host}:{self.port}"
        if self.cookie:
            hdrs["Cookie"] = self.cookie
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode()
        got = {k.lower(): v for k, v in resp.getheaders()}
        conn.close()
        if "set-cookie" in got:
            self.cookie = got["set-cookie"].split(";")[0]
        return resp.status, got, text

    def login(self, token: str = TOKEN) -> tuple[int, dict[str, str], str]:
        return self.call("POST", "/page/login", {"token": token})

    def csrf(self) -> str:
        _, _, page = self.call("GET", "/")
        return re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]


@pytest.fixture
def page_loop(root: Root, tmp_path: Path) -> Iterator[tuple[LoopProcess, Client]]:
    omni = root.recipe("omni")
    root.write_manifest_text(
        f"host: {root.host}\ntopology: none\ntopologies:\n  none: []\n"
        f"  split:\n    - recipe: {omni}\n      gpus: [{B}]\n"
    )
    tf = tmp_path / "ops-token"
    tf.write_text(TOKEN + "\n")
    tf.chmod(0o600)
    lp = LoopProcess(root, "--api-token-file", str(tf), "--debounce", "3").started()
    try:
        yield lp, Client(lp.addr)
    finally:
        lp.stop()


def test_login_session_cookie_csp_and_host_check(page_loop: tuple[LoopProcess, Client], root: Root) -> None:
    lp, c = page_loop
    # Without a session: the page sends to its login form; every answer carries the CSP.
    status, hdrs, _ = c.call("GET", "/")
    assert status == 303 and hdrs["location"] == "/page/login"
    for path in ("/", "/page/login", "/page/live", "/page/static/page.css", "/page/static/page.js", "/page/static/x"):
        _, hdrs, _ = c.call("GET", path)
        assert hdrs["content-security-policy"] == handlers.CSP, (path, hdrs)
        assert "'unsafe-inline'" not in hdrs["content-security-policy"] and "http" not in handlers.CSP
    # A wrong token: refused (401), counted and audited like a failed API login, no cookie.
    before = lp.metric("reconciler_http_refusals_total", status="401", reason="token") or 0
    status, hdrs, text = c.login("wrong-" + TOKEN[6:])
    assert status == 401 and "set-cookie" not in hdrs and "Wrong token" in text
    assert (lp.metric("reconciler_http_refusals_total", status="401", reason="token") or 0) == before + 1
    [rec] = [r for r in root.cli("audit", "--json").data["records"] if r.get("front") == "web"]
    assert rec["action"] == "authenticate" and rec["outcome"] == "refused" and rec["reason"] == "wrong token", rec
    # A token in the URL opens nothing.
    status, hdrs, _ = c.call("GET", "/page/login?" + urllib.parse.urlencode({"token": TOKEN}))
    assert status == 200 and "set-cookie" not in hdrs
    status, hdrs, _ = c.call("POST", "/page/login?" + urllib.parse.urlencode({"token": TOKEN}), {})
    assert status == 401 and "set-cookie" not in hdrs
    # The right token: a session cookie, HttpOnly and SameSite=Strict (not Secure over plain HTTP), never the token.
    status, hdrs, _ = c.login()
    cookie = hdrs["set-cookie"]
    assert status == 303 and hdrs["location"] == "/", hdrs
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie and TOKEN not in cookie
    # The page, whole without JavaScript (a <noscript> refresh), its live part with an ETag.
    status, hdrs, page = c.call("GET", "/")
    assert status == 200 and hdrs["content-security-policy"] == handlers.CSP
    assert 'data-slot="dark-compute-a"' in page and 'data-slot="dark-compute-b"' in page and "data-verdict=" in page
    assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in page
    assert "<script>" not in page and "style=" not in page, "no inline script or style"
    status, hdrs, _ = c.call("GET", "/page/live")
    assert status == 200 and hdrs["etag"]
    status, _, _ = c.call("GET", "/page/live", headers={"If-None-Match": hdrs["etag"]})
    assert status == 304
    # The Host check against DNS rebinding holds on the page's paths, cookie or not; and a page of another origin
    # cannot post.
    for path in ("/", "/page/login", "/page/live"):
        status, _, _ = c.call("GET", path, headers={"Host": f"rebind.example:{c.port}"})
        assert status == 421, path
    status, _, _ = c.call(
        "POST", "/page/switch", {"csrf": c.csrf(), "topology": "split"}, headers={"Origin": "http://evil.example"}
    )
    assert status == 403
    assert "topology: none" in root.manifest_path.read_text()


def test_the_login_form_says_where_the_token_is_and_that_nothing_else_asks_for_it(
    page_loop: tuple[LoopProcess, Client], tmp_path: Path
) -> None:
    """A local user who binds the loop's port while it is down can serve a look-alike form: the loop's own says where
    the token lives, that the tool asks for it nowhere else, and how to tell whether this listener is the loop's."""
    _, c = page_loop
    for status, _, text in (c.call("GET", "/page/login"), c.login("wrong-" + TOKEN[6:])):
        assert status in (200, 401) and 'id="login"' in text
        where = re.search(r'<p id="token-where">(.*?)</p>', text, re.S)
        check = re.search(r'<p id="token-check">(.*?)</p>', text, re.S)
        assert where and check, text
        assert f"The token is in the file {tmp_path / 'ops-token'} on this host" in where.group(1), where.group(1)
        assert "nowhere else" in where.group(1) and TOKEN not in text
        assert "reconciler status" in check.group(1) and "NOT BOUND" in check.group(1), check.group(1)


def test_every_action_needs_its_csrf_token_and_a_stale_plan_is_refused(
    page_loop: tuple[LoopProcess, Client], root: Root
) -> None:
    _, c = page_loop
    manifest = root.manifest_path.read_text()
    status, _, text = c.call("POST", "/page/switch", {"csrf": "x", "topology": "split"})
    assert status == 401 and 'id="login"' in text, "no session: the login form, nothing done"
    c.login()
    for path, form in (
        ("/page/switch", {"topology": "split"}),
        ("/page/apply", {"plan_id": "0" * 32}),
        ("/page/reclaim", {"confirm": "yes", "path": str(root.shm / "vllm_offload_x.mmap")}),
        ("/page/probe", {"recipe": "omni"}),
        ("/page/plan", {}),
        ("/page/logout", {}),
    ):
        for csrf in (None, "wrong"):
            status, _, _ = c.call("POST", path, {**form, **({"csrf": csrf} if csrf else {})})
            assert status == 403, (path, csrf)
    assert root.manifest_path.read_text() == manifest, "nothing was changed"
    refused = [r for r in root.cli("audit", "--json").data["records"] if r.get("front") == "web"]
    assert refused and all(r["outcome"] == "refused" for r in refused), refused
    # A body that is not a form is refused by the guard before any route.
    status, _, _ = c.call("POST", "/page/switch", {"csrf": c.csrf()}, headers={"Content-Type": "application/json"})
    assert status == 400
    # A plan saved on the page, then the host's files change: its apply is refused as stale, as on the command line.
    status, _, review = c.call("POST", "/page/plan", {"csrf": c.csrf()})
    plan_id = re.search(r'id="plan-id">([0-9a-f]{32})<', review).group(1)  # type: ignore[union-attr]
    assert status == 200 and 'id="nothing-to-do"' in review
    status, _, _ = c.call("POST", "/page/switch", {"csrf": c.csrf(), "topology": "split"})
    assert status == 303 and "topology: split" in root.manifest_path.read_text()
    status, hdrs, _ = c.call("POST", "/page/apply", {"csrf": c.csrf(), "plan_id": plan_id})
    assert status == 303
    _, _, page = c.call("GET", "/")
    assert 'data-outcome="stale"' in page, page[:2000]
    records = [r for r in root.cli("audit", "--json").data["records"] if r.get("front") == "web"]
    assert [r["outcome"] for r in records if r["action"] == "apply"][-1] == "stale", records
    done = [r for r in records if r["action"] in ("apply", "switch") and r["outcome"] != "refused"]
    assert done and {r["who"] for r in done} == {"ops-token"}, records
    # Logged out: the session is gone.
    status, hdrs, _ = c.call("POST", "/page/logout", {"csrf": c.csrf()})
    assert status == 303 and "Max-Age=0" in hdrs["set-cookie"]
    status, _, _ = c.call("GET", "/page/live")
    assert status == 401


def test_every_template_and_static_file_is_package_data() -> None:
    """A wheel carries what the page reads at run time: every file of the page's package that is not Python matches
    a glob of pyproject.toml's package-data (setuptools' build_py copies exactly those)."""
    import fnmatch
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["reconciler"]
    pkg = repo / "reconciler"
    data = [p.relative_to(pkg).as_posix() for p in (pkg / "api" / "page").rglob("*") if p.is_file()]
    data = [d for d in data if not d.endswith((".py", ".pyc")) and "__pycache__" not in d]
    assert {"api/page/templates/page.html", "api/page/static/page.js", "api/page/static/page.css"} <= set(data)
    assert [d for d in data if not any(fnmatch.fnmatch(d, g) for g in globs)] == []


def test_a_host_file_that_does_not_validate_is_said_on_the_page(
    page_loop: tuple[LoopProcess, Client], root: Root
) -> None:
    _, c = page_loop
    c.login()
    host = root.path / "configs" / "host.yaml"
    host.write_text(host.read_text() + "gpu_telemetry: [nonsense\n")
    status, _, page = c.call("GET", "/")
    assert status == 200 and 'id="error"' in page and "configs/host.yaml" in page, page[:1500]
