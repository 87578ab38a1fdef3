"""The plan and what it holds: ``Plan``, its ``Action`` steps (leave, reclaim, enter, prune, sleep, wake), the ``Blocker`` of a
change that cannot be made safely, the ``Held`` enter postponed by backoff and the ``Fallback`` lane serving meanwhile.

Plain frozen values with their JSON form. Made by ``reconciler.plan.planner``, rebuilt from a saved plan by
``reconciler.plan.fingerprint``, executed by ``reconciler.apply``, shown by the service, the loop and its metrics.
Standard library only: a module that only reads a plan pays for nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class ActionKind(str, Enum):
    LEAVE = "leave"
    RECLAIM = "reclaim"
    ENTER = "enter"
    PRUNE = "prune"  # remove a failed container kept for its logs (stopped; it holds no slot and no file)
    SLEEP = "sleep"  # a lane whose topology is on standby: drained, put to sleep (vLLM's sleep mode), kept
    WAKE = "wake"  # a sleeping lane whose topology runs now: woken, probed; a failed wake is a failed enter


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str
    recipe: str | None = None
    gpus: tuple[str, ...] = ()
    container: str | None = None
    container_id: str | None = None
    recipe_hash: str | None = None
    paths: tuple[str, ...] = ()
    bytes: int = 0
    offload: bool = False
    # A leave of a container that exited by itself: the code it exited with, as data (the loop's crash backoff
    # counts a non-zero one). Not part of what an approval compares: the reason already says it in words.
    exit_code: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """What this action is about: the assignment (recipe@slots) or, for reclaim, the shm dir."""
        if self.kind is ActionKind.RECLAIM:
            return "reclaim"
        if self.kind is ActionKind.PRUNE:
            return self.container or ""
        return f"{self.recipe}@{'+'.join(self.gpus)}"

    def to_json(self) -> dict:
        return {
            "kind": self.kind.value,
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "container": self.container,
            "paths": list(self.paths),
            "reason": self.reason,
            "container_id": self.container_id,
            "recipe_hash": self.recipe_hash,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class Blocker:
    """A needed change that cannot be made safely; the reconciler never kills what it does not own."""

    recipe: str
    gpus: tuple[str, ...]
    reason: str
    holder: str = ""
    kind: str = ""  # set where the holder alone does not tell the cause ("adopt")

    @property
    def cause(self) -> str:
        """What kind of problem this is, for the advice that goes with it: ``held`` (something not ours, or
        another assignment of ours, holds a slot), ``adopt`` (a container carries this host's labels but not this
        install's id), ``memory`` (the card has VRAM in use and lists no process), ``tmpfs`` (no room for the
        offload file), ``source`` (a source could not vouch for the slots or the offload files: telemetry down,
        GPU not found, /proc unreadable), or a knowable failure of the enter itself: ``image`` (not on the engine),
        ``runtime`` (no NVIDIA runtime for ``docker.gpu_requests``), ``port`` (its port taken), ``recipe`` (its
        command contradicts it)."""
        if self.kind:
            return self.kind
        if self.holder == "tmpfs":
            return "tmpfs"
        return "held" if self.holder else "source"

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "reason": self.reason,
            "holder": self.holder,
            "cause": self.cause,
        }


@dataclass(frozen=True)
class Held:
    """An enter postponed by the caller (a recipe in backoff after a failed enter)."""

    recipe: str
    gpus: tuple[str, ...]
    reason: str

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "gpus": list(self.gpus), "reason": self.reason}


@dataclass(frozen=True)
class Fallback:
    """A slot set that serves the last converged topology's lane while the wanted one waits in backoff."""

    recipe: str
    gpus: tuple[str, ...]
    instead_of: str  # the held assignment's recipe
    instead_gpus: tuple[str, ...]
    next_attempt_s: float | None = None

    @property
    def text(self) -> str:
        when = (
            f"next attempt in {self.next_attempt_s:.0f} s"
            if self.next_attempt_s is not None
            else "next attempt after its backoff"
        )
        return (
            f"fallback: {self.recipe} on {','.join(self.gpus)} while {self.instead_of} on "
            f"{','.join(self.instead_gpus)} is held ({when})"
        )

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "instead_of": self.instead_of,
            "instead_gpus": list(self.instead_gpus),
            "next_attempt_s": self.next_attempt_s,
            "text": self.text,
        }


@dataclass(frozen=True)
class Plan:
    host: str
    actions: tuple[Action, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    held: tuple[Held, ...] = ()
    # Observation sources that failed: the plan is then incomplete and nothing that needs them may run.
    unavailable: tuple[str, ...] = ()
    satisfied: tuple[str, ...] = field(default=())  # container names already matching their assignment
    fallbacks: tuple[Fallback, ...] = ()  # lanes of the last converged topology serving a held lane's slots
    # Lanes of ours that stay awake and serving on a card a blocked action wanted (sleeping lanes rule 8): what
    # would replace them there cannot run, so they neither leave nor sleep.
    kept_serving: tuple[str, ...] = ()

    @property
    def blocked(self) -> bool:
        return bool(self.blockers)

    @property
    def changes(self) -> bool:
        return bool(self.actions or self.blockers)

    @property
    def converged(self) -> bool:
        return not self.actions and not self.blockers and not self.held and not self.unavailable

    @property
    def apply_refusal(self) -> str | None:
        """Why an apply of this plan runs none of its actions, or None where it runs them (the unblocked ones): a
        source that did not answer (safety rule 3: a pass acts only on a whole view of the host). The applier's
        pass ends on it before its first action and ``plan``'s summary says it, so a plan never promises what
        apply refuses."""
        if not self.unavailable:
            return None
        names = " and ".join(self.unavailable)
        return f"the {names} source{'s are' if len(self.unavailable) > 1 else ' is'} unavailable"

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "changes": self.changes,
            "blocked": self.blocked,
            "actions": [a.to_json() for a in self.actions],
            "blockers": [b.to_json() for b in self.blockers],
            "held": [h.to_json() for h in self.held],
            "unavailable": list(self.unavailable),
            "satisfied": list(self.satisfied),
            "fallbacks": [f.to_json() for f in self.fallbacks],
            "kept_serving": list(self.kept_serving),
        }
