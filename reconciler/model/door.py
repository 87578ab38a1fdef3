"""The front door's part of the operator's files: host.yaml's ``door:`` (where ``reconciler door`` listens and how
long it holds a request), the manifest's ``aliases:`` (a name clients ask for -> a recipe) and ``demand:`` (the
topologies the door may switch between for the models asked for), and the names a recipe's server answers to.

Pure. Read by ``reconciler.load`` (the cross-checks of names and aliases), the service's view of the host for the
door (``reconciler.service.door_view``) and the door itself (``reconciler.door``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from reconciler.model.rules import NAME_PATTERN
from reconciler.model.strict import DAY_S, _pattern, _Strict

if TYPE_CHECKING:
    from reconciler.model.recipe import Recipe

DOOR_DEFAULT_LISTEN = "127.0.0.1:9466"


class DoorConfig(_Strict):
    """host.yaml's ``door:``: the front door (``reconciler door``), one OpenAI endpoint for every lane of the host."""

    listen: str = Field(
        default=DOOR_DEFAULT_LISTEN,
        description="HOST:PORT the door listens on. Loopback by default; off loopback it needs its token "
        "(door-token in the state directory, or --token-file).",
        json_schema_extra=_pattern(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):[0-9]{1,5}$"),
    )
    hold_s: float = Field(
        default=120,
        gt=0,
        le=DAY_S,
        description="Seconds a request for a model whose lane is entering, waking, asleep or about to leave may be "
        "held before it is answered 503 (with Retry-After).",
    )
    max_queue: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Requests held at once for one model; one client may hold at most a quarter of them (at least 1).",
    )
    max_body_mib: float = Field(
        default=16,
        gt=0,
        le=1024,
        description="The largest request body the door takes, in MiB (413 beyond it).",
    )

    @field_validator("listen")
    @classmethod
    def _port(cls, v: str) -> str:
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"door.listen {v!r} is not HOST:PORT with a port from 1 to 65535")
        return v


class AliasSpec(_Strict):
    """An alias in its long form: the recipe it names, and the gates its evidence must pass for ``reconciler promote``
    to move the alias to another recipe (``reconciler.plan.gates``)."""

    recipe: str = Field(
        description="A recipe's name: configs/recipes/NAME.toml.", json_schema_extra=_pattern(NAME_PATTERN)
    )
    gates: dict[str, Any] = Field(
        default_factory=dict,
        description="The promotion's gates, by name: preflight: pass, ladder_tokens, min_decode_tok_s, "
        "min_prefill_tok_s, max_ttft_s: {TOKENS: SECONDS}, reserve_free_gib, reload: proven, min_spec_acceptance, "
        "repeat. `reconciler promote` moves the alias to a recipe only when its kept evidence passes every one.",
        json_schema_extra={"propertyNames": {"pattern": NAME_PATTERN}},
    )

    @field_validator("gates")
    @classmethod
    def _plain(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name, value in v.items():
            if not _plain_value(value, depth=0):
                raise ValueError(
                    f"gates.{name}: a gate is plain data (strings, numbers, booleans, lists and maps, at most 8 deep)"
                )
        return v


def _plain_value(v: Any, *, depth: int) -> bool:
    if depth > 8:
        return False
    if v is None or isinstance(v, (str, bool, int, float)):
        return True
    if isinstance(v, list):
        return all(_plain_value(x, depth=depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain_value(x, depth=depth + 1) for k, x in v.items())
    return False


class DemandSpec(_Strict):
    """The manifest's ``demand:``: the door may switch the host among these topologies for the models asked for."""

    topologies: list[str] = Field(
        min_length=2,
        description="The topologies the door may switch between (names under topologies:); a request for a model "
        "served only by another of them switches the host to it.",
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": NAME_PATTERN}},
    )
    default: str = Field(
        description="The topology the host returns to after idle_return_s with nothing asked of another one.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    idle_return_s: float = Field(
        default=900,
        gt=0,
        le=DAY_S,
        description="Seconds with nothing in flight and no request for the running topology's models before the "
        "host returns to default.",
    )
    min_dwell_s: float = Field(
        default=120,
        ge=0,
        le=DAY_S,
        description="Seconds a topology serves at least before the door switches away from it for another model.",
    )

    @model_validator(mode="after")
    def _default_listed(self) -> DemandSpec:
        if len(set(self.topologies)) != len(self.topologies):
            raise ValueError("demand.topologies names a topology twice: name each once")
        if self.default not in self.topologies:
            raise ValueError(f"demand.default {self.default!r} is not one of demand.topologies {self.topologies}")
        return self


def argv_words(argv: Sequence[str]) -> list[str]:
    """The words of a program and its arguments; an argument holding spaces (``sh -c "vllm serve ..."``) split as a
    shell would, where it can be."""
    words: list[str] = []
    for arg in argv:
        if any(c.isspace() for c in arg):
            try:
                words.extend(shlex.split(arg))
                continue
            except ValueError:
                pass
        words.append(arg)
    return words


def command_served_names(recipe: Recipe) -> tuple[str, ...]:
    """The names its command gives vLLM's ``--served-model-name`` (every name of the last one given), else none."""
    words = argv_words([*(recipe.container.entrypoint or ()), *recipe.container.command])
    names: list[str] = []
    for i, w in enumerate(words):
        if w == "--served-model-name":
            names = []
            for v in words[i + 1 :]:
                if v.startswith("-"):
                    break
                names.append(v)
        elif w.startswith("--served-model-name="):
            names = [w.split("=", 1)[1]]
    return tuple(names)


def served_names(recipe: Recipe) -> tuple[str, ...]:
    """The names the server answers to: its command's --served-model-name (every name given), else the recipe's
    ``[model] served_names``, else the model's id."""
    return command_served_names(recipe) or tuple(recipe.model.served_names or ()) or (recipe.model.id,)
