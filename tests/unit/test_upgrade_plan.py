"""What the plan makes of a lane an earlier (or a later) release made (docs/design.md, "The recipe's hash across
releases"): a lane of the same recipe is kept, whatever keys the release added; a recreate that a changed default
alone makes names the changed default; a lane of a newer release's hash version that differs says so.

A changed default is played by a ``DefaultChange`` of the test's own: the release before had ``stop.timeout_s``
default to 240, this one to 180 (the model's), and the recipe leaves it unwritten.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from planner_fixtures import make_desired, make_observed

from reconciler.model import DesiredState
from reconciler.model import recipe_hash as rh
from reconciler.plan import spec
from reconciler.plan.actions import ActionKind
from reconciler.plan.observed import (
    LABEL_HASH_VERSION,
    LABEL_RECIPE_HASH,
    LABEL_SPEC_HASH,
    LABEL_SPEC_PARTS,
    ContainerView,
    Observed,
)
from reconciler.plan.planner import plan

SLOT = "dark-compute-a"
CASE: dict[str, Any] = {
    "recipes": {"omni": {}},
    "manifest": [{"omni": [SLOT]}],
    "observed": {"containers": [{"name": "lane", "managed": True, "recipe": "omni", "slots": [SLOT]}]},
}
CHANGE = rh.DefaultChange(2, "stop.timeout_s", 240, 180, "stops wait less")


def _labelled(desired: DesiredState, recipe: Any, **extra: str) -> Observed:
    """The case's lane, labelled as ``recipe`` (the recipe as an earlier release read it) made it."""
    observed = make_observed(CASE, desired)
    [c] = observed.containers
    parts = spec.part_hashes(desired.host, recipe, (SLOT,))
    labels = {
        **c.labels,
        LABEL_RECIPE_HASH: recipe.content_hash(),
        LABEL_SPEC_HASH: spec.spec_hash(parts),
        LABEL_SPEC_PARTS: spec.encode_parts(parts),
        **extra,
    }
    return replace(observed, containers=(ContainerView(**{**c.__dict__, "labels": labels}),))


def _leave_reason(desired: DesiredState, observed: Observed) -> str:
    p = plan(desired, observed)
    [leave] = [a for a in p.actions if a.kind is ActionKind.LEAVE]
    assert [a.kind for a in p.actions].count(ActionKind.ENTER) == 1
    return leave.reason


def test_a_lane_of_the_same_recipe_is_kept() -> None:
    desired = make_desired(CASE)
    p = plan(desired, make_observed(CASE, desired))
    assert p.actions == () and len(p.satisfied) == 1


def test_a_changed_default_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rh, "DEFAULT_CHANGES", (CHANGE,))
    desired = make_desired(CASE)
    recipe = desired.recipes["omni"]
    before = recipe.model_copy(update={"stop": recipe.stop.model_copy(update={"timeout_s": 240})})
    reason = _leave_reason(desired, _labelled(desired, before))
    assert "was made before a release changed a default its recipe leaves unwritten" in reason, reason
    assert "stop.timeout_s defaults to 180 instead of 240 (hash version 2: stops wait less)" in reason
    assert reason.endswith(": recreate")
    # Without the change known, the same lane is an unexplained change: the reason above comes from the record.
    monkeypatch.setattr(rh, "DEFAULT_CHANGES", ())
    assert "differs from what the files now make" in _leave_reason(desired, _labelled(desired, before))


def test_a_lane_that_differs_otherwise_is_not_called_a_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rh, "DEFAULT_CHANGES", (CHANGE,))
    desired = make_desired(CASE)
    recipe = desired.recipes["omni"]
    other = recipe.model_copy(
        update={
            "stop": recipe.stop.model_copy(update={"timeout_s": 240}),
            "container": recipe.container.model_copy(update={"image": "img:older"}),
        }
    )
    reason = _leave_reason(desired, _labelled(desired, other))
    assert "differs from what the files now make" in reason and "default" not in reason, reason
    # A lane the migration's own release made (labelled with version 2) is judged by its hash, and matches.
    now = _labelled(desired, recipe, **{LABEL_HASH_VERSION: "2"})
    assert plan(desired, now).actions == ()


@pytest.mark.parametrize("label", ["9", "x"])
def test_a_newer_releases_lane_that_differs_says_so(label: str) -> None:
    desired = make_desired(CASE)
    recipe = desired.recipes["omni"]
    other = recipe.model_copy(update={"stop": recipe.stop.model_copy(update={"timeout_s": 240})})
    reason = _leave_reason(desired, _labelled(desired, other, **{LABEL_HASH_VERSION: label}))
    assert f"was made by a newer reconciler (hash version {label}; this one's is 1)" in reason, reason
    # The same lane, matching: a newer release's label alone recreates nothing.
    assert plan(desired, _labelled(desired, recipe, **{LABEL_HASH_VERSION: label})).actions == ()


def test_a_container_without_the_label_is_of_version_1() -> None:
    c = ContainerView(id="c" * 64, name="n", state="running", image="i")
    assert c.hash_version == 1
    assert replace(c, labels={LABEL_HASH_VERSION: "2"}).hash_version == 2
    assert replace(c, labels={LABEL_HASH_VERSION: "٣"}).hash_version is None  # a digit, but not an ASCII one
    inherited = replace(c, labels={LABEL_HASH_VERSION: "7"}, inherited=frozenset({LABEL_HASH_VERSION}))
    assert inherited.hash_version == 1, "an image's label is never the container's"
