"""What an action raises when it cannot reach its postcondition, and why: the apply layer's errors.

Raised by the steps of ``reconciler.apply.enter``, ``.leave``, ``.drain`` and ``.ports``; ``Applier._execute``
turns each into its outcome's result ("failed", "refused", "interrupted", "superseded"). The class names are error codes: never
rename one.
"""

from __future__ import annotations

from reconciler.base.errors import ReconcilerError


class ActionFailed(ReconcilerError):
    """An action did not reach its postcondition. ``cause`` is what the operator should read first."""

    code = "action_failed"

    def __init__(self, cause: str, *, detail: str = ""):
        self.cause = cause
        self.detail = detail
        super().__init__(cause)


class BelowReserve(ActionFailed):
    """A lane healthy and settled whose cards report less free VRAM than their reserve, under ``enforce``."""

    code = "below_reserve"


class ProbeFailed(ActionFailed):
    """A lane healthy by its health URL that failed one of its recipe's functional probes."""

    code = "probe_failed"


class PortSquatted(ActionFailed):
    """A lane's health or probe port is held by a process outside its container: nothing was asked there."""

    code = "port_squatted"


class Superseded(ActionFailed):
    """An enter abandoned while it waited for health: the desired state changed so that its lane is no longer
    wanted (an edit, a switch). Kept stopped for its logs as a failed enter is, but no failure of the lane: no
    backoff, and the pass ends so that the new plan runs."""

    code = "superseded"


class ActionRefused(ActionFailed):
    """A preflight said no (the guard refused a reclaim, no tmpfs room): nothing was attempted. ``reason`` is a
    key of the metrics' refusal reasons."""

    code = "action_refused"

    def __init__(self, cause: str, *, reason: str):
        self.reason = reason
        super().__init__(cause)


class Cancelled(ReconcilerError):
    """A stop was requested (SIGINT/SIGTERM); the current action was abandoned at a safe point."""

    code = "cancelled"
