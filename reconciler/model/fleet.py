"""A fleet file as pydantic types: the hosts one operator watches together, each by its loop's listener.

Read by ``reconciler.load.fleet`` for ``reconciler fleet status --fleet FILE`` and a host's canary check
(``source.after``). A host's own files stay its own: the fleet file only says where each host answers, with which
token file, and which CA signed its listener's certificate. A token is sent off loopback over TLS alone (its
certificate verified), or over plain HTTP where the host's entry says ``insecure: true``.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from reconciler.model.rules import NAME_PATTERN
from reconciler.model.strict import _pattern, _Strict


class FleetHost(_Strict):
    """One host of the fleet: its name and its loop's listener."""

    name: str = Field(
        description="The host's name (its configs/host.yaml name).", json_schema_extra=_pattern(NAME_PATTERN)
    )
    url: str = Field(
        description="https://ADDRESS:PORT of the host's `reconciler run --metrics-addr` listener (http:// on "
        "loopback, or with insecure: true)."
    )
    token_file: str | None = Field(
        default=None,
        description="A file holding the host's read token (its state directory's api-token-read; the running "
        "user's, mode 0600): sent as a bearer token, never printed. Without it the host's status is not asked.",
    )
    ca: str | None = Field(
        default=None,
        description="A PEM file of the CA that signed the host's listener certificate (its api.tls.cert): the "
        "certificate and the url's address or name are verified against it before the token is sent. Without "
        "it, against this machine's trusted CAs. https:// URLs only.",
    )
    insecure: bool = Field(
        default=False,
        description="Send the token over plain http:// to an address off loopback (in clear: only on a link "
        "nobody else can read).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        try:
            u = urlsplit(v)
            port = u.port
        except ValueError as exc:
            raise ValueError(f"url {v!r} is not a URL: {exc}") from None
        if u.scheme not in ("http", "https") or not u.hostname or port is None:
            raise ValueError(f"url {v!r}: give http(s)://ADDRESS:PORT of the host's listener")
        if u.username or u.password:
            raise ValueError("url: no credentials in the URL (they would be printed); use token_file")
        if u.path not in ("", "/") or u.query or u.fragment:
            raise ValueError(f"url {v!r}: the listener's address alone, no path or query")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _transport(self) -> FleetHost:
        u = urlsplit(self.url)
        if u.scheme == "http" and self.ca is not None:
            raise ValueError(f"ca: a CA verifies an https:// listener; {self.url} is plain HTTP (use https://)")
        if u.scheme == "http" and not self.insecure and not _loopback(u.hostname or ""):
            raise ValueError(
                f"url {self.url}: plain HTTP off loopback sends the token in clear to whatever answers there: use "
                "https:// (the host's api.tls, with ca: its CA's PEM file), or set insecure: true for this host"
            )
        return self


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


class FleetFile(_Strict):
    """The hosts ``reconciler fleet status`` reads, in the order it shows them."""

    hosts: list[FleetHost] = Field(min_length=1, max_length=1024, description="Every host of the fleet.")
    timeout_s: float = Field(default=5.0, gt=0, le=300, description="How long each host has to answer (seconds).")

    @model_validator(mode="after")
    def _unique(self) -> FleetFile:
        seen: set[str] = set()
        for h in self.hosts:
            if h.name in seen:
                raise ValueError(f"hosts: {h.name!r} is named twice; each host once")
            seen.add(h.name)
        return self
