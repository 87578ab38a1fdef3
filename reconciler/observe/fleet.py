"""Another host of the fleet read through its own loop's API: ``GET /v1/status`` with that host's token, within a
timeout, its answer or why there is none (``HostRow``). Never guessed: a host that does not answer is unreachable.

Read by ``reconciler fleet status`` (``reconciler.service.fleet``) and by a host waiting for its canaries
(``reconciler.load.source_sync``). A token is sent to its own host only and never shown; to a listener of this host
only once it is proven that host's loop (``reconciler.observe.loop_listener``: a local user who took the loop's port
gets no request, and the row says why); to an https:// host only once its certificate is verified (against the CA of
its fleet entry, else this machine's) for the URL's address or name: a listener that cannot prove it is the host's
gets no token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reconciler.base import direct_http, fsafe
from reconciler.base.redact import redact_data, redact_text
from reconciler.model.fleet import FleetHost
from reconciler.observe.loop_listener import ListenerNotProven, proven_opener
from reconciler.plan.verdict import WORDS, decide

if TYPE_CHECKING:
    import ssl

ANSWER_LIMIT = 16 << 20  # the most a host's status may be


@dataclass(frozen=True)
class HostRow:
    """One host as the fleet view shows it: reachable with its status, or why not."""

    name: str
    url: str
    reachable: bool
    seconds: float
    error: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    # Why there is no status, in a word, when there is none: "unauthorized" (its API refused the token, 401),
    # "forbidden" (403), "refused" (nothing listens: the connection was refused), else "unreachable".
    why: str = ""

    @property
    def verdict(self) -> str:
        if not self.reachable:
            return self.why or "unreachable"
        # The verdict the host's own views give (``reconciler.plan.verdict``): the one its status carries, else
        # (a host of an older release) the same function over its status; in the fleet's words for two of them.
        s = self.status
        v = s.get("verdict")
        word = v["word"] if isinstance(v, dict) and v.get("word") in WORDS else decide(s).word
        return {"invalid": "files invalid", "unavailable": "source unavailable"}.get(word, word)

    def slots(self) -> list[dict[str, Any]]:
        out = []
        for name, v in (self.status.get("slots") or {}).items():
            holders = [
                {
                    "name": c.get("name"),
                    "recipe": c.get("recipe"),
                    "sleeping": c.get("sleeping"),
                    "owner": c.get("owner"),
                }
                for c in v.get("containers") or ()
            ]
            out.append(
                {
                    "slot": name,
                    "desired": v.get("desired"),
                    "holders": holders,
                    "free": v.get("free"),
                    "memory_free_bytes": v.get("memory_free_bytes"),
                    "reserve_bytes": v.get("reserve_bytes"),
                    "below_reserve": v.get("below_reserve"),
                    "asleep_bytes": v.get("asleep_bytes"),
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        s = self.status
        shm = s.get("shm") or {}
        loop = s.get("loop") or {}
        return {
            "name": self.name,
            "url": self.url,
            "reachable": self.reachable,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "verdict": self.verdict,
            "host": s.get("host"),
            "converged": s.get("converged"),
            "topology": s.get("topology"),
            "commit": (s.get("source") or {}).get("commit") if isinstance(s.get("source"), dict) else None,
            "last_pass": (loop.get("last_pass") or {}).get("result") if isinstance(loop, dict) else None,
            "slots": self.slots(),
            "lanes": [
                {
                    "name": c.get("name"),
                    "recipe": c.get("recipe"),
                    "slots": c.get("slots"),
                    "sleeping": c.get("sleeping"),
                }
                for c in s.get("containers") or ()
                if c.get("owner") == "ours" and c.get("state") == "running"
            ],
            "tmpfs": shm.get("tmpfs"),
        }


def _not_verified(h: FleetHost, reason: ssl.SSLCertVerificationError) -> str:
    trusted = f"the CA of {h.ca}" if h.ca else "this machine's CAs (give the host's CA: ca: FILE)"
    return (
        f"{h.url} is not the host's listener as far as its certificate proves ({reason.verify_message}, "
        f"verified against {trusted}): no token was sent"
    )


def _refused(code: int) -> str:
    if code == 401:
        return " (the token is refused)"
    if code == 403:
        return " (the token's scope does not allow it)"
    return ""


def _fetch(h: FleetHost, token: str, context: ssl.SSLContext | None, timeout: float) -> bytes | tuple[str, str]:
    """The body of the host's ``GET /v1/status`` (at most ANSWER_LIMIT + 1 bytes), or why there is none (a word for
    the verdict, and the sentence); the token goes only over a connection proven the host's loop (loopback) and a
    certificate verified (https)."""
    # The start-up budget: urllib.request and ssl are loaded by the first host asked (fleet status, a canary), not
    # by every command that imports the source's follower.
    import ssl
    import urllib.error
    import urllib.request

    req = urllib.request.Request(h.url + "/v1/status", method="GET")  # noqa: S310 - http(s) only (model.fleet)
    req.add_header("Authorization", f"Bearer {token}")
    try:
        with proven_opener(h.name, context).open(req, timeout=timeout) as resp:
            return bytes(resp.read(ANSWER_LIMIT + 1))
    except urllib.error.HTTPError as exc:
        why = {401: "unauthorized", 403: "forbidden"}.get(exc.code, "unreachable")
        return why, f"GET {h.url}/v1/status answered {exc.code}" + _refused(exc.code)
    except ListenerNotProven as exc:
        return "unreachable", f"the token was not sent to {h.url}: {exc}"
    except direct_http.errors() as exc:  # URLError among them
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ListenerNotProven):
            return "unreachable", f"the token was not sent to {h.url}: {reason}"
        if isinstance(reason, ssl.SSLCertVerificationError):
            return "unreachable", _not_verified(h, reason)
        if isinstance(reason, ConnectionRefusedError) or isinstance(exc, ConnectionRefusedError):
            return "refused", f"{h.url} refused the connection: nothing listens there (is its loop running?)"
        return "unreachable", f"no answer from {h.url} within {timeout:g} s: {type(exc).__name__}: {exc}"


def ask_host(h: FleetHost, timeout: float) -> HostRow:
    """One host's status, or why there is none."""
    t0 = time.monotonic()

    def row(error: str = "", status: dict[str, Any] | None = None, why: str = "") -> HostRow:
        seconds = time.monotonic() - t0
        return HostRow(h.name, h.url, status is not None, seconds, redact_text(error), status or {}, why)

    if h.token_file is None:
        return row("no token_file for this host in the fleet file: its status needs its API token")
    try:
        token = fsafe.read_trusted(h.token_file, what=f"the token file of host {h.name}", secret=True, limit=4096)
        value = token.decode("ascii").strip()
    except (OSError, fsafe.UnsafePath, UnicodeDecodeError) as exc:
        return row(f"cannot read its token file {h.token_file}: {getattr(exc, 'strerror', None) or exc}")
    import ssl  # on first use (the start-up budget)

    try:
        context = ssl.create_default_context(cafile=h.ca) if h.url.startswith("https:") else None
    except (OSError, ssl.SSLError) as exc:
        return row(f"cannot read its CA file {h.ca}: {getattr(exc, 'strerror', None) or exc}; no token was sent")
    fetched = _fetch(h, value, context, timeout)
    if isinstance(fetched, tuple):
        why, error = fetched
        return row(error, why=why)
    body = fetched
    if len(body) > ANSWER_LIMIT:
        return row(f"{h.url}/v1/status answered more than {ANSWER_LIMIT >> 20} MiB")
    try:
        data = json.loads(body)
    except ValueError:
        return row(f"{h.url}/v1/status answered something that is not JSON")
    if not isinstance(data, dict):
        return row(f"{h.url}/v1/status answered JSON that is not a status")
    if data.get("host") not in (None, h.name):
        return row(f"{h.url} answers for host {data.get('host')!r}, not {h.name!r}: fix the fleet file")
    return row(status=redact_data(data))
