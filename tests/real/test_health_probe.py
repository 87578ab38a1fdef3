"""A health check that cannot be fooled.

The fault: something already answered a recipe's health URL before its container started (a stale server on the
port, another lane with host networking), so ``apply`` reported the new engine "healthy ... converged" and the
engine died seconds later on "Address already in use". Now an enter first checks that nothing answers the URL,
checks after health passes that its container still runs, and again after ``health.settle_s``; and the probes
never go through a proxy named in the environment (``http_proxy``).

The probe functions are tested on real local servers; the enter against the real engine with real fake-vllm
containers, through the real command line.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from e2e_helpers import Root, free_port

from reconciler.apply.http_check import _http_answer, _http_ok

B = "dark-compute-b"
PRESERVED_RE = re.compile(r"-failed-\d{8}-\d{6}$")


@contextlib.contextmanager
def http_server(port: int = 0, status: int = 200) -> Iterator[int]:
    """A real HTTP server on 127.0.0.1 answering every GET with ``status``; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"stale server\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def dead_proxy(monkeypatch: pytest.MonkeyPatch) -> str:
    """http_proxy (both spellings) set to a port where nothing listens, and no no_proxy to exempt 127.0.0.1."""
    proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return proxy


# ---------------------------------------------------------------- the probes, on real local servers


def test_health_probes_never_use_a_proxy(dead_proxy: str) -> None:
    with http_server() as port:
        url = f"http://127.0.0.1:{port}/health"
        # The environment really routes urllib through the dead proxy: a default opener fails... (a fresh one:
        # urlopen's global opener would keep the dead proxy for every later test in this process)
        with pytest.raises(urllib.error.URLError):
            urllib.request.build_opener().open(url, timeout=2)
        # ...and the probes go straight to the server.
        assert _http_ok(url) is True
        assert _http_answer(url) == "HTTP 200"
    assert _http_ok(url) is False, "nothing listens any more"
    assert _http_answer(url) is None


def test_what_answers_a_health_url() -> None:
    assert _http_answer(f"http://127.0.0.1:{free_port()}/health") is None, "a refused connection: nothing answers"
    with http_server(status=503) as port:
        url = f"http://127.0.0.1:{port}/health"
        assert _http_ok(url) is False, "not healthy..."
        assert _http_answer(url) == "HTTP 503", "...but something answers there"
    # A listener that accepts and never says a word still holds the port the engine needs.
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        what = _http_answer(f"http://127.0.0.1:{silent.getsockname()[1]}/health", timeout=0.3)
        assert what is not None and "accepts connections" in what, what
    finally:
        silent.close()
    assert _http_answer("not a url") is None


# ---------------------------------------------------------------- the enter, against the real engine


@pytest.mark.docker
@pytest.mark.root
def test_an_enter_whose_health_url_already_answers_is_blocked_and_nothing_is_reported_healthy(
    root: Root, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something already serving on the recipe's port is found by plan (docs/design.md, "Knowable failures of an
    enter"): blocked, nothing created; and should it appear after the plan, the enter's own preflight refuses it
    before the create, with the message it always gave."""
    from reconciler.apply.applier import Applier
    from reconciler.apply.errors import ActionFailed
    from reconciler.apply.port_checks import check_ports_free
    from reconciler.load.desired import load_desired
    from reconciler.plan.actions import Action, ActionKind

    port = free_port()
    omni = root.recipe("omni", port=port)
    root.manifest((omni, [B]))
    url = f"http://127.0.0.1:{port}/health"
    with http_server(port):
        plan = root.cli("plan", "--json")
        r = root.apply()
        monkeypatch.setenv("RECONCILER_STATE_DIR", root.env["RECONCILER_STATE_DIR"])
        desired = load_desired(str(root.path))
        applier = Applier(desired, connect=False)
        action = Action(ActionKind.ENTER, "test", recipe=omni, gpus=(B,), container=root.cname(omni, B))
        with pytest.raises(ActionFailed) as failed:
            check_ports_free(applier.context, action, desired.recipes[omni])
    assert plan.rc == 3, plan
    reasons = " | ".join(b["reason"] for b in plan.data["blockers"])
    assert f"port {port} of recipe {omni} ({url})" in reasons and f"pid {os.getpid()}" in reasons, reasons
    assert r.rc == 3 and r.data["result"] == "blocked" and r.data["actions"] == [], r
    assert "healthy" not in r.stdout and "converged" not in r.stdout, r
    # The enter's own preflight, should the squatter appear after the plan: the holder is named from /proc (this
    # test's own process), never asked.
    cause = failed.value.cause
    assert f"port {port} (health.url)" in cause and "already bound" in cause, cause
    assert f"pid {os.getpid()} (" in cause and f"listening on 127.0.0.1:{port}" in cause, cause
    assert root.containers() == [], "refused before create: no container, kept or running"

    # The squatter is gone: the same apply converges, and the health check now hears the engine itself.
    r = root.apply()
    assert r.rc == 0, r
    assert root.cname(omni, B) in root.running()


@pytest.mark.docker
@pytest.mark.root
def test_a_container_that_dies_within_settle_after_health_fails_its_enter(root: Root) -> None:
    # Healthy at once, then SIGKILLed about a second later: inside settle_s, so the enter must not succeed.
    omni = root.recipe("omni", mode="crash-after=1", settle_s=6)
    root.manifest((omni, [B]))
    r = root.apply()
    assert r.rc == 1, r
    [enter] = r.data["actions"]
    assert enter["kind"] == "enter" and enter["result"] == "failed", enter
    assert "Kept as" in enter["detail"], enter
    names = [c["Names"][0].lstrip("/") for c in root.containers()]
    assert len(names) == 1 and PRESERVED_RE.search(names[0]), names
    assert root.running() == {}


@pytest.mark.docker
@pytest.mark.root
def test_an_enter_converges_with_a_dead_http_proxy_in_the_environment(root: Root) -> None:
    proxy = f"http://127.0.0.1:{free_port()}"
    root.env.update(http_proxy=proxy, HTTP_PROXY=proxy)
    for name in ("no_proxy", "NO_PROXY"):
        root.env.pop(name, None)
    omni = root.recipe("omni", start_timeout_s=6)
    root.manifest((omni, [B]))
    r = root.apply()
    assert r.rc == 0, r
    assert r.data["result"] == "converged", r.data
    assert root.cname(omni, B) in root.running()
