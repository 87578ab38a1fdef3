"""A plan's JSON, both ways, over the planner's own plans: every case of tests/cases/plan/ made into a plan, written
(``Plan.to_json``, and as an approval holds it: ``approval_json``), read back (``plan_from_json``) and written again
is the same JSON, each blocker with its cause and each fallback with its next attempt; and every cause of a blocker
has its advice and the refusal it is counted as beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from planner_fixtures import make_desired, make_observed

from reconciler.loop.metric_families import REFUSAL_REASONS
from reconciler.model import DesiredState
from reconciler.plan.actions import Plan, plan_from_json
from reconciler.plan.causes import UNKNOWN_ADVICE, BlockerCause, advice_for
from reconciler.plan.fingerprint import approval_json
from reconciler.plan.planner import plan

CASES = sorted((Path(__file__).parent.parent / "cases" / "plan").glob("*.yaml"))


def _planned(path: Path) -> tuple[DesiredState, Plan]:
    case = yaml.safe_load(path.read_text())
    desired = make_desired(case)
    observed = make_observed(case, desired)
    last_good = tuple((r, tuple(s)) for entry in case.get("last_good") or [] for r, s in entry.items())
    return desired, plan(
        desired, observed, hold=case.get("hold"), last_good=last_good, next_attempt=case.get("next_attempt")
    )


def _wire(data: dict) -> dict:
    """As a saved plan's file, the API or a loop's answer carries it."""
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_a_planned_plan_reads_back_as_itself(path: Path) -> None:
    desired, p = _planned(path)
    back = plan_from_json(_wire(p.to_json()))
    assert back.to_json() == p.to_json()
    assert back.blockers == p.blockers and back.held == p.held and back.fallbacks == p.fallbacks
    assert [b.cause for b in back.blockers] == [b.cause for b in p.blockers]
    # As an approval holds it (a saved plan's "plan": redacted, each action with its recipe's spec).
    approved = _wire(approval_json(p, desired))
    assert approval_json(plan_from_json(approved), desired) == approved


def test_the_cases_reach_every_cause_and_its_fallbacks() -> None:
    """The round trip above is over plans blocked for every cause there is, and over fallbacks with a next
    attempt: what a reader that dropped either would lose."""
    seen: set[BlockerCause] = set()
    timed = 0
    for path in CASES:
        _, p = _planned(path)
        seen |= {b.cause for b in p.blockers}
        timed += sum(1 for f in p.fallbacks if f.next_attempt_s is not None)
    assert seen == set(BlockerCause), set(BlockerCause) - seen
    assert timed, "no case plans a fallback with its next attempt"


def test_the_json_names_a_cause_by_its_word() -> None:
    _, p = _planned(next(c for c in CASES if c.name.startswith("29-")))
    (b,) = p.to_json()["blockers"]
    assert b["cause"] == "adopt" and type(b["cause"]) is str, b
    assert json.dumps(b["cause"]) == '"adopt"'


def test_a_blocker_without_a_known_cause_is_not_a_plan() -> None:
    _, p = _planned(next(c for c in CASES if c.name.startswith("06-")))
    data = _wire(p.to_json())
    data["blockers"][0]["cause"] = "weather"
    with pytest.raises(ValueError, match="not a plan"):
        plan_from_json(data)
    del data["blockers"][0]["cause"]
    with pytest.raises(ValueError, match="not a plan"):
        plan_from_json(data)
    with pytest.raises(ValueError, match="not a plan"):
        plan_from_json({"host": "h", "fallbacks": [{"recipe": "r", "instead_of": "s", "next_attempt_s": "soon"}]})


def test_each_cause_has_its_advice_and_its_counted_refusal() -> None:
    advice = [c.advice for c in BlockerCause]
    assert all(advice) and len(set(advice)) == len(advice)
    assert {c.refusal for c in BlockerCause} <= set(REFUSAL_REASONS)
    assert advice_for("held") == BlockerCause.HELD.advice
    assert advice_for("a word of a newer release") == UNKNOWN_ADVICE
