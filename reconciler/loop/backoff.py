"""Per-assignment exponential backoff after failed enters, so a recipe that crashes on start is not restarted in
a hot loop. Pure state with an injected clock; the loop owns one and feeds its ``holds()`` to the planner.

An edit of the recipe (its content hash) or of its assignment (the key recipe@slots) resets the backoff: the
operator changed something, so the next try is immediate.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass


@dataclass
class Entry:
    recipe: str
    recipe_hash: str
    failures: int
    until: float
    last_error: str


class Backoff:
    def __init__(
        self,
        *,
        base_s: float = 10.0,
        factor: float = 2.0,
        max_s: float = 600.0,
        stable_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ):
        self.base_s = base_s
        self.stable_s = stable_s  # running this long past its backoff clears an assignment's failure count
        self.factor = factor
        self.max_s = max_s
        self.clock = clock
        self.entries: dict[str, Entry] = {}

    def failed(self, key: str, *, recipe: str, recipe_hash: str, error: str) -> Entry:
        prev = self.entries.get(key)
        failures = prev.failures + 1 if prev and prev.recipe_hash == recipe_hash else 1
        entry = Entry(recipe, recipe_hash, failures, self.clock() + self.delay(failures), error[:500])
        self.entries[key] = entry
        return entry

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed enters in a row: base_s * factor ** (failures - 1), at most max_s.

        The exponent stops where the delay reaches max_s: a float power overflows past 1,023 doublings, and a lane
        that fails for days gets there (an OverflowError then escaped every later failure's handling)."""
        exponent = failures - 1
        if self.factor > 1 and self.base_s > 0:
            exponent = min(exponent, max(0, math.ceil(math.log(self.max_s / self.base_s, self.factor))))
        try:
            return min(self.max_s, self.base_s * self.factor**exponent)
        except OverflowError:  # a factor so large that even the capped power is out of range: past any cap
            return self.max_s

    def succeeded(self, key: str) -> bool:
        return self.entries.pop(key, None) is not None

    def forget_changed(self, current: Mapping[str, str], *, recipes: Mapping[str, str] | None = None) -> list[str]:
        """Drop entries whose assignment is gone or whose recipe hash changed; ``current`` maps key -> hash.

        ``recipes`` maps each recipe that exists to its hash. An entry of a lane that is not in the manifest (a
        fallback: the last converged topology's lane serving a held one's slots) stays while its recipe exists
        unchanged and entries of the manifest that stay cover all its slots: forgotten each pass, a fallback that
        keeps failing was retried at the base delay for as long as the lane it serves was held.
        """
        kept = {k for k, e in self.entries.items() if current.get(k) == e.recipe_hash}
        held = {s for k in kept for s in _slots(k)}
        gone = [
            k
            for k, e in self.entries.items()
            if k not in kept
            and not (
                k not in current
                and recipes is not None
                and recipes.get(e.recipe) == e.recipe_hash
                and _slots(k) <= held
            )
        ]
        for k in gone:
            del self.entries[k]
        return gone

    def holds(self) -> dict[str, str]:
        """Assignment keys whose enter must wait, with the reason the plan shows.

        The delays run on the wall clock (they outlive a restart), which can be stepped back (NTP, ``date -s``, a VM
        resumed): a wait longer from now than its own delay is cut to that delay, else one failure held a lane for
        as long as the clock went back."""
        now = self.clock()
        out = {}
        for key, e in self.entries.items():
            e.until = min(e.until, now + self.delay(e.failures))
            if e.until > now:
                out[key] = (
                    f"in backoff after {e.failures} failed enter(s); next try in {e.until - now:.0f} s "
                    f"(last error: {e.last_error})"
                )
        return out

    def to_json(self) -> dict[str, dict]:
        return {k: asdict(e) for k, e in self.entries.items()}

    def dumps(self) -> str:
        return json.dumps(self.to_json())


def _slots(key: str) -> set[str]:
    """The slots of an assignment key (``recipe@slot+slot``, see ``model.assignment_key``); names hold no '@' or '+'."""
    return set(key.partition("@")[2].split("+")) - {""}
