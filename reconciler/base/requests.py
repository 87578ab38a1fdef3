"""The one request contract every front-end derives its checks from: what a plan id, a recipe, a probe suite, a
topology and a reclaim's paths may be. The service checks its calls with these; the HTTP API's models
(``reconciler.api.request_models``), the MCP tools' schemas (``reconciler.mcp_server``), the status page's forms and
the command line's choices are built from them, so the front-ends cannot drift apart (tests/contract/test_request_contract.py
holds them together).

In the base, as plain values (no pydantic, no service package): the command line reads the suites when it builds its
parser, within the start-up budget of every command.
"""

from __future__ import annotations

import re
from typing import Literal

# A saved plan's id (GET /v1/plan?save=true, host_plan, plan --json with save): 32 lowercase hex digits, matched whole
# (``fullmatch``: a trailing newline is no part of an id). PLAN_ID_PATTERN is its JSON Schema form.
PLAN_ID = re.compile(r"[0-9a-f]{32}")
PLAN_ID_PATTERN = r"^[0-9a-f]{32}$"

# A recipe's name as the loader accepts it (its file stem under configs/recipes/).
RECIPE_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
RECIPE = re.compile(RECIPE_PATTERN[1:-1])
RECIPE_HELP = "the recipe's name (its file stem under configs/recipes/)"

# The probe suites a caller may ask for: a recipe's own two, and both.
ProbeSuite = Literal["preflight", "regression", "all"]
PROBE_SUITES: tuple[ProbeSuite, ...] = ("preflight", "regression", "all")
DEFAULT_SUITE: ProbeSuite = "preflight"

# A topology a switch may name (a name under the manifest's topologies:).
TOPOLOGY_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
TOPOLOGY = re.compile(TOPOLOGY_PATTERN[1:-1])

# An alias a promotion may name (a name under the manifest's aliases:; the model's SERVED_NAME_PATTERN).
ALIAS_PATTERN = r"^[^\s\x00-\x1f\x7f]{1,256}$"

# The most paths one reclaim may name (each from a dry run's would_reclaim).
MAX_RECLAIM_PATHS = 4096


def is_plan_id(text: str) -> bool:
    return PLAN_ID.fullmatch(text) is not None


def is_recipe(text: str) -> bool:
    return RECIPE.fullmatch(text) is not None


def is_topology(text: str) -> bool:
    return TOPOLOGY.fullmatch(text) is not None
