"""A lane's label and its secrets (reconciler/plan/planner.py ``_matches``, reconciler/plan/spec.py): the spec hash a
label carries takes each secret by its keyed digest, and a lane an earlier version labelled with the plain sha256
of the same value is taken for the same lane (an upgrade recreates nothing), while one labelled from another value
(a rotated secret) is recreated. Pure: the planner's own decision on values."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import yaml

from reconciler.load.secrets import keyed_digest
from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe
from reconciler.plan import spec
from reconciler.plan.observed import LABEL_SPEC_PARTS, ContainerView
from reconciler.plan.planner import _matches

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo"
SLOTS = ("dark-compute-b",)


def _desired(value: str) -> DesiredState:
    host = HostConfig.model_validate(yaml.safe_load((DEMO / "configs" / "host.yaml").read_text()))
    data = tomllib.loads((DEMO / "configs" / "recipes" / "omni.toml").read_text())
    data["container"]["env"] = {**data["container"].get("env", {}), "HF_TOKEN": "${HF_TOKEN}"}
    recipe = Recipe.model_validate(data)
    return DesiredState(
        host=host,
        recipes={"omni": recipe},
        assignments=(DesiredAssignment("omni", SLOTS, recipe.content_hash(), recipe.offload.capacity_bytes),),
        secret_digests={"HF_TOKEN": keyed_digest(b"k" * 32, "HF_TOKEN", value)},
        legacy_secret_digests={"HF_TOKEN": hashlib.sha256(value.encode()).hexdigest()},
    )


def _lane(desired: DesiredState, digests: dict[str, str]) -> ContainerView:
    parts = spec.part_hashes(desired.host, desired.recipes["omni"], SLOTS, secret_digests=digests)
    return ContainerView(
        "c1", "reconciler-omni-dark-compute-b", "running", "img", {LABEL_SPEC_PARTS: spec.encode_parts(parts)}
    )


def test_a_lane_labelled_by_an_earlier_version_is_not_recreated_for_the_upgrade() -> None:
    desired = _desired("hf_live_SAME")
    (d,) = desired.assignments
    parts = spec.part_hashes(desired.host, desired.recipes["omni"], SLOTS, secret_digests=desired.secret_digests)
    assert _matches(_lane(desired, dict(desired.secret_digests)), d, parts, desired) == []
    old = _lane(desired, {"HF_TOKEN": hashlib.sha256(b"hf_live_SAME").hexdigest()})
    assert spec.decode_parts(old.labels[LABEL_SPEC_PARTS])["env"] != parts["env"]  # labelled otherwise ...
    assert _matches(old, d, parts, desired) == []  # ... and still the same lane
    rotated = _lane(desired, {"HF_TOKEN": hashlib.sha256(b"hf_live_BEFORE_ROTATION").hexdigest()})
    assert _matches(rotated, d, parts, desired) == ["env"]
