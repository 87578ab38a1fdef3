"""Secret env values of recipes, kept out of the recipes: ``env = {HF_TOKEN = "${HF_TOKEN}"}`` takes the value from
``secrets.env_file`` (configs/host.yaml; ``NAME=value`` lines, owned by the running user or root, readable by its
owner only) or, failing that, from
the reconciler's own environment. Values are read here and nowhere else, never printed, never logged: each value
read is handed to the redaction boundary (``reconciler.base.redact.learn_secrets``), which masks it in every string that
leaves the process, however it got there (a lane that prints its environment, a cause quoting its log).

The loader (``reconciler.load.desired``) takes the ``keyed_digest`` of each referenced value (an HMAC-SHA256 under
the install's own key, ``reconciler.store.digest_key``, so that a rotated secret recreates its container through the
spec hash, whose label anyone who can inspect the container reads, without giving them a digest to test guesses
against); the apply layer calls ``resolve`` at create time. ``digest`` (a plain sha256) is what labels of earlier
versions were made from: the planner accepts a running lane labelled so, held in memory only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping

from reconciler.base import fsafe
from reconciler.base.errors import ReconcilerError
from reconciler.base.redact import learn_secrets


class SecretError(ReconcilerError):
    code = "secret"
    pass


def read_env_file(path: str) -> dict[str, str]:
    """``NAME=value`` lines (``#`` comments, blank lines, an optional ``export`` and quotes around the value).

    A ``#`` after a space starts a comment, as in a shell: ``KEY=abc  # rotated in May`` is ``abc``; a ``#`` inside
    a word stays (``KEY=abc#def``), and so does one inside quotes (``KEY="abc # def"``)."""
    # Trusted by its owner and mode, not its mode alone: a file another user owns (or could write) could hand the
    # containers a token of that user's choosing.
    try:
        raw = fsafe.read_trusted(path, what="secrets.env_file", secret=True, limit=1 << 20)
    except fsafe.UnsafePath as exc:
        raise SecretError(str(exc)) from None
    except OSError as exc:
        raise SecretError(f"secrets.env_file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"secrets.env_file {path}: not UTF-8 text") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name = name.strip()
        if not sep or not name.replace("_", "a").isalnum() or name[0].isdigit():
            # Name the line, never its content: it may be a secret pasted in the wrong place.
            raise SecretError(f"secrets.env_file {path}:{n}: expected NAME=value")
        given, value = value, value.strip()
        if value[:1] in ('"', "'"):
            end = value.find(value[0], 1)
            after = value[end + 1 :].strip() if end > 0 else ""
            if end < 0 or (after and not after.startswith("#")):
                raise SecretError(
                    f"secrets.env_file {path}:{n}: a quoted value must end with its closing quote, and only a "
                    "'# comment' may follow it"
                )
            value = value[1:end]
        else:
            for i in range(1, len(given)):
                if given[i] == "#" and given[i - 1].isspace():
                    value = given[:i].strip()
                    break
        out[name] = value
    learn_secrets(out)  # every value of the file is a secret, referenced by a recipe or not
    return out


def resolve(env_file: str | None, names: Iterable[str], *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The value of each name: from the env file first, then the environment. SecretError names what is missing."""
    environ = os.environ if environ is None else environ
    from_file = read_env_file(env_file) if env_file else {}
    out: dict[str, str] = {}
    missing = []
    for name in names:
        if name in from_file:
            out[name] = from_file[name]
        elif name in environ:
            out[name] = environ[name]
        else:
            missing.append(name)
    learn_secrets(out)
    if missing:
        where = f"{env_file} or the reconciler's environment" if env_file else "the reconciler's environment"
        raise SecretError(f"not set in {where}: {', '.join(sorted(missing))}")
    return out


def digest(value: str) -> str:
    """The plain sha256 of a value: only to recognise a label of an earlier version, never to write one."""
    return hashlib.sha256(value.encode()).hexdigest()


def keyed_digest(key: bytes, name: str, value: str) -> str:
    """The digest of secret ``name``'s value that may enter a label: keyed by the install's own key."""
    return hmac.new(key, f"{name}\0{value}".encode(), hashlib.sha256).hexdigest()
