"""The front door's names (docs/design.md, the front door): which names a recipe's server answers to, the manifest's
aliases in both forms, demand's own checks and host.yaml's door: section."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from reconciler.model import DoorConfig, HostConfig, Manifest, Recipe, served_names


def _recipe(command: list[str], **model: object) -> Recipe:
    return Recipe.model_validate(
        {
            "tensor_parallel_size": 1,
            "model": {"id": "org/model", **model},
            "container": {"image": "x:1", "command": command},
        }
    )


def test_every_served_model_name_of_the_command_counts() -> None:
    r = _recipe(["vllm", "serve", "/m", "--served-model-name", "coder", "coder-long", "--port", "8000"])
    assert served_names(r) == ("coder", "coder-long")
    assert served_names(_recipe(["sh", "-c", "vllm serve /m --served-model-name=one"])) == ("one",)


def test_served_names_then_the_model_id() -> None:
    assert served_names(_recipe(["vllm", "serve", "/m"], served_names=["a", "b"])) == ("a", "b")
    assert served_names(_recipe(["vllm", "serve", "/m"])) == ("org/model",)
    with pytest.raises(ValidationError, match="twice"):
        _recipe(["vllm"], served_names=["a", "a"])
    with pytest.raises(ValidationError, match="space or control"):
        _recipe(["vllm"], served_names=["a b"])


def _manifest(**extra: object) -> Manifest:
    return Manifest.model_validate(
        {
            "host": "h",
            "topologies": {"split": [], "exclusive": []},
            "topology": "split",
            **extra,
        }
    )


def test_aliases_short_and_long_form() -> None:
    m = _manifest(aliases={"coding-agent": "coder", "review": {"recipe": "big", "gates": {"max_tokens": 4096}}})
    targets = m.alias_targets()
    assert targets["coding-agent"].recipe == "coder" and targets["coding-agent"].gates == {}
    assert targets["review"].recipe == "big" and targets["review"].gates == {"max_tokens": 4096}
    with pytest.raises(ValidationError, match=r"gates\.bad"):
        _manifest(
            aliases={
                "x": {"recipe": "r", "gates": {"bad": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}}}
            }
        )


def test_demand_is_checked_against_the_topologies() -> None:
    assert _manifest(demand={"topologies": ["split", "exclusive"], "default": "split"}).demand is not None
    with pytest.raises(ValidationError, match="not under topologies"):
        _manifest(demand={"topologies": ["split", "other"], "default": "split"})
    with pytest.raises(ValidationError, match=r"demand\.default"):
        _manifest(demand={"topologies": ["split", "exclusive"], "default": "third"})
    with pytest.raises(ValidationError, match="no topologies: map"):
        Manifest.model_validate({"host": "h", "demand": {"topologies": ["a", "b"], "default": "a"}})


def test_door_defaults_to_loopback() -> None:
    host = HostConfig.model_validate({"name": "h", "gpus": {"a": {"index": 0}}})
    assert host.door.listen.startswith("127.0.0.1:")
    with pytest.raises(ValidationError, match="HOST:PORT"):
        DoorConfig.model_validate({"listen": "127.0.0.1:0"})
