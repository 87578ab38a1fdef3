"""``reconciler run``'s loop and its parts: the loop itself is ``reconciler.loop.loop`` (``Loop``); beside it its
``log``, ``triggers``, ``hosting``, ``refusals``, ``runtime``, ``backoff``, ``failures``, ``changes``, ``metrics``,
``pass_labels``, ``progress``, ``health`` and ``source`` (the git source's fetches).

The package imports nothing itself: a module that needs one part (the log, the refusals' words) loads that part
alone, not the loop with its apply layer. ``from reconciler.loop import Loop`` still works, on first use.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Loop":
        from reconciler.loop.loop import Loop  # the start-up budget: the loop's parts load without the loop

        return Loop
    raise AttributeError(f"module 'reconciler.loop' has no attribute {name!r}")
