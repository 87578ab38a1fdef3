"""The door's look at a lane that serves (docs/design.md, the front door): a health check that alone misses, while the
lane's topology still runs, keeps it serving for up to ``SLOW_LOOKS`` looks (a lane busy with many streams answers
its health URL late, and holding every new request for it would cost each a look or more); a lane that refuses the
door's connection is entering at once; a lane whose topology no longer runs is never kept serving."""

from __future__ import annotations

from reconciler.door.app import SLOW_LOOKS, Door
from reconciler.model import DoorConfig
from reconciler.service.door_view import DoorView, LaneState


def view(state: str) -> DoorView:
    lane = LaneState("chat", state, "http://127.0.0.1:9", ("chat",), ("day",), "" if state == "serving" else "why")
    return DoorView("h", "day", {"chat": lane}, {"chat": "chat"}, {})


def test_a_serving_lane_whose_health_check_misses_serves_for_slow_looks_then_enters() -> None:
    door = Door(DoorConfig())
    door.apply_view(view("serving"))
    seen = []
    for _ in range(SLOW_LOOKS + 1):
        door.apply_view(view("entering"))
        seen.append(door.view.lanes["chat"].state if door.view else None)
    assert seen == ["serving"] * (SLOW_LOOKS - 1) + ["entering", "entering"]
    door.apply_view(view("serving"))
    door.apply_view(view("entering"))
    assert door.view is not None and door.view.lanes["chat"].state == "serving"  # the count starts again


def test_a_lane_never_seen_serving_is_not_taken_as_serving() -> None:
    door = Door(DoorConfig())
    door.apply_view(view("entering"))
    door.apply_view(view("entering"))
    assert door.view is not None and door.view.lanes["chat"].state == "entering"


def test_a_lane_about_to_leave_or_asleep_is_never_kept_serving() -> None:
    for state in ("leaving", "waking", "asleep", "blocked", "not-in-topology"):
        door = Door(DoorConfig())
        door.apply_view(view("serving"))
        door.apply_view(view(state))
        assert door.view is not None and door.view.lanes["chat"].state == state


def test_a_lane_that_refused_the_connection_enters_at_once_until_a_look_finds_it_healthy() -> None:
    door = Door(DoorConfig())
    door.apply_view(view("serving"))
    door._lane_gone("chat")
    assert door.view is not None and door.view.lanes["chat"].state == "entering"
    door.apply_view(view("entering"))  # no slow look is granted to a lane that refused the door
    assert door.view.lanes["chat"].state == "entering"
    door.apply_view(view("serving"))
    assert door.view.lanes["chat"].state == "serving"
