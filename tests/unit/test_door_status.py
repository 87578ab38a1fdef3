"""The front door in ``status`` and on the page (docs/design.md, the front door): what the door publishes per model
is shown as it is, a held request in yellow with how long it has waited, and nothing at all without a live door."""

from __future__ import annotations

from typing import Any

from reconciler.api.page.sections import door_section
from reconciler.cli.render import Style, _door_lines

DOOR: dict[str, Any] = {
    "pid": 4242,
    "at": 1_700_000_000.0,
    "models": {
        "coder": {"recipe": "big", "state": "waking", "queue": 3, "held_s": 4.25, "last_request": 1_700_000_000.0},
        "<chat>": {"recipe": "small", "state": "serving", "queue": 0, "held_s": 0.0, "last_request": None},
    },
}


def test_status_lines_name_each_model_its_state_and_what_is_held() -> None:
    lines = _door_lines({"door": DOOR}, Style(color=False))
    assert lines[1] == "front door  pid 4242"
    coder = next(ln for ln in lines if ln.startswith("  coder"))
    assert "coder -> big: waking" in coder and "3 held (oldest 4.2 s)" in coder
    chat = next(ln for ln in lines if ln.startswith("  <chat>"))
    assert chat.endswith("last request never") and "held" not in chat
    assert _door_lines({"door": None}, Style(color=False)) == []


def test_the_page_section_escapes_names_and_is_absent_without_a_door() -> None:
    html = str(door_section(DOOR))
    assert 'id="door"' in html and "&lt;chat&gt;" in html and "<chat>" not in html
    assert "3 (oldest 4.2 s)" in html and 'class="door-waking"' in html and "never" in html
    assert str(door_section(None)) == ""
