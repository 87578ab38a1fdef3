"""The approval fingerprint covers the desired state as values, by construction (reconciler/plan/inputs.py, safety
rule 13): every field of the desired state, each recipe and the host file whole, the commit in use; a field added
later to a recipe's sub-model, to the host file or to the desired state itself moves it without an edit of
reconciler/plan/fingerprint.py or inputs.py, and what changed is said in words. The approved plan's actions carry the
full specification of their recipe, which its hash leaves out (probes, drain, sleep, gpu_reserve)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest
from planner_fixtures import make_desired, make_observed
from pydantic import Field

from reconciler.model import DesiredState
from reconciler.model.probe_spec import ProbeSpec
from reconciler.model.recipe import DrainSpec
from reconciler.plan.actions import Action, ActionKind, Plan
from reconciler.plan.fingerprint import Fingerprint, approval_json, fingerprint, input_parts, plan_differences
from reconciler.plan.inputs import desired_lines, jsonable, recipe_spec

B = "dark-compute-b"
A_COMMIT, B_COMMIT = "2649ad3" + "0" * 33, "4910b38" + "1" * 33


def _case() -> dict[str, Any]:
    return {"recipes": {"omni": {}, "other": {}}, "manifest": [{"omni": [B]}], "observed": {}}


def _with_probe(desired: DesiredState, probe: ProbeSpec, recipe: str = "omni") -> DesiredState:
    r = desired.recipes[recipe]
    return replace(desired, recipes={**desired.recipes, recipe: r.model_copy(update={"probes": [probe]})})


def _fp(desired: DesiredState) -> Fingerprint:
    return fingerprint({}, desired, make_observed(_case(), desired), {})


def test_a_field_added_to_a_recipes_sub_model_moves_the_fingerprint() -> None:
    """A probe model with a field the code does not know yet (a subclass, as a later release would add it): two
    values of it are two fingerprints, named by the probe, with no edit of the fingerprint's code."""

    class LaterProbe(ProbeSpec):
        retries: int = Field(default=0)

    class LaterDrain(DrainSpec):
        grace_s: float = Field(default=0.0)

    base = make_desired(_case())
    smoke = LaterProbe(name="smoke", prompt="hi", retries=1)
    one = _with_probe(base, smoke)
    two = _with_probe(base, smoke.model_copy(update={"retries": 2}))
    assert one.recipes["omni"].content_hash() == two.recipes["omni"].content_hash(), "the hash leaves probes out"
    assert desired_lines(one) != desired_lines(two)
    assert _fp(two).digest != _fp(one).digest
    assert _fp(two).changes_since(_fp(one)) == ["recipe omni's probe smoke changed"]
    # The same for the drain's new field, and for a value of an existing free-form field (the container's env).
    omni = base.recipes["omni"]
    drained = replace(
        base, recipes={**base.recipes, "omni": omni.model_copy(update={"drain": LaterDrain(grace_s=5.0)})}
    )
    assert _fp(drained).changes_since(_fp(base)) == ["recipe omni's drain changed"]
    env = omni.container.model_copy(update={"env": {**omni.container.env, "VLLM_LOGGING_LEVEL": "DEBUG"}})
    logged = replace(base, recipes={**base.recipes, "omni": omni.model_copy(update={"container": env})})
    assert _fp(logged).changes_since(_fp(base)) == ["recipe omni's container changed"]


def test_a_field_added_to_the_desired_state_or_the_host_file_moves_it() -> None:
    @dataclasses.dataclass(frozen=True)
    class LaterState(DesiredState):
        quiet_hours: tuple[str, ...] = ()

    base = make_desired(_case())
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    early, late = LaterState(**fields, quiet_hours=("22-06",)), LaterState(**fields, quiet_hours=("23-06",))
    assert _fp(late).changes_since(_fp(early)) == ["the manifest's quiet_hours changed"]
    host = base.host.model_copy(update={"gpu_telemetry": "nvml"})
    assert _fp(replace(base, host=host)).changes_since(_fp(base)) == ["the host file's gpu_telemetry changed"]
    slot = base.host.gpus[B].model_copy(update={"free_gib": 4.0})
    host = base.host.model_copy(update={"gpus": {**base.host.gpus, B: slot}})
    assert _fp(replace(base, host=host)).changes_since(_fp(base)) == [f"the host file's gpu {B} changed"]


def test_a_move_of_the_git_source_is_named_with_what_it_changed() -> None:
    smoke = ProbeSpec(name="smoke", prompt="hi")
    at_a = replace(_with_probe(make_desired(_case()), smoke), source_commit=A_COMMIT)
    at_b = replace(_with_probe(at_a, smoke.model_copy(update={"prompt": "hello"})), source_commit=B_COMMIT)
    assert _fp(at_b).changes_since(_fp(at_a)) == [
        "the git source moved from 2649ad3 to 4910b38: recipe omni's probe smoke changed"
    ]
    same = replace(at_a, source_commit=B_COMMIT)
    assert _fp(same).changes_since(_fp(at_a)) == [
        "the git source moved from 2649ad3 to 4910b38: nothing this host reads changed"
    ]
    local = replace(at_a, source_commit=None)
    assert _fp(at_a).changes_since(_fp(local)) == [
        "the desired state now comes from the git source at 2649ad3 (before: this root's own files)"
        ": nothing this host reads changed"
    ]


def test_recipes_and_probes_added_or_removed_are_said_once() -> None:
    base = make_desired(_case())
    smoke = ProbeSpec(name="smoke", prompt="hi")
    probed = _with_probe(base, smoke)
    assert _fp(probed).changes_since(_fp(base)) == ["recipe omni's probe smoke added"]
    more = replace(
        probed,
        recipes={
            **probed.recipes,
            "omni": probed.recipes["omni"].model_copy(update={"probes": [smoke, ProbeSpec(name="long", prompt="x")]}),
        },
    )
    assert _fp(more).changes_since(_fp(probed)) == ["recipe omni's probe long added"]
    swapped = replace(
        more,
        recipes={
            **more.recipes,
            "omni": more.recipes["omni"].model_copy(update={"probes": list(reversed(more.recipes["omni"].probes))}),
        },
    )
    assert _fp(swapped).changes_since(_fp(more)) == ["recipe omni's probes changed"]  # their order
    fewer = replace(base, recipes={"omni": base.recipes["omni"]})
    assert _fp(fewer).changes_since(_fp(base)) == ["recipe other removed"]


def test_the_desired_state_is_hashed_whole_and_the_same_in_every_process() -> None:
    base = make_desired(_case())
    parts = input_parts(base, make_observed(_case(), base), {})
    assert parts["source"] == ["this root's own files"]
    assert any(line.startswith("recipe omni's probes sha256:") for line in parts["desired"])
    # Sets are sorted: no hash-seed order reaches a digest.
    assert jsonable(frozenset({"b", "a", "c"})) == ["a", "b", "c"]
    with pytest.raises(TypeError, match="no JSON form"):
        jsonable(object())


def test_an_action_is_compared_with_its_recipes_full_specification() -> None:
    """Two plans of the same steps whose recipe differs only where its hash does not look (the probes, the drain,
    the sleep, the reserve) are two plans."""
    base = make_desired(_case())
    enter = Action(ActionKind.ENTER, "wanted", recipe="omni", gpus=(B,), recipe_hash="h1")
    leave = Action(ActionKind.LEAVE, "gone", recipe="gone", gpus=(B,), container="c", container_id="id1")
    p = Plan(host="h", actions=(leave, enter))
    saved = approval_json(p, base)
    assert [a["spec"] for a in saved["actions"]] == [None, recipe_spec(base.recipes["omni"])]
    assert plan_differences(saved, approval_json(p, base)) == []
    omni = base.recipes["omni"]
    for change in (
        {"probes": [ProbeSpec(name="smoke", prompt="hi")]},
        {"drain": omni.drain.model_copy(update={"timeout_s": 7.0})},
        {"gpu_reserve": omni.gpu_reserve.model_copy(update={"policy": "enforce"})},
    ):
        other = replace(base, recipes={**base.recipes, "omni": omni.model_copy(update=change)})
        assert other.recipes["omni"].content_hash() == omni.content_hash()
        diff = plan_differences(saved, approval_json(p, other))
        assert diff == [f"plan: enter omni@{B}: its recipe's probes, drain, sleep or reserve changed"], (change, diff)
