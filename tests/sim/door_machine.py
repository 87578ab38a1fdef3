"""The simulated host with its front door in every run, and only the steps that move what the door sees or does
(``SOAK_MACHINE=door`` in ``make soak``; tests/sim/test_sim.py runs a budget of it): the machine's own steps,
``HostMachine``'s others left out, so that within a run's steps the door's clients, its looks, its demand switches
and idle returns, and the loop's drains that wait for it meet often. Every invariant of ``HostMachine`` is checked
after each step as there, (l) and (m) among them (tests/sim/door.py)."""

from __future__ import annotations

import inspect

from sim.machine import HostMachine

# The machine's steps that bear on the door (``door_manifest`` writes its named manifests, with aliases and demand):
# lanes that come, go, sleep, wake, die or are replaced (a recipe edited), switches (the operator's, two at once),
# blockers (a foreign container on a card), time and the wall clock, requests straight to the lanes, a pass
# interrupted, the loop restarted, faults cleared.
KEPT = frozenset(
    {
        "actions_interleave",
        "apply_interrupted",
        "cli_apply",
        "clients_send_requests",
        "container_dies",
        "edit_recipe",
        "faults_stop_and_host_settles",
        "foreign_container",
        "loop_pass",
        "loop_restarts",
        "operator_removes_foreign",
        "operator_switches",
        "port_squatter",
        "recipe_behaves",
        "sleep_fault",
        "sleeping_lane_restarts",
        "switches_race",
        "time_passes",
        "wall_clock_jumps",
    }
)


class DoorHostMachine(HostMachine):
    """``HostMachine`` with fewer steps; run it with ``sim.door_steps.DOOR_SHARE`` at -1 (``SIM_DOOR_SHARE=-1``): every
    run then opens the door at its start."""


for _name, _f in inspect.getmembers(HostMachine):
    if hasattr(_f, "hypothesis_stateful_rule") and not _name.startswith("door_") and _name not in KEPT:
        setattr(DoorHostMachine, _name, None)  # not a rule of this machine
