"""A fleet file as pydantic types: the hosts one operator watches together, each by its loop's listener.

Read by ``reconciler.load.fleet`` for ``reconciler fleet status --fleet FILE``. A host's own files stay its own: the
fleet file only says where each host answers and with which token file.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from reconciler.model.rules import NAME_PATTERN
from reconciler.model.strict import _pattern, _Strict


class FleetHost(_Strict):
    """One host of the fleet: its name and its loop's listener."""

    name: str = Field(
        description="The host's name (its configs/host.yaml name).", json_schema_extra=_pattern(NAME_PATTERN)
    )
    url: str = Field(description="http(s)://ADDRESS:PORT of the host's `reconciler run --metrics-addr` listener.")
    token_file: str | None = Field(
        default=None,
        description="A file holding the host's API token (the running user's, mode 0600): sent as a bearer token, "
        "never printed. Without it the host's status is not asked.",
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
