"""A password in ``docker.url`` (``tcp://user:password@host``, ``http://user:password@...``) is printed nowhere: not
by ``status`` or ``plan`` (text, JSON and their errors), not by ``apply`` or ``validate``, and not by a running
loop's log. Whole processes against an engine address that does not answer (a closed port) and one that accepts and
never answers (``docker.timeout_s`` then ends the wait)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from e2e_helpers import LoopProcess, Root, free_port

pytestmark = [pytest.mark.docker, pytest.mark.root]

PASSWORD = "hunter2-url-pass"


def _set_url(root: Root, url: str) -> None:
    path = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["docker"].update(url=url, timeout_s=1)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("scheme", ["tcp", "http"])
def test_a_password_in_docker_url_is_never_printed(root: Root, start_loop, scheme: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        for port in (free_port(), silent.getsockname()[1]):
            _set_url(root, f"{scheme}://admin:{PASSWORD}@127.0.0.1:{port}")
            outputs = {}
            for args in (
                ("status",),
                ("status", "--json"),
                ("plan",),
                ("plan", "--json"),
                ("apply", "--yes"),
                ("validate",),
            ):
                r = root.cli(*args, timeout=60)
                assert "Traceback" not in r.stderr, r
                outputs[" ".join(args)] = r.stdout + r.stderr
            assert "admin:***@" in outputs["status"], outputs["status"]
            lp: LoopProcess = start_loop("--log-format", "text")
            try:
                import time

                deadline = time.monotonic() + 30
                while not any("source-down" in ln for ln in lp.other) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert any("source-down" in ln for ln in lp.other), lp.log()
                _, body = lp.healthz()
                outputs["/healthz"] = str(body)
            finally:
                lp.stop()
            outputs["log"] = "\n".join(lp.other)
            leaked = [where for where, text in outputs.items() if PASSWORD in text]
            assert not leaked, {where: outputs[where][:800] for where in leaked}
    finally:
        silent.close()
