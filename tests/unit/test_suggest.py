"""Did-you-mean for a mistyped topology, recipe or slot (``reconciler.base.suggest``): the likely name and the known
ones as words, never a Python list (issue 44, item 8)."""

from __future__ import annotations

from reconciler.base.suggest import closest, did_you_mean


def test_a_name_that_differs_in_case_or_by_a_typo_is_named() -> None:
    assert closest("Split", ["exclusive", "split"]) == "split"
    assert closest("exclusiv", ["exclusive", "split"]) == "exclusive"
    assert closest("omni", ["deepseek-256k-offload"]) is None
    assert did_you_mean("Split", ["split", "exclusive"], what="its topologies") == (
        "did you mean split? (its topologies: exclusive, split)"
    )
    assert did_you_mean("zzz", ["split"], what="its topologies") == "its topologies: split"
    assert did_you_mean("zzz", [], what="recipes") == "no recipes"
