"""One request contract (reconciler/base/requests.py): the service's checks, the HTTP API's models, the MCP tools'
arguments, the status page's forms and the command line's choices accept and refuse the very same requests, since
each is built from it. Before, the copies had drifted: the API refused a plan id with a trailing newline that the
service took."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from reconciler.api.errors import _BadRequest
from reconciler.api.page.sections import actions_section
from reconciler.api.request_models import ApplyBody, ProbeQuery, ReclaimBody, SwitchBody, probe_params
from reconciler.base.requests import MAX_RECLAIM_PATHS, PROBE_SUITES, is_plan_id, is_recipe, is_topology
from reconciler.cli import build_parser
from reconciler.mcp_server import ManageArgs, ProbeArgs

PLAN_IDS = ["0123456789abcdef" * 2, "0" * 32, "A" * 32, "a" * 31, "a" * 33, "a" * 32 + "\n", " " + "a" * 32, ""]
TOPOLOGIES = ["split", "exclusive-tp2", "v1.2_b", "Split", "-x", ".x", "a" * 63, "a" * 64, "split\n", ""]
RECIPES = ["omni", "deepseek-v4.0_a", "Omni", "-x", "a" * 128, "a" * 129, "omni\n", "om ni", ""]


def _accepts(model: type, **kw: object) -> bool:
    try:
        model.model_validate(kw)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("plan_id", PLAN_IDS)
def test_a_plan_id_is_one_thing_everywhere(plan_id: str) -> None:
    want = is_plan_id(plan_id)
    assert _accepts(ApplyBody, plan_id=plan_id) is want
    assert _accepts(ManageArgs, action="apply", plan_id=plan_id) is want
    assert want is (plan_id in PLAN_IDS[:2]), plan_id


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_a_topology_is_one_thing_everywhere(name: str) -> None:
    want = is_topology(name)
    assert _accepts(SwitchBody, topology=name) is want
    assert _accepts(ManageArgs, action="switch", topology=name) is want
    assert want is (name in TOPOLOGIES[:3] or name == "a" * 63), name


@pytest.mark.parametrize("name", RECIPES)
def test_a_probes_recipe_is_one_thing_everywhere(name: str) -> None:
    want = is_recipe(name)
    assert _accepts(ProbeQuery, recipe=name) is want
    assert _accepts(ProbeArgs, recipe=name) is want
    try:
        probe_params(name, None)
        api = True
    except _BadRequest:
        api = False
    assert api is want
    assert want is (name in ("omni", "deepseek-v4.0_a", "a" * 128)), name


def _suite_choices() -> tuple[str, ...]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    probe = sub.choices["probe"]
    (suite,) = [a for a in probe._actions if "--suite" in a.option_strings]
    return tuple(suite.choices or ())


def test_the_probe_suites_are_one_list_everywhere() -> None:
    assert PROBE_SUITES == ("preflight", "regression", "all")
    assert _suite_choices() == PROBE_SUITES
    for suite in (*PROBE_SUITES, "smoke", "ALL", ""):
        ok = suite in PROBE_SUITES
        assert _accepts(ProbeQuery, recipe="omni", suite=suite) is ok
        assert _accepts(ProbeArgs, recipe="omni", suite=suite) is ok
    page = str(actions_section("csrf", topologies=(), topology=None, recipes=("omni",)))
    assert [s for s in PROBE_SUITES if f'value="{s}"' in page] == list(PROBE_SUITES)


def test_a_reclaims_paths_are_bounded_alike() -> None:
    fits, over = ["/dev/shm/x"] * MAX_RECLAIM_PATHS, ["/dev/shm/x"] * (MAX_RECLAIM_PATHS + 1)
    assert _accepts(ReclaimBody, paths=fits) and not _accepts(ReclaimBody, paths=over)
    assert _accepts(ManageArgs, action="reclaim-shared-memory", paths=fits)
    assert not _accepts(ManageArgs, action="reclaim-shared-memory", paths=over)
