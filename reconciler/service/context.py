"""What the service's calls share, handed to the module that makes each call: ``CallContext`` (the root, the caller,
the host's I/O seams, how a destructive call is serialised with the loop, a running loop's hooks, the caller's files)
and ``ActionHooks``.

Made once by ``reconciler.service.host_service.HostService`` for its caller. Each call's module (``planning``,
``status``, ``apply_session``, ``switch``, …) takes this value, or only the part it uses (a desired state, a host
file), as an argument: none of them knows the service, and none writes anything of it. Every audit record a call
leaves names its host explicitly (``record``), so no call leaves a host name behind for the next one to find.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconciler.base.errors import ReconcilerError
from reconciler.load.desired import load_desired
from reconciler.load.host_file import load_host
from reconciler.load.tmpfs import REAL_TMPFS
from reconciler.service.caller import Caller
from reconciler.store.audit import audit_log
from reconciler.store.lock import HostLock, LockDirUnusable, LockHeld

if TYPE_CHECKING:
    from reconciler.apply.host_io import HostIO
    from reconciler.load.tmpfs import TmpfsReads
    from reconciler.model import DesiredState, HostConfig


@dataclass(frozen=True)
class ActionHooks:
    """What a running loop counts of the actions its own HTTP API and MCP take in its process, so its metrics
    (actions, bytes reclaimed, refusals) hold every front-end's work, as the audit trail does: ``outcome`` for each
    action of an apply, ``reclaim`` for each guarded reclaim inside one, ``shm_reclaim`` for a confirmed
    ``shm reclaim``."""

    outcome: Callable[[Any], None]
    reclaim: Callable[[Any], None]
    shm_reclaim: Callable[[Any], None]
    wake: Callable[[str], None] = lambda _reason: None  # look again now (a sync took a commit)


@dataclass(frozen=True)
class CallContext:
    """One caller's calls to the host under ``root``.

    ``io``: the host's I/O seams; None, the host's own (``REAL_IO``), imported by the calls that reach the host (a
    light command loads no observer). ``pass_lock``: the running loop's lock around each pass, when the loop itself
    serves the call (its HTTP API and MCP); destructive calls then wait for the pass to end. Without it they take the
    host lock file, refused while another process (a loop) holds it. ``files``: the caller's own files
    (``plan --out FILE``, ``apply FILE``) when the loop serves a command line for it (``reconciler.control``)."""

    root: str
    caller: Caller
    io: HostIO | None = None
    pass_lock: contextlib.AbstractContextManager[object] | None = None
    hooks: ActionHooks | None = None
    files: Any = None

    @property
    def tmpfs(self) -> TmpfsReads:
        """The loader's part of the seams, which light commands read too."""
        return self.io.tmpfs if self.io else REAL_TMPFS

    def desired(self) -> DesiredState:
        return load_desired(self.root, tmpfs=self.tmpfs)

    def host(self) -> HostConfig:
        return load_host(self.root, self.tmpfs)

    @contextlib.contextmanager
    def exclusive(self, host: str, command: str) -> Iterator[None]:
        """Serialised with the loop: its pass lock in-process, or the host lock file (a refusal audited)."""
        if self.pass_lock is not None:
            with self.pass_lock:
                yield
            return
        try:
            lock = HostLock(host, command=command).acquire()
        except (LockHeld, LockDirUnusable) as exc:
            self.record_refusal(command.replace(" ", "-"), str(exc), host=host)
            raise
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Inside ``exclusive``: the loop's pass lock given back for the block (a person deciding on a prompt), so
        the loop's passes go on meanwhile and what they change makes the plan stale; taken again after it. The host
        lock file of a stand-alone command stays held."""
        if self.pass_lock is None:
            yield
            return
        self.pass_lock.__exit__(None, None, None)
        try:
            yield
        finally:
            self.pass_lock.__enter__()

    def record_refusal(self, action: str, reason: str, *, host: str | None = None) -> None:
        """An action this caller asked for and was refused before anything was done (the host lock held, no
        approval, a plan file not its own): in the audit trail with why, for ``host`` (None: the host file's). An
        audit that cannot be written does not hide the refusal itself."""
        try:
            audit_log(host or self.host().name).append(
                {**self.caller.to_json(), "action": action, "outcome": "refused", "reason": reason}
            )
        except ReconcilerError:
            return

    def record(self, host: str, action: str, **fields: Any) -> None:
        """One audit record of an action by this caller on ``host``."""
        audit_log(host).append({**self.caller.to_json(), "action": action, **fields})
