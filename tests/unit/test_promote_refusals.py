"""The promotion's refusals that need no root on disk: a host whose desired state comes from git is refused naming
the commit that would do it, before anything is read or written (beside tests/real/test_promote.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.model import DesiredState, HostConfig
from reconciler.model.door import AliasSpec
from reconciler.model.source import SourceConfig
from reconciler.service.promote import PromoteRefused, promote_alias

HOST = Path(__file__).resolve().parents[2] / "examples" / "gpu-proof" / "root" / "configs" / "host.yaml"


class Context:
    """Only what the promotion asks of its caller's context: the desired state and the audit of a refusal."""

    root = "/nonexistent"

    def __init__(self, desired: DesiredState):
        self._desired = desired
        self.refused: list[tuple[str, str]] = []

    def desired(self) -> DesiredState:
        return self._desired

    def record_refusal(self, action: str, reason: str, **_: Any) -> None:
        self.refused.append((action, reason))

    def record(self, *_: Any, **__: Any) -> None:
        raise AssertionError("a refused promotion records no success")


def test_a_git_sourced_host_is_refused_naming_the_commit_that_would_do_it() -> None:
    host = HostConfig.model_validate(yaml.safe_load(HOST.read_text()))
    host = host.model_copy(update={"source": SourceConfig(git="/srv/fleet.git", ref="prod")})
    desired = DesiredState(
        host=host, recipes={}, assignments=(), manifest_path="manifests/x.yaml", aliases={"chat": AliasSpec(recipe="a")}
    )
    ctx = Context(desired)
    with pytest.raises(PromoteRefused) as info:
        promote_alias(ctx, "chat", "b")  # type: ignore[arg-type]
    msg = str(info.value)
    assert "git source /srv/fleet.git (prod)" in msg and "a commit that sets aliases.chat's recipe to b" in msg, msg
    assert "nothing changed" in msg
    assert [a for a, _ in ctx.refused] == ["promote"]
