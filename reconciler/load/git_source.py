"""The host's git source read with the git CLI (never a library of this tool's own): ``fetch`` brings the branch's
newest commit into the bare clone under the state directory, ``source_files`` gives the folder of one commit's files
that ``reconciler.load.desired`` reads as it would a root's.

A commit's files are written by this tool from the commit's blobs (``git ls-tree`` and ``git cat-file``), never
checked out: only ``PATH/manifests/*.yaml`` (or ``.yml``) and ``PATH/configs/recipes/*.toml`` are taken, each a regular
file of at most 1 MiB under a plain name, so nothing in the repository can place a symlink, a device, a hook or a file
outside that folder on the host; a symlink or a submodule where a manifest or recipe would be is a problem named by
the commit and the file. Every size comes from git (``ls-tree -l``, ``cat-file -s``) before an object is read: a file
over the limit is refused unread, so no commit can make the loop hold more than a few MiB of it. What is read then goes
through the same validation as a local file (``load_desired``).

git runs with its prompts off, its transports held to those of ``reconciler.model.source.GIT_SCHEMES`` (never
``ext::``; http and git only with ``source.insecure_transport``), no hooks and no submodules, a deadline, and its
messages redacted before they are shown.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from reconciler.base import fsafe
from reconciler.base.errors import ConfigError, ConfigProblem, ReconcilerError
from reconciler.base.redact import redact_text
from reconciler.base.units import human_bytes
from reconciler.load.files import HOST_FILE, MANIFESTS_DIR, MAX_FILE_BYTES, RECIPES_DIR
from reconciler.model.host import HostConfig
from reconciler.model.source import GIT_SCHEMES, PLAINTEXT_SCHEMES, SourceConfig
from reconciler.store.source import COMMIT_RE, read_source_record, source_dir, trees_dir

FETCHED_REF = "refs/reconciler/source"
MAX_FILES = 4096  # manifests and recipes of one commit: a few dozen on any real fleet
# All of one commit's manifests and recipes together (read in one batch): a few hundred KiB on any real fleet.
MAX_TOTAL_BYTES = 16 << 20
# A commit object (its header, signature and message), read whole to check its signature and show its subject.
MAX_COMMIT_BYTES = 1 << 20
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
_REGULAR = ("100644", "100755")


class GitError(ReconcilerError):
    """git could not fetch or read the source: the message says which command and why (redacted)."""

    code = "git_source"


@dataclass(frozen=True)
class SourceFiles:
    """One commit's files, laid out like a root's ``manifests/`` and ``configs/recipes/`` under ``tree``."""

    tree: Path
    commit: str
    path: str  # the source's path in the repository ('.' its top)

    def label(self, rel: str) -> str:
        """A file of the tree as git names it: ``COMMIT:PATH/FILE`` (``git show`` takes it as it is)."""
        inside = rel if self.path == "." else f"{self.path}/{rel}"
        return f"{self.commit[:12]}:{inside}"


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_TERMINAL_PROMPT="0",  # a loop has no one to ask for a password
        GIT_ASKPASS="",
        SSH_ASKPASS="",
        LC_ALL="C",
        GIT_SSH_COMMAND=os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
    )
    return env


def _git(repo: Path, *args: str, timeout: float, stdin: bytes | None = None, extra: tuple[str, ...] = ()) -> bytes:
    config = [
        "protocol.allow=never",
        *(f"protocol.{s}.allow=always" for s in GIT_SCHEMES),
        "core.hooksPath=/dev/null",
        "submodule.recurse=false",
        "fetch.recurseSubmodules=false",
        *extra,
    ]
    cmd = [
        "git",
        *(arg for c in config for arg in ("-c", c)),
        "--literal-pathspecs",
        "--git-dir",
        str(repo),
        *args,
    ]
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=_git_env(), check=False)
    except FileNotFoundError:
        raise GitError("git is not installed: install it (apt-get install git) to read source.git") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} did not finish within {timeout:g} s (source.timeout_s)") from None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        tail = "; ".join(line.strip() for line in why[-3:]) or f"exit {done.returncode}"
        raise GitError(redact_text(f"git {args[0]} failed: {tail}"))
    return done.stdout


def _repo(host: str) -> Path:
    repo = source_dir(host, create=True) / "repo.git"
    if not (repo / "HEAD").is_file():
        tmp = Path(tempfile.mkdtemp(prefix="repo.git.", dir=repo.parent))
        _git(tmp, "init", "--bare", "--quiet", str(tmp), timeout=30)
        if repo.exists():
            shutil.rmtree(tmp)  # a half-made clone of an earlier run stays in the way: made again
            shutil.rmtree(repo)
            _git(repo, "init", "--bare", "--quiet", str(repo), timeout=30)
        else:
            os.replace(tmp, repo)
    return repo


def fetch(host: str, src: SourceConfig) -> str:
    """Fetch ``src.ref`` of ``src.git`` into the host's clone; its commit (full hex). GitError when it cannot."""
    repo = _repo(host)
    _git(
        repo,
        "fetch",
        "--quiet",
        "--no-tags",
        "--force",
        "--no-write-fetch-head",
        "--",
        src.git,
        f"+refs/heads/{src.ref}:{FETCHED_REF}",
        timeout=src.timeout_s,
        # git itself held to it too: a redirect of https:// to http:// is refused, not followed
        extra=() if src.insecure_transport else tuple(f"protocol.{s}.allow=never" for s in PLAINTEXT_SCHEMES),
    )
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{FETCHED_REF}^{{commit}}", timeout=30).decode().strip()
    if not COMMIT_RE.match(commit):
        raise GitError(f"git rev-parse gave {commit!r} for {src.ref}, not a commit")
    return commit


def _commit_too_large(repo: Path, commit: str) -> str | None:
    """Why the commit object is not read whole (its size from ``git cat-file -s``, read first), or None."""
    size = int(_git(repo, "cat-file", "-s", commit, timeout=30).decode("ascii", "replace").strip() or "0")
    if size <= MAX_COMMIT_BYTES:
        return None
    return (
        f"commit {commit[:12]} is {size} bytes ({human_bytes(size)}), over the limit of "
        f"{human_bytes(MAX_COMMIT_BYTES)} for a commit's header and message: refused before it was read"
    )


def signature_problem(host: str, commit: str, allowed_signers: str, *, timeout: float) -> str | None:
    """None when ``commit`` is signed with an SSH key of ``allowed_signers`` (``git verify-commit`` with that file as
    gpg.ssh.allowedSignersFile); else why not. Only an SSH signature counts: a GPG one is not judged by the running
    user's keyring here. The file is read first as the tool's own files are (root's, not writable by others): whoever
    could write it could add a key."""
    try:
        fsafe.read_trusted(allowed_signers, what="source.allowed_signers", limit=1 << 20)
    except (OSError, fsafe.UnsafePath) as exc:
        return f"source.allowed_signers {allowed_signers}: {getattr(exc, 'strerror', None) or exc}"
    repo = _repo(host)
    too_large = _commit_too_large(repo, commit)
    if too_large is not None:
        return too_large
    raw = _git(repo, "cat-file", "commit", commit, timeout=30)
    head = raw.split(b"\n\n", 1)[0]
    if b"\ngpgsig " not in head:
        return f"commit {commit[:12]} is not signed (source.allowed_signers asks for a signature by one of its keys)"
    if b"BEGIN SSH SIGNATURE" not in head:
        return f"commit {commit[:12]} is not signed with an SSH key (source.allowed_signers holds SSH keys)"
    try:
        _git(
            repo,
            "verify-commit",
            commit,
            timeout=timeout,
            extra=("gpg.format=ssh", f"gpg.ssh.allowedSignersFile={allowed_signers}"),
        )
    except GitError as exc:
        return f"commit {commit[:12]} is not signed by a key of {allowed_signers}: {exc}"
    return None


def subject(host: str, commit: str) -> str:
    """The commit's subject line, for the audit trail and the status (redacted, one line, at most 200 chars)."""
    try:
        repo = _repo(host)
        if _commit_too_large(repo, commit) is not None:
            return ""
        text = _git(repo, "log", "-1", "--format=%s", commit, timeout=30).decode("utf-8", "replace")
    except (GitError, ValueError):
        return ""
    return redact_text(text.strip().splitlines()[0] if text.strip() else "")[:200]


def _wanted(rel: str) -> bool:
    folder, _, name = rel.rpartition("/")
    if folder == MANIFESTS_DIR:
        return name.endswith((".yaml", ".yml"))
    return folder == RECIPES_DIR and name.endswith(".toml")


def _listed_blobs(repo: Path, commit: str, top: str, files: SourceFiles) -> list[tuple[str, str]]:
    """The (object id, path under the tree) of ``commit``'s manifests and recipes under ``top``, each checked by its
    listing alone (name, mode, size as git gives it): ConfigError with every problem, before any blob is read."""
    listing = _git(
        repo,
        "ls-tree",
        "-r",
        "-z",
        "-l",  # each blob's size, so that none is read before it is known to fit
        "--full-tree",
        commit,
        "--",
        f"{top}{MANIFESTS_DIR}",
        f"{top}{RECIPES_DIR}",
        timeout=60,
    )
    problems: list[ConfigProblem] = []
    blobs: list[tuple[str, str]] = []
    total = 0
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        meta, _, raw = entry.partition(b"\t")
        mode, kind, oid, size_s = meta.decode("ascii", "replace").split()  # the size right-aligned, "-" for no blob
        name = raw.decode("utf-8", "replace")
        rel = name[len(top) :] if name.startswith(top) else name
        if not _wanted(rel):
            continue  # other files of the repository (a README, another host's notes) are not read
        why = _entry_problem(rel, mode, kind, size_s)
        if why is not None:
            problems.append(ConfigProblem(files.label(rel), None, why))
        else:
            blobs.append((oid, rel))
            total += int(size_s)
    if len(blobs) > MAX_FILES:
        problems.append(ConfigProblem(files.label(MANIFESTS_DIR), None, f"more than {MAX_FILES} manifests and recipes"))
    elif total > MAX_TOTAL_BYTES:
        where = files.label(f"{MANIFESTS_DIR} and {RECIPES_DIR}")
        problems.append(ConfigProblem(where, None, _over(total, MAX_TOTAL_BYTES, "all manifests and recipes together")))
    if problems:
        raise ConfigError(problems)
    return blobs


def _entry_problem(rel: str, mode: str, kind: str, size: str) -> str | None:
    """Pure: why a listed manifest or recipe is not read (its name, its mode, its size), or None."""
    if not _NAME_RE.match(rel.rpartition("/")[2]):
        return "a file name of letters, digits, . _ - only"
    if kind != "blob" or mode not in _REGULAR:
        what = {"120000": "a symlink", "160000": "a submodule"}.get(mode, f"mode {mode}")
        return f"{what} in the source: only regular files are read; commit the file itself"
    if not size.isdigit() or int(size) > MAX_FILE_BYTES:
        return _over(int(size) if size.isdigit() else -1, MAX_FILE_BYTES, "a manifest or recipe")
    return None


def _over(size: int, limit: int, what: str) -> str:
    return (
        f"{size} bytes ({human_bytes(size)}), over the limit of {human_bytes(limit)} for {what}: "
        "refused before it was read"
    )


def _export(host: str, src: SourceConfig, commit: str, dest: Path) -> None:
    """Write ``commit``'s manifests and recipes of ``src.path`` under ``dest`` (which does not exist yet)."""
    repo = _repo(host)
    top = "" if src.path == "." else f"{src.path}/"
    files = SourceFiles(dest, commit, src.path)
    blobs = _listed_blobs(repo, commit, top, files)
    problems: list[ConfigProblem] = []
    out = _git(repo, "cat-file", "--batch", timeout=60, stdin=b"".join(f"{oid}\n".encode() for oid, _ in blobs))
    tmp = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}.", dir=dest.parent))
    try:
        for d in (MANIFESTS_DIR, RECIPES_DIR):
            (tmp / d).mkdir(mode=0o700, parents=True)
        pos = 0
        for oid, rel in blobs:
            nl = out.index(b"\n", pos)
            got_oid, kind, size_s = out[pos:nl].decode("ascii").split(" ")
            size = int(size_s)
            if got_oid != oid or kind != "blob":
                raise GitError(f"git cat-file answered {got_oid} {kind} for {oid}")
            data = out[nl + 1 : nl + 1 + size]
            pos = nl + 1 + size + 1
            if size > MAX_FILE_BYTES:  # never, for the object the listing sized; checked where it is used all the same
                problems.append(
                    ConfigProblem(files.label(rel), None, _over(size, MAX_FILE_BYTES, "a manifest or recipe"))
                )
                continue
            fd = os.open(tmp / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        if problems:
            raise ConfigError(problems)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def source_files(host: HostConfig, *, commit: str | None = None) -> SourceFiles:
    """The files of ``commit`` (by default the commit in use) of the host's source, exported once and kept.

    ConfigError, naming the host file's ``source``, while no commit is in use yet (with what held it back)."""
    src = host.source
    assert src is not None
    if commit is None:
        record = read_source_record(host.name).for_source(src.git, src.ref, src.path)
        commit = record.commit
        if commit is None:
            why = {
                "refused": "the newest commit's files do not validate (reconciler sync --json says why)",
                "waiting": "the newest commit waits for its canaries (source.after)",
                "stopped": "a canary failed the newest commit (source.after)",
                "unreachable": f"the repository does not answer: {record.error}",
            }.get(record.state, "the loop fetches it within source.interval_s, or run `reconciler sync`")
            raise ConfigError(
                [ConfigProblem(HOST_FILE, None, f"source: no commit of {src.git} ({src.ref}) is in use yet: {why}")]
            )
    if not COMMIT_RE.match(commit):
        raise GitError(f"{commit!r} is no commit")
    dest = trees_dir(host.name, create=True) / commit
    if not dest.is_dir():
        _export(host.name, src, commit, dest)
    return SourceFiles(dest, commit, src.path)


def prune_trees(host: str, keep: set[str]) -> None:
    """Remove the folders of commits no longer in use or waiting (``keep``)."""
    try:
        d = trees_dir(host, create=False)
    except FileNotFoundError:
        return
    for child in d.iterdir():
        if child.name not in keep:
            shutil.rmtree(child, ignore_errors=True)
