"""The step of a host's git source, for the loop's timer and ``reconciler sync`` alike: fetch the branch, and take
its newest commit as the one in use when it may be.

A commit is taken only when (1) its files validate as a local root's would with this host file (``load_desired``
with that commit): a commit that does not is *refused*, the commit in use kept, the error naming the commit and the
file; and (2), with ``source.after``, every canary host reports that very commit converged (``GET /v1/status`` with
its token, ``reconciler.observe.fleet``). While a canary has not got there the commit *waits*; one that leaves a
canary blocked, held in backoff or refusing it *stops* the commit here, for good: only a newer commit (a fix, or a
revert) goes on. Each taken, refused, stopped or unfetchable commit is audited once, by the caller's ``audit``.

Taking a commit changes the desired state only: the loop (or the next ``apply``) converges it under every rule a
local edit meets. Called under the host lock (or the loop's pass lock) by ``reconciler.service.sync`` and
``reconciler.loop``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from reconciler.base.errors import ConfigError
from reconciler.load.desired import load_desired
from reconciler.load.fleet import load_fleet
from reconciler.load.git_source import GitError, fetch, prune_trees, signature_problem, subject
from reconciler.model.fleet import FleetHost
from reconciler.model.host import HostConfig
from reconciler.model.source import SourceConfig
from reconciler.observe.fleet import HostRow, ask_host
from reconciler.store.source import SourceRecord, read_source_record, write_source_record

# The verdicts of a canary that stop a commit: it left the canary unable to converge.
_FAILED = ("blocked", "held", "files invalid")
_HISTORY = 20

Audit = Callable[..., None]


def sync_held(root: str, host: HostConfig, audit: Audit) -> tuple[str | None, SourceRecord]:
    """One fetch and its verdict, with the host lock (or the loop's pass lock) held: (the commit in use before, the
    record written)."""
    src = host.source
    assert src is not None
    record = read_source_record(host.name).for_source(src.git, src.ref, src.path)
    before = record.commit
    record = _step(root, host.name, src, record, audit)
    write_source_record(host.name, record)
    prune_trees(host.name, {c for c in (record.commit, record.fetched) if c})
    return before, record


def _step(root: str, host: str, src: SourceConfig, record: SourceRecord, audit: Audit) -> SourceRecord:
    now = time.time()
    try:
        newest = fetch(host, src)
    except GitError as exc:
        if str(exc) != record.error:
            audit(outcome="failed", reason=str(exc), source=src.git)
        return replace(record, error=str(exc), fetched_at=now)
    record = replace(record, error="", fetched=newest, fetched_at=now)
    if newest == record.commit:
        return replace(record, refused=None, waiting=None, stopped=None)
    if record.stopped is not None and record.stopped.get("commit") == newest:
        return record  # a canary failed it: it stays stopped until a newer commit comes
    # A refused commit is judged again at each fetch (the host file, or the allowed signers, may have changed since),
    # and audited once.
    again = record.refused is not None and record.refused.get("commit") == newest
    record = replace(record, stopped=None)
    if src.allowed_signers is not None:
        unsigned = signature_problem(host, newest, src.allowed_signers, timeout=src.timeout_s)
        if unsigned is not None:
            if not again:
                audit(outcome="refused", reason=unsigned, commit=newest)
            return replace(record, refused={"commit": newest, "problems": [unsigned]}, waiting=None)
    try:
        load_desired(root, commit=newest)
    except ConfigError as exc:
        problems = [str(p) for p in exc.problems][:50]
        if not again:
            audit(outcome="refused", reason=problems[0] if problems else "invalid", commit=newest)
        return replace(record, refused={"commit": newest, "problems": problems}, waiting=None)
    record = replace(record, refused=None)
    if src.after:
        go, waiting, stopped = _canaries(src, newest)
        if stopped is not None:
            audit(outcome="stopped", reason=stopped["why"], commit=newest, canary=stopped["canary"])
            return replace(record, stopped=stopped, waiting=None)
        if not go:
            return replace(record, waiting={"commit": newest, "canaries": waiting})
    title = subject(host, newest)
    audit(
        outcome="ok",
        reason=f"commit {(record.commit or 'none')[:12]} -> {newest[:12]}" + (f": {title}" if title else ""),
        commit=newest,
        previous=record.commit,
    )
    history = [*record.history, {"commit": newest, "at": round(now, 3)}][-_HISTORY:]
    return replace(record, commit=newest, synced_at=now, waiting=None, history=history)


def _canaries(src: SourceConfig, commit: str) -> tuple[bool, dict[str, str], dict[str, Any] | None]:
    """(all converged ``commit``, why each other one is waited for, the canary that failed it)."""
    assert src.fleet is not None  # model.source: after needs fleet
    try:
        fleet = load_fleet(src.fleet)
    except ConfigError as exc:
        return False, {name: f"the fleet file cannot be read: {exc.problems[0]}" for name in src.after}, None
    hosts = {h.name: h for h in fleet.hosts}
    waiting: dict[str, str] = {}
    known: list[FleetHost] = []
    for name in src.after:
        if name in hosts:
            known.append(hosts[name])
        else:
            waiting[name] = f"not in the fleet file {src.fleet}"
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(known))), thread_name_prefix="canary") as pool:
        rows = list(pool.map(lambda h: ask_host(h, fleet.timeout_s), known))
    for row in rows:
        state, why = canary_state(row, commit)
        if state == "failed":
            return False, waiting, {"commit": commit, "canary": row.name, "why": f"canary {row.name}: {why}"}
        if state == "waiting":
            waiting[row.name] = why
    return not waiting, waiting, None


def canary_state(row: HostRow, commit: str) -> tuple[str, str]:
    """("converged" | "waiting" | "failed", why) of one canary for ``commit``."""
    if not row.reachable:
        return "waiting", f"unreachable: {row.error}"
    source = row.status.get("source") if isinstance(row.status.get("source"), dict) else {}
    assert isinstance(source, dict)
    for fate in ("refused", "stopped"):
        held = source.get(fate)
        if isinstance(held, dict) and held.get("commit") == commit:
            return "failed", f"{fate} commit {commit[:12]}"
    if source.get("commit") != commit:
        have = source.get("commit")
        return "waiting", f"on commit {have[:12] if isinstance(have, str) else 'none'}, not yet {commit[:12]}"
    verdict = row.verdict
    if verdict == "converged":
        return "converged", "converged"
    if verdict in _FAILED:
        return "failed", f"{verdict} on commit {commit[:12]}"
    return "waiting", f"{verdict} on commit {commit[:12]}"
