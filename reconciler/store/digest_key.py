"""The install's key for the digests of secret values (``secret-digest-key`` in the host's state directory, 0600,
32 random bytes made once, two writers one winner).

A recipe's secret env value (``"${HF_TOKEN}"``) must still recreate its container when it is rotated, so something
of the value enters the spec hash that goes on the container as a label, which whoever can inspect the container
reads: a plain sha256 there lets anyone test a guess offline. The digest is keyed with this file instead
(``reconciler.load.secrets.keyed_digest``), which only root reads. Read by the loader (``reconciler.load.desired``).
"""

from __future__ import annotations

import secrets

from reconciler.base import fsafe
from reconciler.store.state import StateError, checked_host_dir

KEY_FILE = "secret-digest-key"


def digest_key(host: str) -> bytes:
    """The host's key, made now when there is none yet. StateError when it cannot be read or made."""
    path = checked_host_dir(host, create=True) / KEY_FILE
    try:
        fsafe.write_atomic(path, secrets.token_hex(32) + "\n", replace=False)
    except FileExistsError:
        pass  # made before (or by another command this instant): read the one that is there
    except OSError as exc:
        raise StateError(f"cannot make {path}: {exc.strerror or exc}") from None
    try:
        raw = fsafe.read_trusted(path, what="the secret digest key", secret=True, limit=4096)
    except (OSError, fsafe.UnsafePath) as exc:
        raise StateError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != 32:
        raise StateError(f"{path} is not 64 hex digits: move it aside (each lane that takes a secret is recreated)")
    return key
