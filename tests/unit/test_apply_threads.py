"""A group of actions runs in threads of its own (``reconciler.apply.groups.run_in_threads``); the pass that started them
ends only when every one of them has ended, also when a thread cannot be started (the process at its thread limit):
the actions that could not start are failed outcomes saying why, and those that did start ran to their end."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from planner_fixtures import make_desired, make_observed

from reconciler.apply.applier import Applier
from reconciler.apply.groups import GroupNotStarted, run_in_threads
from reconciler.apply.results import Outcome
from reconciler.plan.actions import Action, ActionKind

CASE = {"recipes": {"omni": {"tp": 1}}, "manifest": []}


@pytest.fixture
def start_fails_at() -> Iterator[Callable[[int], None]]:
    """Make the n-th ``Thread.start`` from now on raise, as it does when the process may start no more threads."""
    real = threading.Thread.start
    state = {"n": 0, "at": 0}

    def start(self: threading.Thread) -> None:
        if self.name.startswith("action-"):
            state["n"] += 1
            if state["n"] == state["at"]:
                raise RuntimeError("can't start new thread")
        real(self)

    def arm(n: int) -> None:
        state["n"], state["at"] = 0, n

    threading.Thread.start = start  # type: ignore[method-assign]
    try:
        yield arm
    finally:
        threading.Thread.start = real  # type: ignore[method-assign]


def leave(slot: str) -> Action:
    return Action(kind=ActionKind.LEAVE, reason="t", recipe="omni", gpus=(slot,), container=f"c-{slot}")


def slow(action: Action, ended: list[str]) -> Callable[[], Outcome]:
    def call() -> Outcome:
        time.sleep(0.4)
        ended.append(action.gpus[0])
        return Outcome(action, "ok", 0.4)

    return call


def action_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("action-")]


def test_a_thread_that_cannot_start_ends_the_group_only_after_the_started_ones_end(
    start_fails_at: Callable[[int], None],
) -> None:
    acts = [leave(s) for s in ("dark-compute-a", "dark-compute-b", "dark-compute-c")]
    ended: list[str] = []
    start_fails_at(2)
    with pytest.raises(GroupNotStarted) as info:
        run_in_threads([slow(a, ended) for a in acts])
    assert action_threads() == [], "a thread of the group outlived it"
    assert ended == ["dark-compute-a"], ended
    assert [o.result if o else None for o in info.value.results] == ["ok", None, None]
    assert "can't start new thread" in str(info.value) and "action 2 of 3" in str(info.value), info.value


def test_a_pass_reports_the_actions_whose_thread_did_not_start_as_failed(
    start_fails_at: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    desired = make_desired(CASE)
    observed = make_observed(CASE, desired)
    applier = Applier(desired, connect=False)
    ended: list[str] = []
    monkeypatch.setattr(applier, "_execute", lambda action, _observed: slow(action, ended)())
    acts = [leave(s) for s in ("dark-compute-a", "dark-compute-b", "dark-compute-c")]
    start_fails_at(3)
    done = applier._execute_group(acts, observed)
    assert action_threads() == []
    assert sorted(ended) == ["dark-compute-a", "dark-compute-b"], ended
    assert [o.result for o in done] == ["ok", "ok", "failed"], done
    assert [o.action for o in done] == acts
    assert "not started: action 3 of 3 could not be given a thread (RuntimeError: can't start new thread)" in (
        done[2].detail
    ), done[2]
    assert applier.io.run_group is run_in_threads  # the host's own (REAL_IO's): each action in a thread of its own
