"""Secrets never leave the process (docs/design.md, safety rule 10): redaction of command lines, env and free text.

Pure, standard library only. Applied where a command line is read (``procfs.read_comm``, the shm inspection's
owners, the GPU observer's processes) and once more at the boundaries (the loop's log lines, the JSON writers),
so a value missed at a source is still caught on its way out.

What is replaced by ``***`` (the name or flag itself stays, so an operator still sees *that* a secret was given):

- the value of a flag whose name is secret-bearing: ``--api-key``, ``--hf-token``, ``--token``, ``--password``,
  ``--secret``, and any flag whose name contains token, key, secret, password, passwd or credential, in both
  ``--flag value`` and ``--flag=value`` forms. Counts and tokenizer paths (``--max-num-batched-tokens``,
  ``--tokenizer``) are not secrets and stay readable;
- the value of an env-style assignment ``NAME=value`` whose NAME ends in ``_TOKEN``, ``_KEY``, ``_SECRET``,
  ``PASSWORD``, ``PASSWD``, ``_PASS``, ``_CREDENTIAL(S)`` (case-insensitive), as an argument or in text;
- the token after ``Bearer`` / ``Basic``, the password of a URL's ``user:password@`` (or a bare token used as
  the URL's user), a quoted value under a secret-bearing key (``'api_key': 'sk-…'``, as vLLM logs its args),
  and well-known token shapes (``hf_…``, ``sk-…``, ``ghp_…``, ``github_pat_…``, ``xox?-…``, ``glpat-…``);
- every secret value the process has learned (``learn_secrets``: each value of ``secrets.env_file``, and each value
  of the environment a recipe's ``"${NAME}"`` takes), wherever it appears, bare or not: a lane that prints its
  environment or its arguments quotes them in its logs, and those are quoted in causes, status and the API. A value
  shorter than ``MIN_SECRET_CHARS`` is not searched for bare (see there); under its name (``NAME=value``,
  ``NAME: value``, ``"NAME": "value"``) it is masked at any length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"

_SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "passphrase", "pwd", "credential")
# "auth" as a word of a flag's name (--auth, --basic-auth, --auth-file), not inside one (--author, --authority).
_AUTH_WORD = re.compile(r"(?:^|[-_])auth(?:$|[-_])")
# Flags whose value is USER:PASSWORD (curl -u, wget --user): the part after the first colon is masked.
_USER_FLAGS = frozenset({"-u", "--user", "--proxy-user", "-U"})
# Words that contain a secret word but name no secret: counts of tokens, the tokenizer.
_BENIGN = re.compile(r"tokenizer|tokens")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that are a secret on their own (a mapping's key, a log field): ``token=…``, ``{"secret": …}``.
_BARE_NAMES = frozenset(
    {"token", "key", "secret", "password", "passwd", "passphrase", "credentials", "apikey", "api_key"}
)
_ENV_SUFFIXES = (
    "_token",
    "_key",
    "_secret",
    "password",
    "passwd",
    "_pass",
    "_pwd",
    "passphrase",
    "apikey",
    "_credentials",
    "_credential",
)

# Inline rules over free text (and over each argument).
_URL_USERINFO = re.compile(r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:]*)(?::(?P<pw>[^\s/]*))?@")
_BEARER = re.compile(r"(?P<pre>\b(?i:bearer)\s+|\bBasic\s+)(?P<tok>[A-Za-z0-9._~+/=-]{8,})")
_QUOTED_KV = re.compile(
    r"(?i)(?P<pre>(?P<key>[\"']?[\w.-]*(?:token|key|secret|password|passwd|credential)[\w.-]*[\"']?)\s*[:=]\s*)"
    r"(?P<q>[\"'])(?P<val>[^\"']*)(?P=q)"
)
_ENV_IN_TEXT = re.compile(
    r"(?i)(?<![\w-])(?P<name>[A-Za-z0-9_]*(?:_token|_key|_secret|password|passwd|_pass|_pwd|passphrase|apikey"
    r"|_credentials?)|token|secret|key)"
    r"=(?P<val>[^\s\"',;)\]}]+)"
)
# ``HF_TOKEN: value`` (a lane printing its settings, YAML): an env-style secret name, a colon, the value (not a
# recipe's ``"${NAME}"`` reference, which names where the value comes from).
_ENV_COLON = re.compile(
    r"(?i)(?<![\w-])(?P<pre>[A-Za-z0-9_]*(?:_token|_key|_secret|password|passwd|_pass|_pwd|passphrase|apikey"
    r"|_credentials?)[ \t]*:[ \t]+)(?!\*\*\*|\$\{)(?P<val>[^\s\"',;]+)"
)
# A header written out (curl -H 'X-API-Key: …', a logged request): a hyphenated name holding a secret word, or
# Cookie; Authorization's scheme stays and its credentials go.
_HEADER = re.compile(r"(?i)(?<![\w-])(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)+|cookie)[ \t]*:[ \t]*(?P<val>[^\s\"',;]+)")
_AUTH_HEADER = re.compile(r"(?i)(?<![\w-])(?P<pre>(?:proxy-)?authorization[ \t]*:[ \t]*)(?P<rest>[^\n\"',;]*)")
_AUTH_SCHEMES = frozenset({"bearer", "basic", "token", "digest", "negotiate", "apikey"})
_KNOWN_TOKENS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|glpat-[A-Za-z0-9_-]{16,})"
)
# The cheap test of the boundary pass: a string without any of these (lowercased) is returned as it is.
_MARKERS = (
    "token",
    "key",
    "secret",
    "passw",
    "_pass",
    "passphrase",
    "pwd",
    "auth",
    "cookie",
    "credential",
    "bearer",
    "basic",
    "sk-",
    "hf_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "xox",
    "glpat-",
    "-u ",
    "--user",
    "-u\0",
)


# A learned secret value shorter than this is not searched for in free text: so short a value turns up by chance in
# ordinary output (a port, a pid, a word, a piece of a hash), and each chance mask would garble that output and, by
# where the masks fall, point at the value itself. Six characters keep chance matches rare (about one in 10^9 per
# position for a random alphanumeric value) while still finding a short password; a shorter value is still masked
# under its own name.
MIN_SECRET_CHARS = 6
# The learned values, longest first (a value inside another is masked with it), with their JSON-escaped forms.
_NEEDLES: tuple[str, ...] = ()
# The learned names whose values are masked in ``NAME=value`` / ``NAME: value`` text, and their lowercased forms
# (markers of the cheap test).
_NAMES: frozenset[str] = frozenset()
_NAME_MARKERS: tuple[str, ...] = ()
_NAMED: re.Pattern[str] | None = None


def learn_secrets(values: Mapping[str, str]) -> None:
    """Remember ``values`` (NAME -> secret value) as needles: from now on every redaction in this process masks
    each value wherever it appears, and the value after its NAME. Called where secret values are read
    (``reconciler.load.secrets``); a rotated value is added, the old one stays masked."""
    global _NEEDLES, _NAMES, _NAME_MARKERS, _NAMED
    import json

    needles = set(_NEEDLES)
    for value in values.values():
        if len(value) >= MIN_SECRET_CHARS:
            needles.add(value)
            needles.add(json.dumps(value)[1:-1])  # as it reads inside JSON text quoted by a lane
    names = _NAMES | {n for n in values if _ENV_NAME.match(n)}
    if needles != set(_NEEDLES):
        _NEEDLES = tuple(sorted(needles, key=lambda v: (-len(v), v)))
    if names != _NAMES:
        alternation = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        _NAMED = re.compile(
            rf"(?<![\w-])(?P<pre>[\"']?(?:{alternation})[\"']?[ \t]*[:=][ \t]*)(?P<q>[\"']?)(?!\$\{{)(?P<val>[^\s\"',;]+)"
        )
        _NAME_MARKERS = tuple(sorted({n.lower() for n in names}))
        _NAMES = frozenset(names)


def _strip_needles(text: str) -> str:
    for needle in _NEEDLES:
        if needle in text:
            text = text.replace(needle, MASK)
    return text


def _named_sub(m: re.Match[str]) -> str:
    return m.group(0) if m.group("val") == MASK else m.group("pre") + m.group("q") + MASK


class _Maybe:
    """``search(text)``: whether ``text`` may hold something to redact (substring tests: fast on long text)."""

    @staticmethod
    def search(text: str) -> bool:
        low = text.lower()
        return (
            any(m in low for m in _MARKERS)
            or ("://" in low and "@" in low)
            or any(n in text for n in _NEEDLES)
            or any(m in low for m in _NAME_MARKERS)
        )


_MAYBE = _Maybe()
# Closing characters a free-text value may be followed by (kept after the mask: "(… --api-key ***)").
_CLOSERS = ")]}>,;\"'"


def secret_flag(arg: str) -> bool:
    """Whether ``arg`` is a flag (``-x``/``--name``, before any ``=``) whose value is a secret."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return False
    name = arg.lstrip("-").split("=", 1)[0].lower()
    if not name or not name[0].isalpha():
        return False  # a negative number, not a flag
    name = _BENIGN.sub("", name)
    return any(w in name for w in _SECRET_WORDS) or bool(_AUTH_WORD.search(name))


def secret_env_name(name: str) -> bool:
    """Whether an env-style NAME carries a secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``)."""
    return bool(_ENV_NAME.match(name)) and (name.lower().endswith(_ENV_SUFFIXES) or name.lower() in _BARE_NAMES)


def redact_text(text: str) -> str:
    """The inline rules (learned secret values, URL passwords, bearer tokens, quoted secret values, ``NAME=value``
    and ``NAME: value``, token shapes).

    A text without any marker of ``_MAYBE`` is returned as it is, and a rule is run only where the character it
    needs is there (a quote, ``=``, ``:``): the rules cost a second for each megabyte of text they scan, and every
    text a command prints passes here (a busy host's ``shm status`` table is megabytes)."""
    if not _MAYBE.search(text):
        return text
    text = _strip_needles(text)
    if _NAMED is not None:
        text = _NAMED.sub(_named_sub, text)
    colon, eq = ":" in text, "=" in text
    if colon and "@" in text:
        text = _URL_USERINFO.sub(_url_sub, text)
    text = _BEARER.sub(lambda m: m.group("pre") + MASK, text)
    if colon:
        text = _AUTH_HEADER.sub(_auth_sub, text)
        text = _HEADER.sub(_header_sub, text)
        text = _ENV_COLON.sub(lambda m: m.group("pre") + MASK, text)
    if ('"' in text or "'" in text) and (colon or eq):
        text = _QUOTED_KV.sub(_quoted_sub, text)
    if eq:
        text = _ENV_IN_TEXT.sub(lambda m: m.group("name") + "=" + MASK, text)
    return _KNOWN_TOKENS.sub(MASK, text)


def redact_output(text: str) -> str:
    """What the terminal boundary applies to every text a command prints: the learned secret values (bare and
    after their names) and URL passwords, which any text may quote (a failed enter's cause, an engine's error
    naming ``docker.url``). The other rules run where the text is made (a command line read, an error's text, a
    JSON value), so a table of megabytes is not scanned by all of them again."""
    if _NEEDLES:
        text = _strip_needles(text)
    if _NAMED is not None and any(m in text.lower() for m in _NAME_MARKERS):
        text = _NAMED.sub(_named_sub, text)
    if "://" in text and "@" in text:
        text = _URL_USERINFO.sub(_url_sub, text)
    return text


def _auth_sub(m: re.Match[str]) -> str:
    words = m.group("rest").split(" ")
    i = 1 if words and words[0].lower() in _AUTH_SCHEMES and len(words) > 1 else 0
    if i < len(words) and len(words[i]) >= 6 and words[i] != MASK and words[i].lower() not in _AUTH_SCHEMES:
        words[i] = MASK
    return m.group("pre") + " ".join(words)


def _header_sub(m: re.Match[str]) -> str:
    name = m.group("name").lower()
    if name.endswith("authorization") or not (name == "cookie" or name == "set-cookie" or secret_flag("--" + name)):
        return m.group(0)
    return m.group(0)[: m.start("val") - m.start()] + MASK


def _quoted_sub(m: re.Match[str]) -> str:
    if not m.group("val") or m.group("val") == MASK or not secret_flag("--" + m.group("key").strip("\"'")):
        return m.group(0)
    return m.group("pre") + m.group("q") + MASK + m.group("q")


def _url_sub(m: re.Match[str]) -> str:
    user, pw = m.group("user"), m.group("pw")
    if pw is not None:
        return f"{m.group('pre')}{user}:{MASK}@"
    # A bare userinfo: a token used as the user name (https://TOKEN@host) unless it reads like a login name.
    if len(user) >= 16:
        return f"{m.group('pre')}{MASK}@"
    return m.group(0)


def _redact_flag_or_env(arg: str) -> str:
    """``--flag=value`` or ``NAME=value`` with a secret-bearing name, masked; else the argument unchanged."""
    if arg.startswith("-") and "=" in arg and secret_flag(arg):
        return arg.split("=", 1)[0] + "=" + MASK
    name, eq, _ = arg.partition("=")
    if eq and secret_env_name(name):
        return name + "=" + MASK
    return arg


def _redact_arg(arg: str) -> str:
    """One argument on its own: ``--flag=value``, ``NAME=value``, then the inline rules. An argument with
    whitespace (``sh -c "…"``, a process that rewrote its title) is read as a command line of its own."""
    if any(c.isspace() for c in arg):
        return redact_cmdline(arg)
    out = _redact_flag_or_env(arg)
    return redact_text(out) if out is arg and _MAYBE.search(arg) else out


def _takes_value(arg: str, following: str | None) -> bool:
    # "--api-key VALUE": the next argument is the value, unless it is itself a long flag (a switch then).
    return "=" not in arg and secret_flag(arg) and following is not None and not following.startswith("--")


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command's arguments with every secret value replaced by ``***`` (same length, same order)."""
    args = list(argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        if i and _takes_value(args[i - 1], arg):
            out.append(MASK)
        elif i and args[i - 1] in _USER_FLAGS and ":" in arg:
            out.append(arg.split(":", 1)[0] + ":" + MASK)
        else:
            out.append(_redact_arg(arg))
    return out


def redact_cmdline(cmdline: str) -> str:
    """A command line as one string (``/proc/PID/cmdline`` joined by spaces, or text quoting one).

    Split on whitespace (kept as it was); a secret flag's value is masked, with any closing punctuation that
    follows it in text kept ("(vllm --api-key ***)").
    """
    if not cmdline or not _MAYBE.search(cmdline):
        return cmdline
    cmdline = _strip_needles(cmdline)  # first: a value with a space in it is masked whole
    parts = re.split(r"(\s+)", cmdline)
    words = parts[0::2]
    out = list(parts)
    prev: str | None = None
    quote = ""  # inside a quoted secret value that spans words: its quote character
    for i, word in enumerate(words):
        if quote:
            # "--api-key 'sk two'": every word up to the closing quote is the value.
            end = word.find(quote)
            out[2 * i - 1] = ""  # the value's inner whitespace goes with it
            out[2 * i] = word[end:] if end >= 0 else ""
            if end >= 0:
                quote = ""
            prev = word
            continue
        if prev is not None and word and _takes_value(prev, word):
            if word[0] in "\"'" and word.count(word[0]) == 1:
                quote = word[0]
                out[2 * i] = word[0] + MASK
            elif word[0] in "\"'":
                end = word.index(word[0], 1)
                if word[1:end] != MASK:
                    out[2 * i] = word[0] + MASK + word[end:]
            else:
                body = word.rstrip(_CLOSERS)
                if body and body != MASK:
                    out[2 * i] = MASK + word[len(body) :]
        elif prev is not None and prev in _USER_FLAGS and ":" in word and not word.startswith("-"):
            out[2 * i] = word.split(":", 1)[0] + ":" + MASK
        elif word:
            out[2 * i] = _redact_flag_or_env(word)
        prev = word.lstrip("\"'(") if word else prev
    return redact_text("".join(out))


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """An environment (or any name -> value mapping): secret-named values masked, the others' text redacted."""
    out: dict[str, Any] = {}
    for k, v in env.items():
        if secret_env_name(str(k)) or str(k).lower() in _BARE_NAMES:
            out[k] = MASK
        elif isinstance(v, str):
            out[k] = redact_cmdline(v)
        else:
            out[k] = v
    return out


def redact_env_list(items: Iterable[str]) -> list[str]:
    """Docker's ``Config.Env`` form: ``["NAME=value", ...]``."""
    out = []
    for item in items:
        name, eq, value = item.partition("=")
        out.append(f"{name}={redact_env({name: value})[name]}" if eq else item)
    return out


def redact_data(data: Any) -> Any:
    """A JSON-like value (dicts, lists, tuples, scalars) rebuilt with every string passed through
    ``redact_cmdline``. Cheap: a string is only looked at further when it contains one of a few markers.
    """
    if isinstance(data, str):
        return redact_cmdline(data) if _MAYBE.search(data) else data
    if isinstance(data, Mapping):
        return {k: redact_data(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_data(v) for v in data]
    if data is None or isinstance(data, (bool, int, float)):
        return data
    return redact_data(str(data))  # what json's default=str would print, redacted


def redact_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Named values (a log line's fields): a secret-named one masked whole, the others through ``redact_data``."""
    return {k: MASK if secret_env_name(k) or k.lower() in _BARE_NAMES else redact_data(v) for k, v in fields.items()}


def redact_json(data: Any, **dumps: Any) -> str:
    """``json.dumps(data, **dumps)`` with every string redacted. The common case costs one look at each distinct
    string: only when one of them holds a marker is the value rebuilt by ``redact_data``. With ``indent`` the text
    is laid out by ``dumps_layered``: the same JSON value, written by the C encoder."""
    return _dumps(redact_data(data) if _any_maybe(data) else data, dumps)


def _any_maybe(data: Any) -> bool:
    """Whether ``redact_data`` could change anything in ``data``: a string value (or what ``default=str`` would
    print) that may hold a secret. Each distinct string is looked at once: ``shm status --json`` of a busy host
    repeats one command line in 24,000 owners (7 MB of JSON, which a search of the whole text took 0.15 s over;
    this walk takes about 25 ms)."""
    seen: set[str] = set()
    stack = [data]
    search = _MAYBE.search
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str:
            if v not in seen:
                seen.add(v)
                if search(v):
                    return True
        elif t is dict:
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
        elif v is None or t is bool or t is int or t is float:
            continue
        elif isinstance(v, str):
            stack.append(str(v))
        elif isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif not isinstance(v, (bool, int, float)):
            stack.append(str(v))  # what json's default=str would print
    return False


def _dumps(data: Any, opts: dict[str, Any]) -> str:
    import json

    if opts.get("indent") is not None and set(opts) <= {"indent", "sort_keys", "default"}:
        return dumps_layered(data, **opts)
    return json.dumps(data, **opts)


def dumps_layered(data: Any, *, indent: int = 2, levels: int = 2, sort_keys: bool = False, default: Any = None) -> str:
    """JSON text with the outer ``levels`` of objects and arrays one member per line, indented, and everything
    deeper on the line of its member: ``{"files": [`` then one file per line.

    ``json.dumps(indent=...)`` runs the pure-Python encoder (the C one does not indent), and on a host whose
    offload files have 24,000 (file, process) owner pairs that alone took longer than finding them; this writes
    each deep value with the C encoder. The value is the same as ``json.dumps``'s; only the layout differs.
    """
    import json

    enc = json.JSONEncoder(separators=(", ", ": "), sort_keys=sort_keys, default=default).encode

    def go(v: Any, depth: int) -> str:
        if depth >= levels or not v or not isinstance(v, (dict, list, tuple)):
            return enc(v)
        if isinstance(v, dict) and not all(isinstance(k, str) for k in v):
            return enc(v)  # keys json.dumps would convert (numbers, None): let it
        pad = "\n" + " " * (indent * (depth + 1))
        if isinstance(v, dict):
            items = sorted(v.items()) if sort_keys else v.items()
            body = ",".join(f"{pad}{enc(k)}: {go(x, depth + 1)}" for k, x in items)
            return "{" + body + "\n" + " " * (indent * depth) + "}"
        body = ",".join(pad + go(x, depth + 1) for x in v)
        return "[" + body + "\n" + " " * (indent * depth) + "]"

    return go(data, 0)
