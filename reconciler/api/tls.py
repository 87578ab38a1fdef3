"""The listener's TLS: the certificate and key of host.yaml's ``api.tls``, checked before uvicorn is given them (the
key trusted by owner and mode like a token file, the pair loaded once, so that a bad one is refused at start with
the field that names it, never a listener that does not start). The clients' side (``fleet status``, a canary
check) is ``reconciler.observe.fleet``.

Called by the loop's front-end when it starts the listener (``check_tls``).
The server's TLS itself is uvicorn's (``ssl_certfile``/``ssl_keyfile``: ``reconciler.api.listener``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from reconciler.api.errors import ApiSetupError
from reconciler.base import fsafe

HOST_FILE = "configs/host.yaml"


@dataclass(frozen=True)
class TlsFiles:
    """What uvicorn serves HTTPS with."""

    cert: str
    key: str


def check_tls(cert: str, key: str) -> TlsFiles:
    """``api.tls``'s files, checked: the key the running user's and readable by no one else, and the two a pair
    this Python's ``ssl`` loads. ``ApiSetupError`` naming the field and the fix, else."""
    try:
        fsafe.read_trusted(key, what="the listener's TLS key (api.tls.key)", secret=True, limit=1 << 20)
    except fsafe.UnsafePath as exc:
        raise ApiSetupError(f"{HOST_FILE}: api.tls.key: {exc}") from None
    except OSError as exc:
        raise ApiSetupError(f"{HOST_FILE}: api.tls.key: cannot read {key}: {exc.strerror or exc}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError:
        raise ApiSetupError(
            f"{HOST_FILE}: api.tls.cert: no such file {cert}: give the listener's certificate (PEM)"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        raise ApiSetupError(
            f"{HOST_FILE}: api.tls: the certificate {cert} and the key {key} cannot be served ({why}): give a PEM "
            "certificate and its own unencrypted PEM key"
        ) from None
    return TlsFiles(cert, key)
