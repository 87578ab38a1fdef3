"""The plan and what it holds: ``Plan``, its ``Action`` steps (leave, reclaim, enter, prune, sleep, wake), the ``Blocker`` of a
change that cannot be made safely, the ``Held`` enter postponed by backoff and the ``Fallback`` lane serving meanwhile.

Plain frozen values with their JSON form, both ways: each value's ``to_json`` and ``from_json`` side by side, and
``plan_from_json`` (a plan rebuilt from its JSON: ``plan --json``, a saved plan's ``plan``, an approval), so a field
added is written and read in one place; ``tests/unit/test_plan_json.py`` holds the round trip over the planner's own
plans. Made by ``reconciler.plan.planner``, rebuilt from a saved or shown plan by ``reconciler.service.apply_session``,
executed by ``reconciler.apply``, shown by the service, the loop and its metrics. Standard library only: a module
that only reads a plan pays for nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from typing import Any

from reconciler.plan.causes import BlockerCause


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

    @classmethod
    def from_json(cls, a: Mapping[str, Any]) -> Action:
        """An action as ``to_json`` wrote it; the keys an approval adds (``spec``) are compared, not rebuilt."""
        return cls(
            ActionKind(a["kind"]),
            str(a.get("reason") or ""),
            recipe=_text(a.get("recipe")),
            gpus=_strings(a.get("gpus")),
            container=_text(a.get("container")),
            container_id=_text(a.get("container_id")),
            recipe_hash=_text(a.get("recipe_hash")),
            paths=_strings(a.get("paths")),
            bytes=int(a.get("bytes") or 0),
        )


@dataclass(frozen=True)
class Blocker:
    """A needed change that cannot be made safely; the reconciler never kills what it does not own. ``cause``: what
    kind of problem it is, for the advice that goes with it (``BlockerCause``, its advice beside it)."""

    recipe: str
    gpus: tuple[str, ...]
    reason: str
    holder: str = ""
    _: KW_ONLY
    cause: BlockerCause

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "gpus": list(self.gpus),
            "reason": self.reason,
            "holder": self.holder,
            "cause": self.cause.value,
        }

    @classmethod
    def from_json(cls, b: Mapping[str, Any]) -> Blocker:
        return cls(
            str(b["recipe"]),
            _strings(b.get("gpus")),
            str(b.get("reason") or ""),
            str(b.get("holder") or ""),
            cause=BlockerCause(b["cause"]),
        )


@dataclass(frozen=True)
class Held:
    """An enter postponed by the caller (a recipe in backoff after a failed enter)."""

    recipe: str
    gpus: tuple[str, ...]
    reason: str

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "gpus": list(self.gpus), "reason": self.reason}

    @classmethod
    def from_json(cls, h: Mapping[str, Any]) -> Held:
        return cls(str(h["recipe"]), _strings(h.get("gpus")), str(h.get("reason") or ""))


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

    @classmethod
    def from_json(cls, f: Mapping[str, Any]) -> Fallback:
        """A fallback as ``to_json`` wrote it (``text`` is made again from the rest)."""
        when = f.get("next_attempt_s")
        if when is not None and (isinstance(when, bool) or not isinstance(when, int | float)):
            raise ValueError(f"next_attempt_s {when!r} is not a number")
        return cls(
            str(f["recipe"]),
            _strings(f.get("gpus")),
            str(f["instead_of"]),
            _strings(f.get("instead_gpus")),
            next_attempt_s=None if when is None else float(when),
        )


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        """A plan as ``to_json`` wrote it (``changes`` and ``blocked`` are made again from the rest)."""
        return cls(
            host=str(data["host"]),
            actions=tuple(Action.from_json(a) for a in data.get("actions") or ()),
            blockers=tuple(Blocker.from_json(b) for b in data.get("blockers") or ()),
            held=tuple(Held.from_json(h) for h in data.get("held") or ()),
            unavailable=_strings(data.get("unavailable")),
            satisfied=_strings(data.get("satisfied")),
            fallbacks=tuple(Fallback.from_json(f) for f in data.get("fallbacks") or ()),
            kept_serving=_strings(data.get("kept_serving")),
        )


def plan_from_json(data: Mapping[str, Any]) -> Plan:
    """A plan rebuilt from its JSON (``Plan.to_json``; a saved plan's ``plan``, an approval's): what
    ``Applier.converge`` takes as approved. Each blocker keeps its cause. Raises ValueError, "not a plan: ...", on a
    shape that is not a plan's."""
    try:
        return Plan.from_json(data)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"not a plan: {type(exc).__name__}: {exc}") from None


def _strings(v: Any) -> tuple[str, ...]:
    """A list of strings of a plan's JSON as a tuple; ValueError for anything else (None: empty)."""
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"expected a list of strings, not {v!r}")
    return tuple(v)


def _text(v: Any) -> str | None:
    """A string or null of a plan's JSON; ValueError for anything else."""
    if v is not None and not isinstance(v, str):
        raise ValueError(f"expected a string or null, not {v!r}")
    return v
