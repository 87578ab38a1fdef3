"""A name a person mistyped, and the one they probably meant: ``did_you_mean`` (difflib's close matches, a match
that differs only in case first). Used where a command or a file names a topology, a recipe or a GPU slot that does
not exist: the error names the likely one and the known ones as words, never as a Python list.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The known name ``word`` most likely meant, or None: one that differs only in case, else difflib's closest
    above its usual cutoff."""
    names = sorted(set(choices))
    same = [n for n in names if n.lower() == word.lower()]
    if same:
        return same[0]
    close = difflib.get_close_matches(word, names, n=1)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str], *, what: str) -> str:
    """ "did you mean split? (topologies: exclusive, split)", or just the known ones when none is close; ``what``
    names them ("topologies")."""
    names = sorted(set(choices))
    known = f"{what}: {', '.join(names)}" if names else f"no {what}"
    guess = closest(word, names)
    return f"did you mean {guess}? ({known})" if guess else known
