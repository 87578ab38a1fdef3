"""Where the listener listens and which names it answers to: ``split_addr`` (``--metrics-addr``), ``bind``, the
exposure check (loopback unless ``--api-allow-remote``, and then only with a token given explicitly and over TLS,
or plain HTTP where host.yaml says ``api: {insecure: true}``) and
``AllowedHosts``, the ``Host:``/``Origin:`` values the guard accepts (and the MCP SDK's own check, from the same
names).

Called by the loop (``split_addr``, ``check_exposure``), the listener (``bind``), the guard and the app's assembly.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.api.errors import ApiSetupError
from reconciler.api.limits import BACKLOG
from reconciler.api.tokens import TOKEN_ENV, ApiToken


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; an empty host is 127.0.0.1); ValueError when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{addr!r} is not HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    n = int(port)
    if not 0 <= n <= 65535:
        raise ValueError(f"port {n} is out of range")
    return host, n


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (OSError when the address is in use or not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def check_exposure(
    host: str, *, allow_remote: bool, token: ApiToken, tls: bool = False, insecure: bool = False
) -> None:
    """Loopback by default; any other address needs ``--api-allow-remote``, a token given explicitly, and TLS
    (``tls``: host.yaml's ``api.tls``) unless host.yaml's ``api.insecure`` is set."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ApiSetupError(
            f"{host} is not a loopback address: the API and MCP (and their destructive calls) would be reachable "
            "from other machines. Pass --api-allow-remote to mean it (with a token of your own), or listen on "
            "127.0.0.1"
        )
    if token.origin == "generated":
        raise ApiSetupError(f"--api-allow-remote needs a token given explicitly: --api-token-file FILE or ${TOKEN_ENV}")
    if not tls and not insecure:
        raise ApiSetupError(
            "--api-allow-remote without TLS: the tokens and every answer would cross the network in clear. Give "
            "configs/host.yaml an api.tls section (api: {tls: {cert: /PATH/cert.pem, key: /PATH/key.pem}}), or "
            "set api: {insecure: true} there to serve plain HTTP anyway (behind a TLS proxy, or on a link nobody "
            "else can read)"
        )


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class AllowedHosts:
    """The ``Host:`` values this listener answers to. A DNS-rebinding page always sends a name of its own, so an
    address literal of the listener is safe; a name is accepted only when given (``--api-host``) or ``localhost``
    on loopback."""

    port: int
    names: frozenset[str]  # lowercase names and address literals (IPv6 without brackets)
    any_address: bool = False  # a wildcard bind (0.0.0.0, ::): any address literal

    @classmethod
    def of(cls, bind_host: str, port: int, names: Sequence[str] = ()) -> AllowedHosts:
        allowed = {n.strip().lower().strip("[]") for n in names if n.strip()}
        ip = _ip(bind_host)
        wildcard = ip is not None and ip.is_unspecified
        if ip is None:
            allowed.add(bind_host.lower())
        elif not wildcard:
            allowed.add(str(ip))
        if is_loopback(bind_host) or wildcard:
            allowed.add("localhost")  # no page can make it name another machine
        return cls(port=port, names=frozenset(allowed), any_address=wildcard)

    def permits(self, host_header: str) -> bool:
        host, port = _split_host_header(host_header)
        if host is None or (port is not None and port != self.port):
            return False
        if host in self.names:
            return True
        return self.any_address and _ip(host) is not None

    def permits_origin(self, origin: str) -> bool:
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or "/" in rest:
            return False
        return self.permits(rest)

    def describe(self) -> str:
        shown = sorted(f"[{n}]" if ":" in n else n for n in self.names)
        return ", ".join(shown) + (" or any address of this machine" if self.any_address else "")

    def mcp_security(self) -> Any:
        """The MCP SDK's own Host/Origin check, from the same names (the ``Guard`` has checked them already)."""
        # An optional SDK (mcp, about half a second of imports): loaded when the app is built, not by a listener refused
        # for its address or its token before that.
        from mcp.server.transport_security import TransportSecuritySettings

        if self.any_address:
            return TransportSecuritySettings(enable_dns_rebinding_protection=False)
        hosts = [f"[{n}]" if ":" in n else n for n in sorted(self.names)]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[*hosts, *(f"{h}:{self.port}" for h in hosts)],
            allowed_origins=[f"{s}://{h}{p}" for s in ("http", "https") for h in hosts for p in ("", f":{self.port}")],
        )


def _split_host_header(value: str) -> tuple[str | None, int | None]:
    value = value.strip().lower()
    if not value or any(c.isspace() or c in "/@\\" for c in value):
        return None, None
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if rest and not rest.startswith(":"):
            return None, None
        port = rest[1:]
    else:
        host, _, port = value.partition(":")
        if ":" in port:
            return None, None
    if port and not port.isdigit():
        return None, None
    return host.rstrip("."), (int(port) if port else None)
