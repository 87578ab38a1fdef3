"""manifests/NAME.yaml as pydantic types: the desired state of one host, as the operator edits it.

Read by ``reconciler.load.desired``, which checks it against the host file and the recipes.
"""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from reconciler.model.door import AliasSpec, DemandSpec
from reconciler.model.rules import NAME_PATTERN, SERVED_NAME_PATTERN
from reconciler.model.strict import _pattern, _Strict


class AssignmentSpec(_Strict):
    """One container that should run: a recipe on GPU slots."""

    recipe: str = Field(
        min_length=1,
        description="A recipe's name: configs/recipes/NAME.toml.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    gpus: list[str] = Field(
        min_length=1,
        description="The GPU slots it runs on (names from configs/host.yaml), as many as the recipe's "
        "tensor_parallel_size; a slot runs one recipe at a time.",
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": NAME_PATTERN}},
    )


class Manifest(_Strict):
    """manifests/NAME.yaml: the desired state of one host, what the operator edits."""

    host: str = Field(
        description="The host this manifest is for: the name in configs/host.yaml.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    assignments: list[AssignmentSpec] = Field(
        default_factory=list,
        description="One entry per container; a GPU slot not listed is free (none: all free). Or name topologies "
        "(topologies: and topology:) instead.",
    )
    topologies: dict[str, list[AssignmentSpec]] | None = Field(
        default=None,
        description="Named topologies, each a list of assignments as under assignments: (the split, the exclusive "
        "lane, ...). Every one is validated; only the one named by topology: runs. Not together with assignments:.",
        json_schema_extra={"propertyNames": {"pattern": NAME_PATTERN}, "minProperties": 1},
    )
    topology: str | None = Field(
        default=None,
        description="The topology that runs now, a name under topologies:. `reconciler switch NAME` rewrites this "
        "value alone; editing it by hand is the same desired state.",
        json_schema_extra=_pattern(NAME_PATTERN),
    )
    standby: list[str] = Field(
        default_factory=list,
        description="Topologies whose lanes are kept asleep (vLLM's sleep mode, the recipe's [sleep]) while another "
        "one runs: entered once, put to sleep, woken in seconds when `reconciler switch` makes theirs the one that "
        "runs. Names under topologies:.",
        json_schema_extra={"uniqueItems": True, "items": {"type": "string", "pattern": NAME_PATTERN}},
    )
    fallback: bool = Field(
        default=True,
        description="While a wanted lane's enter failed and waits in backoff, bring back the last converged "
        "topology on the slots it needed (false: leave them empty until the next attempt).",
    )
    aliases: dict[str, str | AliasSpec] = Field(
        default_factory=dict,
        description="Names clients may ask the front door for, each routed to a recipe's lane: NAME: RECIPE, or "
        "NAME: {recipe: RECIPE, gates: {...}}. An alias may not be a name some recipe's server answers to.",
        json_schema_extra={"propertyNames": {"pattern": SERVED_NAME_PATTERN}},
    )
    demand: DemandSpec | None = Field(
        default=None,
        description="Let the front door switch the host among these topologies for the models asked for, and "
        "return to default when idle. Needs topologies:; refused on a host whose desired state comes from git.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> Manifest:
        """Either assignments: or named topologies with the active one's name; never both, never half."""
        bad_alias = [n for n in self.aliases if not re.fullmatch(SERVED_NAME_PATTERN, n)]
        if bad_alias:
            raise ValueError(f"aliases: {bad_alias[0]!r} is empty, too long, or holds a space or control character")
        if self.topologies is None:
            if self.demand is not None:
                raise ValueError("demand: names topologies, but there is no topologies: map to name them in")
            if self.topology is not None:
                raise ValueError("topology: names a topology, but there is no topologies: map to name it in")
            if self.standby:
                raise ValueError("standby: names topologies, but there is no topologies: map to name them in")
            return self
        unknown = [n for n in self.standby if n not in self.topologies]
        if unknown:
            raise ValueError(f"standby: {unknown[0]!r} is not under topologies: (known: {sorted(self.topologies)})")
        if len(set(self.standby)) != len(self.standby):
            raise ValueError("standby: names a topology twice: name each once")
        bad = [n for n in self.topologies if not re.fullmatch(NAME_PATTERN, n)]
        if bad:
            raise ValueError(f"topologies: {bad[0]!r} is not a name (lower-case letters, digits, '-', '_' and '.')")
        if self.assignments:
            raise ValueError(
                "assignments: and topologies: together: keep one (assignments: is a single unnamed topology)"
            )
        if self.topology is None:
            raise ValueError(
                f"topologies: needs topology: NAME, the one that runs now (one of {sorted(self.topologies)})"
            )
        if self.topology not in self.topologies:
            raise ValueError(f"topology: {self.topology!r} is not under topologies: (known: {sorted(self.topologies)})")
        unknown = [n for n in (self.demand.topologies if self.demand else []) if n not in self.topologies]
        if unknown:
            raise ValueError(
                f"demand.topologies: {unknown[0]!r} is not under topologies: (known: {sorted(self.topologies)})"
            )
        return self

    def alias_targets(self) -> dict[str, AliasSpec]:
        """Every alias in its long form."""
        return {n: AliasSpec(recipe=t) if isinstance(t, str) else t for n, t in self.aliases.items()}

    def named(self) -> dict[str | None, list[AssignmentSpec]]:
        """Every topology by name (``None``: the one unnamed topology of assignments:)."""
        if self.topologies is None:
            return {None: self.assignments}
        return {name: items for name, items in self.topologies.items()}
