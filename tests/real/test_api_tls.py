"""The loop's listener over TLS, and the read token, for real: a throwaway CA made by the test (the ``openssl``
command line), a real ``reconciler run`` serving HTTPS with host.yaml's ``api.tls``, real HTTP clients that verify
its certificate, ``reconciler fleet status`` as a whole process, and a listener of the test's own that records what
reaches it.

- the listener serves HTTPS with the certificate; a client verifying against the CA is answered, one that trusts
  only this machine's CAs (or speaks plain HTTP) is not; under TLS /metrics needs a token (the read one suffices);
- the read token (``api-token-read`` beside ``api-token``, made 0600 on first start): reads are answered, and every
  write (apply, switch, reclaim, sync, a plan kept for an apply, MCP) is 403 naming the scope and changes nothing;
  a page session opened with it is read-only; the page's session cookie is ``Secure``;
- a real Prometheus with examples/prometheus-fleet.yml's job as shipped (https, the CA, the read token) scrapes it;
- ``fleet status`` with the host's CA reads it; with another CA it refuses, says why, and sends no token (the
  recording listener gets not one byte of a request);
- neither token is in the loop's log, its metrics, or any output.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import ssl
import stat
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import LoopProcess, Root, fleet_prometheus, stop_process, wait_until

from real.test_api import TOKEN, token_file

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"


# ---------------------------------------------------------------- a throwaway CA


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA's certificate (PEM)
    cert: Path  # the listener's, signed by it, for 127.0.0.1 and localhost
    key: Path


def _openssl(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stderr


def make_pki(d: Path, name: str = "test") -> Pki:
    """A CA and a server certificate it signs (EC P-256, two days), every file 0600 in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key, key, csr, cert = (d / f"{name}-{x}" for x in ("ca.pem", "ca.key", "key.pem", "req.csr", "cert.pem"))
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", f"/CN={name} CA")
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=reconciler")
    ext = d / f"{name}-ext.cnf"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    for f in d.iterdir():
        f.chmod(0o600)
    return Pki(ca, cert, key)


def _set_api(root: Root, api: dict[str, Any]) -> None:
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["api"] = api
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))


# ---------------------------------------------------------------- clients


def call(
    base: str,
    method: str,
    path: str,
    *,
    ca: Path | None,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One HTTPS request verified against ``ca`` (or this machine's CAs): (status, headers, JSON or text)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPSConnection(
        u.hostname or "", u.port, timeout=60, context=ssl.create_default_context(cafile=str(ca) if ca else None)
    )
    hdrs = dict(headers or {})
    data = None
    if body is not None:
        data = body if isinstance(body, str) else json.dumps(body)
        hdrs.setdefault("Content-Type", "application/json")
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode()
        got = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    try:
        return resp.status, got, json.loads(text)
    except ValueError:
        return resp.status, got, text


class Recorder:
    """A TLS listener of the test's own (its certificate from another CA, for the same address): every byte that
    reaches it after a handshake is kept. A client that refuses its certificate sends none."""

    def __init__(self, pki: Pki):
        self.got: list[bytes] = []
        self.handshakes = 0
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(pki.cert), str(pki.key))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    tls = self.context.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):
                    continue  # the client refused the certificate: nothing was sent
                self.handshakes += 1
                try:
                    while chunk := tls.recv(65536):
                        self.got.append(chunk)
                except (ssl.SSLError, OSError):
                    pass

    def close(self) -> None:
        self.sock.close()


def everything_said(lp: LoopProcess) -> str:
    return "\n".join([json.dumps(e.data) for e in lp.events] + lp.other)


@pytest.fixture
def tls_loop(root: Root, tmp_path: Path) -> Iterator[tuple[LoopProcess, str, Pki, str]]:
    """A real `reconciler run` serving HTTPS (host.yaml's api.tls) on loopback, behind a token file of the test's
    own; (it, its base URL, the PKI, the read token)."""
    omni = root.recipe("omni")
    root.write_manifest_text(
        f"host: {root.host}\ntopology: none\ntopologies:\n  none: []\n  split:\n    - recipe: {omni}\n      gpus: [{B}]\n"
    )
    pki = make_pki(tmp_path / "pki")
    _set_api(root, {"tls": {"cert": str(pki.cert), "key": str(pki.key)}})
    tf = token_file(tmp_path)
    lp = LoopProcess(root, "--api-token-file", str(tf)).started(timeout=40)
    try:
        read_file = Path(root.env["RECONCILER_STATE_DIR"]) / root.host / "api-token-read"
        assert stat.S_IMODE(read_file.stat().st_mode) == 0o600
        yield lp, f"https://{lp.addr}", pki, read_file.read_text().strip()
    finally:
        lp.stop()


# ---------------------------------------------------------------- the tests


def test_the_listener_serves_https_verified_by_its_ca_and_the_read_token_reads_only(
    tls_loop: tuple[LoopProcess, str, Pki, str], root: Root, tmp_path: Path
) -> None:
    lp, base, pki, read = tls_loop
    (api,) = lp.find("api")
    assert api["addr"].startswith("https://") and api["read_token_from"].endswith("api-token-read (generated)"), api
    # A client that verifies against the CA is answered; one that trusts only this machine's CAs is not, nor one
    # that speaks plain HTTP to it.
    status, _, body = call(base, "GET", "/v1/status", ca=pki.ca, token=TOKEN)
    assert status == 200 and body["host"] == root.host, body
    with pytest.raises(ssl.SSLCertVerificationError):
        call(base, "GET", "/healthz", ca=None)
    plain = http.client.HTTPConnection("127.0.0.1", lp.port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/healthz")
        plain.getresponse().read()
    plain.close()
    # Under TLS /metrics needs a token (the read one, as Prometheus is given); /healthz does not.
    assert call(base, "GET", "/metrics", ca=pki.ca)[0] == 401
    status, _, metrics = call(base, "GET", "/metrics", ca=pki.ca, token=read)
    assert status == 200 and "reconciler_" in metrics
    assert call(base, "GET", "/healthz", ca=pki.ca)[0] in (200, 503)

    # The read token reads.
    for path in ("/v1/status", "/v1/plan", "/v1/shm", "/v1/audit", "/v1/openapi.json"):
        status, _, body = call(base, "GET", path, ca=pki.ca, token=read)
        assert status == 200, (path, body)
    # And writes nothing: every write route is 403 naming the scope, with a plan the full token kept.
    status, _, saved = call(base, "GET", "/v1/plan?save=true", ca=pki.ca, token=TOKEN)
    assert status == 200 and saved["plan_id"], saved
    manifest = root.manifest_path.read_text()
    orphan = root.shm / "vllm_offload_orphan.mmap"
    orphan.write_bytes(b"\xab" * 4096)
    writes = [
        ("POST", "/v1/apply", {"plan_id": saved["plan_id"]}),
        ("POST", "/v1/switch", {"topology": "split"}),
        ("POST", "/v1/shm/reclaim", {"confirm": True, "paths": [str(orphan)]}),
        ("POST", "/v1/sync", {}),
        ("GET", "/v1/plan?save=true", None),
        ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ]
    for method, path, body in writes:
        headers = {"Accept": "application/json, text/event-stream"} if path == "/mcp" else {}
        status, _, answer = call(base, method, path, ca=pki.ca, token=read, body=body, headers=headers)
        assert status == 403, (path, status, answer)
        assert answer["scope"] == "read" and answer["needs"] == "write", answer
        assert "read scope" in answer["error"] and "write scope" in answer["error"], answer
    assert root.manifest_path.read_text() == manifest, "the switch changed the manifest"
    status, _, trail = call(base, "GET", "/v1/audit", ca=pki.ca, token=TOKEN)
    done = [
        r
        for r in trail["records"]
        if r.get("who") == "api-token-read" and r.get("outcome") != "refused" and r.get("action") != "probe"
    ]
    assert done == [], done
    refused = [r for r in trail["records"] if r.get("who") == "api-token-read" and r.get("outcome") == "refused"]
    assert refused, trail["records"][-10:]
    # The full token still does everything: the switch it asks is made.
    status, _, body = call(base, "POST", "/v1/switch", ca=pki.ca, token=TOKEN, body={"topology": "split"})
    assert status == 200 and "topology: split" in root.manifest_path.read_text(), body

    # The page over TLS: its session cookie is Secure; a session of the read token shows no write form and is
    # refused every write, CSRF token and all.
    def login(token: str) -> str:
        form = urllib.parse.urlencode({"token": token})
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Origin": base}
        status, hdrs, _ = call(base, "POST", "/page/login", ca=pki.ca, body=form, headers=headers)
        assert status == 303, status
        cookie = hdrs["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and token not in cookie, cookie
        return cookie.split(";")[0]

    cookie = login(read)
    status, _, page = call(base, "GET", "/", ca=pki.ca, headers={"Cookie": cookie})
    assert status == 200 and 'id="read-only"' in page and 'id="switch-form"' not in page, page[:2000]
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    manifest = root.manifest_path.read_text()
    form_headers = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded", "Origin": base}
    for path, form in (
        ("/page/switch", {"topology": "none"}),
        ("/page/plan", {}),
        ("/page/apply", {"plan_id": saved["plan_id"]}),
        ("/page/reclaim", {"confirm": "yes", "path": str(orphan)}),
    ):
        body = urllib.parse.urlencode({**form, "csrf": csrf}, doseq=True)
        status, _, text = call(base, "POST", path, ca=pki.ca, body=body, headers=form_headers)
        assert status == 403 and "read token" in text, (path, status)
    assert root.manifest_path.read_text() == manifest
    assert 'id="switch-form"' in call(base, "GET", "/", ca=pki.ca, headers={"Cookie": login(TOKEN)})[2]

    # Neither token anywhere the loop writes or answers.
    said = everything_said(lp) + metrics
    assert TOKEN not in said and read not in said


def test_fleet_status_verifies_the_hosts_certificate_and_sends_no_token_to_one_it_cannot_prove(
    tls_loop: tuple[LoopProcess, str, Pki, str], root: Root, tmp_path: Path
) -> None:
    _, base, pki, read = tls_loop
    other = make_pki(tmp_path / "other", name="other")
    read_file = token_file(tmp_path, value=read, name="gpu-box-read")
    impostor = Recorder(other)  # a listener with a certificate for the same address, from another CA
    fleet = tmp_path / "fleet.yaml"

    def fleet_status(hosts: list[dict[str, Any]]) -> tuple[int, dict[str, Any], str]:
        fleet.write_text(yaml.safe_dump({"hosts": hosts, "timeout_s": 5}))
        r = subprocess.run(
            [sys.executable, "-m", "reconciler", "fleet", "status", "--fleet", str(fleet), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert read not in r.stdout + r.stderr and TOKEN not in r.stdout + r.stderr
        return r.returncode, {h["name"]: h for h in json.loads(r.stdout)["hosts"]}, r.stderr

    try:
        # The host's CA: its status, read with the read token.
        rc, by, err = fleet_status([{"name": root.host, "url": base, "token_file": str(read_file), "ca": str(pki.ca)}])
        assert rc == 0 and by[root.host]["verdict"] == "converged", (by, err)
        # Another CA (or none: this machine's): refused, with why, and no token sent.
        for ca in (str(other.ca), None):
            host = {"name": root.host, "url": base, "token_file": str(read_file), **({"ca": ca} if ca else {})}
            rc, by, _ = fleet_status([host])
            error = by[root.host]["error"]
            assert rc == 1 and not by[root.host]["reachable"], by
            assert "certificate" in error and "no token was sent" in error, error
        # A listener that cannot prove it is the host's gets not one byte of a request, token or other.
        impostor_url = f"https://127.0.0.1:{impostor.port}"
        rc, by, _ = fleet_status(
            [{"name": root.host, "url": impostor_url, "token_file": str(read_file), "ca": str(pki.ca)}]
        )
        assert rc == 1 and "no token was sent" in by[root.host]["error"], by
        assert impostor.got == [] and impostor.handshakes == 0
        # Trusting its CA is not enough on loopback: the listener is not proven the loop's (no process of it holds
        # the host's lock), so the handshake is made and still not one byte of a request follows.
        rc, by, _ = fleet_status(
            [{"name": root.host, "url": impostor_url, "token_file": str(read_file), "ca": str(other.ca)}]
        )
        assert rc == 1 and "the token was not sent" in by[root.host]["error"], by
        assert impostor.handshakes == 1 and impostor.got == []
        # The recorder does record: a plain client that trusts its CA sends it a request.
        ctx = ssl.create_default_context(cafile=str(other.ca))
        with contextlib.suppress(OSError), urllib.request.urlopen(impostor_url + "/probe", timeout=10, context=ctx):
            pass
        wait_until(lambda: b"GET /probe" in b"".join(impostor.got), timeout=10, what="the recorder saw the request")
    finally:
        impostor.close()


def test_remote_without_tls_is_refused_unless_insecure_and_a_bad_key_is_refused_at_start(
    root: Root, tmp_path: Path
) -> None:
    root.manifest()
    tf = token_file(tmp_path)
    args = ("run", "--metrics-addr", "0.0.0.0:0", "--api-allow-remote", "--api-token-file", str(tf))
    r = root.cli(*args, timeout=30)
    assert r.rc == 1 and "--api-allow-remote without TLS" in r.stderr, r
    assert "configs/host.yaml" in r.stderr and "api.tls" in r.stderr and "insecure: true" in r.stderr, r
    assert "Traceback" not in r.stderr and TOKEN not in r.stdout + r.stderr
    # A key others may read, and a certificate that is not one: refused at start, naming the field.
    pki = make_pki(tmp_path / "pki")
    pki.key.chmod(0o644)
    _set_api(root, {"tls": {"cert": str(pki.cert), "key": str(pki.key)}})
    r = root.cli("run", "--api-token-file", str(tf), timeout=30)
    assert r.rc == 1 and "api.tls.key" in r.stderr and "readable by others" in r.stderr, r
    pki.key.chmod(0o600)
    pki.cert.write_text("not a certificate\n")
    r = root.cli("run", "--api-token-file", str(tf), timeout=30)
    assert r.rc == 1 and "api.tls" in r.stderr and "cannot be served" in r.stderr, r
    # Both tls and insecure: refused by validate, with the line.
    _set_api(root, {"tls": {"cert": str(pki.cert), "key": str(pki.key)}, "insecure": True})
    r = root.cli("validate", timeout=30)
    assert r.rc == 1 and "configs/host.yaml" in r.stderr and "drop insecure" in r.stderr, r


def test_prometheus_scrapes_the_tls_listener_with_the_read_token_as_the_fleet_example_says(
    tls_loop: tuple[LoopProcess, str, Pki, str], root: Root, tmp_path: Path
) -> None:
    lp, _, pki, read = tls_loop
    read_file = token_file(tmp_path, value=read, name="api-token-read")
    (tmp_path / "prom").mkdir()
    prom, base = fleet_prometheus(tmp_path / "prom", [(lp.addr, root.host)], tls=(pki.ca, read_file))
    try:
        check = subprocess.run(
            ["promtool", "check", "config", str(tmp_path / "prom" / "prometheus.yml")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr

        def scraped() -> dict[str, Any] | None:
            q = urllib.parse.quote('up{job="reconciler"}')
            try:
                conn = http.client.HTTPConnection(
                    base.removeprefix("http://").split(":")[0], int(base.rsplit(":", 1)[1])
                )
                conn.request("GET", "/api/v1/targets?state=active")
                targets = json.loads(conn.getresponse().read())["data"]["activeTargets"]
                conn.request("GET", f"/api/v1/query?query={q}")
                result = json.loads(conn.getresponse().read())["data"]["result"]
                conn.close()
            except (OSError, ValueError, KeyError):
                return None  # Prometheus still starting
            up = [r for r in result if r["value"][1] == "1"]
            return {"targets": targets} if up else None

        got = wait_until(scraped, timeout=60, what="Prometheus scraping the TLS listener with the read token")
        (target,) = got["targets"]
        assert target["scrapeUrl"].startswith("https://") and target["health"] == "up", target
    finally:
        stop_process(prom)
