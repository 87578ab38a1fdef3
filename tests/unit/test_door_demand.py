"""The front door's demand policy as a pure function of the door's look and the clock (docs/design.md, the front
door; the real switches are tests/real/test_door.py): the topology a held request asks for, min_dwell_s between two
switches, never to a topology seen blocked (its held requests refused, naming the blocker), and the idle return."""

from __future__ import annotations

from reconciler.door.demand import DemandPolicy
from reconciler.model import DemandSpec
from reconciler.service.door_view import DoorView, LaneState

SPEC = DemandSpec(topologies=["day", "night"], default="day", idle_return_s=60, min_dwell_s=10)


def view(running: str, *, blocked: str = "") -> DoorView:
    lanes = {
        "small": LaneState("small", "serving" if running == "day" else "asleep", None, ("small",), ("day",)),
        "big": LaneState("big", "serving" if running == "night" else "asleep", None, ("big",), ("night",)),
        "other": LaneState("other", "not-in-topology", None, ("other",), ("elsewhere",)),
    }
    return DoorView("h", running, lanes, {"small": "small", "big": "big", "other": "other"}, {}, blocked=blocked)


def test_a_held_request_asks_for_the_listed_topology_once_the_running_one_has_dwelt() -> None:
    p = DemandPolicy(SPEC)
    p.observe(view("day"), 100.0)
    assert p.target(view("day"), "big") == "night" and p.target(view("day"), "small") is None
    assert p.target(view("day"), "other") is None  # no listed topology has it
    assert p.wanted(view("day"), ["big"], 105.0) == (None, {})  # 5 s of the 10 s dwell
    assert p.wanted(view("day"), ["big"], 110.0) == ("night", {})
    p.switched("night", 110.0)
    p.observe(view("night"), 110.2)
    assert p.wanted(view("night"), ["small"], 119.0) == (None, {})  # alternating: not before min_dwell_s again
    assert p.wanted(view("night"), ["small"], 120.0) == ("day", {})


def test_a_topology_seen_blocked_is_never_switched_to_and_its_requests_are_refused_naming_the_blocker() -> None:
    p = DemandPolicy(SPEC)
    p.observe(view("night", blocked="slot dark-compute-a: held by pid 77 (not ours)"), 0.0)
    p.observe(view("day"), 1.0)
    to, refuse = p.wanted(view("day"), ["big"], 500.0)
    assert to is None and refuse == {
        "big": "topology 'night' is blocked: slot dark-compute-a: held by pid 77 (not ours)"
    }
    p.observe(view("night"), 501.0)  # the operator switched there and the loop's pass was not blocked
    assert "night" not in p.blocked


def test_a_pass_speaks_for_the_topology_it_was_made_under_not_the_one_the_manifest_names_at_the_look() -> None:
    """The loop records each pass's topology: a look just after a switch to night, reading the last pass (of day,
    unblocked), clears nothing of night, which a pass of night had found blocked; a blocked pass of day marks day."""
    import dataclasses

    p = DemandPolicy(SPEC)
    p.observe(view("night", blocked="held by pid 77"), 0.0)
    assert "night" in p.blocked
    p.observe(dataclasses.replace(view("night"), pass_topology="day", pass_known=True), 1.0)
    assert p.blocked == {"night": "held by pid 77"}  # the unblocked pass was day's
    p.observe(dataclasses.replace(view("night", blocked="held by pid 78"), pass_topology="day", pass_known=True), 2.0)
    assert p.blocked == {"night": "held by pid 77", "day": "held by pid 78"}
    p.observe(dataclasses.replace(view("day"), pass_topology="night", pass_known=True), 3.0)
    assert p.blocked == {"day": "held by pid 78"}  # a pass of night unblocked, seen while the manifest says day


def test_the_idle_return_waits_for_no_request_nothing_in_flight_and_nothing_held() -> None:
    p = DemandPolicy(SPEC)
    night = view("night")
    p.observe(night, 0.0)
    assert p.idle_return(night, in_flight={}, held=False, last_request={}, now=59.0) is None
    assert p.idle_return(night, in_flight={"big": 1}, held=False, last_request={}, now=61.0) is None
    assert p.idle_return(night, in_flight={}, held=True, last_request={}, now=61.0) is None
    assert p.idle_return(night, in_flight={}, held=False, last_request={"big": 30.0}, now=61.0) is None
    assert p.idle_return(night, in_flight={}, held=False, last_request={"small": 60.0}, now=61.0) == "day"
    assert p.idle_return(night, in_flight={}, held=False, last_request={"big": 30.0}, now=91.0) == "day"
    # Never away from a topology the operator chose outside demand.topologies, nor from the default.
    p.observe(view("elsewhere"), 100.0)
    assert p.idle_return(view("elsewhere"), in_flight={}, held=False, last_request={}, now=1000.0) is None
    assert p.target(view("elsewhere"), "big") is None


def test_the_idle_return_too_waits_for_min_dwell_s() -> None:
    """A return to the default is a switch like any: with idle_return_s under min_dwell_s it waits for the dwell
    (the simulation found the door returning 40 s after a switch, within min_dwell_s 120 s)."""
    p = DemandPolicy(DemandSpec(topologies=["day", "night"], default="day", idle_return_s=20, min_dwell_s=120))
    night = view("night")
    p.observe(night, 0.0)
    assert p.idle_return(night, in_flight={}, held=False, last_request={}, now=40.0) is None
    assert p.idle_return(night, in_flight={}, held=False, last_request={}, now=120.0) == "day"
