"""Which edits supersede an enter waiting for its health (``reconciler.plan.supersede``, pure): a lane edited, moved
or dropped is no longer wanted; an edit of anything else leaves the enter alone, and a fallback's enter is never
judged (docs/design.md, "The loop")."""

from __future__ import annotations

from planner_fixtures import make_desired

from reconciler.plan.actions import Action, ActionKind
from reconciler.plan.supersede import superseded_by

B = "dark-compute-b"


def _enter(recipe: str, *slots: str) -> Action:
    return Action(ActionKind.ENTER, "no container of it is running", recipe=recipe, gpus=slots)


def _desired(omni: dict | None = None, *, manifest: list | None = None, other: dict | None = None):  # type: ignore[no-untyped-def]
    return make_desired(
        {
            "recipes": {"omni": omni or {}, "chat": other or {}},
            "manifest": manifest if manifest is not None else [{"omni": [B]}],
        }
    )


def test_an_edit_of_the_entered_recipe_supersedes_its_enter() -> None:
    before = _desired({"port": 8101})
    why = superseded_by(_enter("omni", B), before, _desired({"port": 8102}))
    assert why is not None and why.startswith("recipe omni was edited (recipe changed)"), why


def test_a_lane_no_longer_assigned_is_superseded() -> None:
    before = _desired()
    why = superseded_by(_enter("omni", B), before, _desired(manifest=[{"chat": [B]}]))
    assert why == f"omni@{B} is no longer wanted: the manifest does not assign it any more"
    moved = superseded_by(_enter("omni", B), before, _desired(manifest=[{"omni": ["dark-compute-a"]}]))
    assert moved is not None and "no longer wanted" in moved


def test_an_unrelated_edit_or_the_same_files_supersede_nothing() -> None:
    before = _desired()
    assert superseded_by(_enter("omni", B), before, before) is None
    assert superseded_by(_enter("omni", B), before, _desired()) is None  # loaded again, equal
    assert superseded_by(_enter("omni", B), before, _desired(other={"image": "other"})) is None


def test_an_enter_the_desired_state_did_not_want_is_never_judged() -> None:
    """A fallback's enter (the last converged topology's lane) is not in the manifest: an edit does not stop it here."""
    before = _desired(manifest=[])
    assert superseded_by(_enter("omni", B), before, _desired(manifest=[{"chat": [B]}])) is None
    leave = Action(ActionKind.LEAVE, "gone", recipe="omni", gpus=(B,), container="c", container_id="x")
    assert superseded_by(leave, _desired(), _desired(manifest=[])) is None
