"""Faults a campaign injected, each started for real and answered by a clear error and exit 1 (never a traceback),
or, for ``reconciler run``, by a loop that reports the fault, waits and recovers.

- the Docker engine down: ``docker.url`` points at a unix socket where nothing listens (the machine's shared
  engine is never stopped); for the loop, a socket that a forwarder started by the test brings alive later
  (and takes away again), relaying to the real engine;
- an unwritable lock directory: under a path whose parent is a regular file, and on a read-only tmpfs (root
  ignores permission bits, not these);
- a metrics address already in use: a real socket bound and listening first.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import DOCKER_URL
from e2e_helpers import LoopProcess, Root, free_port, wait_until

from reconciler.store.lock import HostLock

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"


# ---------------------------------------------------------------- a docker socket the test controls


class SocketRelay:
    """A unix socket at ``path`` that relays every connection to the real engine's socket, until ``stop``.

    Started and stopped by the test: stopping closes the listener and every relayed connection (the loop's event
    stream included) and removes the socket file, so the engine looks down again."""

    def __init__(self, path: Path, target: str):
        self.path = path
        self.target = target
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> SocketRelay:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(self.path))
        srv.listen(64)
        self._listener = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()
        return self

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return  # closed by stop()
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def engine_socket() -> str:
    assert DOCKER_URL.startswith("unix://"), (
        f"these tests relay a unix socket; RECONCILER_TEST_DOCKER_URL is {DOCKER_URL}"
    )
    return DOCKER_URL[len("unix://") :]


def set_docker_url(root: Root, url: str) -> None:
    path = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["docker"]["url"] = url
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


# ---------------------------------------------------------------- fixtures


# ---------------------------------------------------------------- 1. apply with the engine down


def test_apply_with_the_engine_down_is_a_clear_error(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    dead = f"unix://{tmp_path / 'nothing-listens.sock'}"
    set_docker_url(root, dead)
    for args in (("apply", "--yes"), ("apply", "--yes", "--json")):
        r = root.cli(*args)
        assert r.rc == 1, r
        no_traceback(r.stderr + r.stdout)
        assert f"docker source unavailable at {dead}: " in r.stderr, r
        assert "Start the Docker engine, or fix docker.url" in r.stderr, r
    assert root.containers() == [], "nothing was created"
    # The read-only commands agree that the engine is down.
    for args in (("plan",), ("status",)):
        r = root.cli(*args)
        assert r.rc == 1, r
        no_traceback(r.stderr)
        assert "docker" in r.stderr and "unavailable" in r.stderr, r


# ---------------------------------------------------------------- 2. run while the engine is down


def test_run_started_with_the_engine_down_reports_it_waits_and_converges_when_it_answers(
    root: Root, tmp_path: Path, start_loop: Callable[..., LoopProcess]
) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    relay = SocketRelay(tmp_path / "docker.sock", engine_socket())
    set_docker_url(root, f"unix://{relay.path}")
    try:
        lp = start_loop().started(timeout=30)
        # The first pass sees the engine down: said once in the log, exported, and /healthz answers 503.
        down = lp.wait("source-down", source="docker", timeout=5)[0]
        assert str(relay.path) in down["detail"], down
        assert lp.find("pass", result="error"), lp.log()
        # The pass logs source-down a moment before it exports what it observed: wait for the export.
        wait_until(lambda: lp.metric("reconciler_source_up", source="docker") == 0, timeout=5, what="source_up 0")
        code, health = lp.healthz()
        assert code == 503 and health["ok"] is False and "docker" in health["unavailable"], (code, health)
        assert lp.proc.poll() is None, "the loop waits for the engine instead of dying"
        assert root.containers() == []

        # The engine answers: the loop notices on its own (resync is 60 s) and converges.
        mark = lp.mark()
        relay.start()
        lp.wait("source-up", source="docker", after=mark, timeout=30)
        lp.wait("action", kind="enter", result="ok", after=mark, timeout=60, target=lambda t: t.startswith(omni + "@"))
        assert root.cname(omni, B) in root.running()
        wait_until(lambda: lp.healthz()[0] == 200, timeout=10, what="/healthz 200 once the engine answers")
        assert lp.metric("reconciler_source_up", source="docker") == 1

        # The engine goes away under a running loop: reported again, nothing torn down, and back again.
        mark = lp.mark()
        relay.stop()
        lp.wait("source-down", source="docker", after=mark, timeout=30)
        wait_until(lambda: lp.metric("reconciler_source_up", source="docker") == 0, timeout=5, what="source_up 0")
        assert lp.healthz()[0] == 503
        assert root.cname(omni, B) in root.running(), "an engine that does not answer tears nothing down"
        mark = lp.mark()
        relay.start()
        lp.wait("source-up", source="docker", after=mark, timeout=30)
        wait_until(lambda: lp.healthz()[0] == 200, timeout=10, what="/healthz 200 again")
        assert not lp.find("action", after=mark), "the lane kept running: nothing to do"
        assert lp.proc.poll() is None
    finally:
        relay.stop()
    assert lp.stop() == 0
    no_traceback("\n".join(lp.other))


# ---------------------------------------------------------------- 3. an unwritable lock directory


def unwritable_lock_dirs(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    parent_file = tmp_path / "a-regular-file"
    parent_file.write_text("not a directory\n")
    yield "parent is a file", parent_file / "lock"
    ro = tmp_path / "read-only"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        yield "read-only filesystem", ro / "lock"
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def test_an_unwritable_lock_dir_is_a_clear_error_for_apply_and_run(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, [B]))
    for what, lock_dir in unwritable_lock_dirs(tmp_path):
        root.env["RECONCILER_LOCK_DIR"] = str(lock_dir)
        apply = root.cli("apply", "--yes")
        run = root.cli("run", "--metrics-addr", f"127.0.0.1:{free_port()}", timeout=30)
        for r in (apply, run):
            assert r.rc == 1, (what, r)
            no_traceback(r.stderr + r.stdout)
            assert str(lock_dir) in r.stderr and "RECONCILER_LOCK_DIR" in r.stderr, (what, r)
        assert "cannot take the host lock" in apply.stderr, apply
    assert root.containers() == [], "nothing was done without the lock"


# ---------------------------------------------------------------- 4. the metrics address in use


def test_a_metrics_address_in_use_never_ends_the_loop_and_is_said(
    root: Root, start_loop: Callable[..., LoopProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An address another process holds is no reason to stop reconciling (docs/design.md, "Threat model"): the loop
    runs, says in its log who holds the address, and binds it once it is free."""
    root.manifest()
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        lp = start_loop("--metrics-addr", f"127.0.0.1:{port}", "--resync", "600")
        lp.wait("http-listener-unbound", timeout=60)
        assert lp.proc.poll() is None, lp.log()
        lp.wait("pass", timeout=60)
    finally:
        taken.close()
    lp.wait("http-listener-bound", timeout=90)
    assert lp.proc.poll() is None, lp.log()
    no_traceback(lp.log())
    lp.proc.send_signal(signal.SIGTERM)
    lp.proc.wait(timeout=30)
    # It let go of the host lock on its way out.
    monkeypatch.setenv("RECONCILER_LOCK_DIR", root.env["RECONCILER_LOCK_DIR"])
    HostLock(root.host, command="test").acquire().release()

    r = root.cli("run", "--metrics-addr", "not-an-address", timeout=30)
    assert r.rc == 1, r
    no_traceback(r.stderr + r.stdout)
    assert "cannot serve /metrics on not-an-address" in r.stderr, r
