"""What the status page says while things happen (issue 44, item 6), from status documents as ``status --json``
gives them: a failed container kept for its logs is listed apart, not a red lane; a lane kept serving on a slot
whose replacement is blocked says so, not "leaving"; the loop's own enter in flight is not "an apply stopped
meanwhile"; the Blocked table's "what to do" is the fix; a failed audit row shows its error; the header says
``gpu n/a`` under ``gpu_telemetry: none``.
"""

from __future__ import annotations

import copy
from typing import Any

from reconciler.api.page import sections, view
from reconciler.api.page.snapshot import PageData, live_html
from reconciler.plan.causes import advice_for
from reconciler.service.status import with_verdict

A, B = "dark-compute-a", "dark-compute-b"


def container(name: str, recipe: str, slots: list[str], **kw: Any) -> dict[str, Any]:
    base = {"name": name, "id": name[-6:], "state": "running", "recipe": recipe, "slots": slots, "owner": "ours"}
    return {**base, "healthy": True, "preserved": False, "exit_code": None, **kw}


def doc(containers: list[dict[str, Any]], *, desired: dict[str, str], **plan: Any) -> dict[str, Any]:
    slots = {
        s: {"desired": desired.get(s), "containers": [c for c in containers if s in c["slots"]], "processes": []}
        for s in (A, B)
    }
    p = {"changes": False, "blocked": False, "actions": [], "blockers": [], "held": [], "fallbacks": []}
    p.update(plan)
    st = {"host": "demo", "converged": True, "sources": {"docker": "ok", "proc": "ok", "gpu": "ok"}, "slots": slots}
    st.update(containers=containers, plan=p, shm={"dir": "/dev/shm", "tmpfs": {}, "files": {}}, loop=None)
    return with_verdict(st)


def html(st: dict[str, Any], **kw: Any) -> str:
    return live_html(PageData(status=st, files=[], audit=kw.pop("audit", []), health=None, recipes={}, progress={}))


def test_a_failed_container_kept_for_its_logs_is_listed_apart_not_a_failed_lane() -> None:
    failed = container("reconciler-wide-a-b", "wide", [A, B], state="exited", preserved=True, exit_code=1)
    omni = container("reconciler-omni-b", "omni", [B])
    st = doc([omni, failed], desired={B: "omni"})
    page = html(st)
    assert 'data-lane="wide"' not in page and "phase-failed" not in page, page
    assert 'data-kept="reconciler-wide-a-b"' in page and "reconciler prune" in page
    # A wanted lane whose enter is planned again is pending, its kept failure apart; with nothing about to try it
    # again it is failed, and its card shows the container that failed.
    st = doc([failed], desired={A: "wide", B: "wide"}, actions=[{"kind": "enter", "recipe": "wide", "gpus": [A, B]}])
    assert 'data-lane="wide" data-phase="pending"' in html(st)
    st = doc([failed], desired={A: "wide", B: "wide"})
    assert 'data-lane="wide" data-phase="failed"' in html(st) and "reconciler-wide-a-b" in html(st)


def test_a_lane_kept_serving_on_a_blocked_slot_says_so() -> None:
    omni = container("reconciler-omni-b", "omni", [B])
    blocker = {"recipe": "wide", "gpus": [A, B], "reason": "x holds it", "holder": "x", "cause": "held"}
    st = doc([omni], desired={A: "wide", B: "wide"}, blockers=[blocker], blocked=True, kept_serving=[omni["name"]])
    page = html(st)
    assert 'data-lane="omni" data-phase="kept"' in page and view.KEPT_SERVING in page, page
    assert "leaving" not in page
    # Not kept (nothing blocked): leaving, as before.
    st = doc([omni], desired={A: "wide", B: "wide"}, actions=[{"kind": "leave", "recipe": "omni", "gpus": [B]}])
    assert 'data-lane="omni" data-phase="leaving"' in html(st)


def test_the_loops_own_enter_in_flight_is_not_an_apply_that_stopped() -> None:
    waiting = container("reconciler-omni-b", "omni", [B], healthy=False)
    enter = {
        "kind": "enter",
        "recipe": "omni",
        "gpus": [B],
        "reason": "finish reconciler-omni-b: it was left waiting for its health check (an apply stopped meanwhile)",
    }
    st = doc([waiting], desired={B: "omni"}, actions=[copy.deepcopy(enter)], changes=True)
    assert "apply stopped meanwhile" in html(st)  # no loop acting: it may well be one an apply left
    st["loop"] = {"pass": {"actions": [f"enter omni@{B}"]}}
    st = with_verdict(st)
    page = html(st)
    assert "apply stopped meanwhile" not in page and "the running loop&#x27;s own enter" in page, page
    assert 'data-lane="omni" data-phase="entering"' in page and st["verdict"]["word"] == "converging"


def test_a_lane_card_says_what_the_running_loop_is_doing_to_it_now() -> None:
    """A switch between standby topologies: the split's lanes being woken read waking (not asleep), the TP=2 lane
    being put to sleep going to sleep (not serving); an enter in flight entering, a leave leaving. Once the pass has
    done an action the plan made now no longer holds it: the card says what it observes again."""
    chat_a = container("reconciler-chat-a-a", "chat-a", [A], sleeping=True)
    chat_b = container("reconciler-chat-b-b", "chat-b", [B], sleeping=True)
    tp2 = container("reconciler-tp2-a-b", "tp2", [A, B], sleeping=False)
    acts = [
        {"kind": "sleep", "recipe": "tp2", "gpus": [A, B], "reason": "its topology is on standby"},
        {"kind": "wake", "recipe": "chat-a", "gpus": [A], "reason": "its topology runs now"},
        {"kind": "wake", "recipe": "chat-b", "gpus": [B], "reason": "its topology runs now"},
    ]
    st = doc([chat_a, chat_b, tp2], desired={A: "chat-a", B: "chat-b"}, actions=copy.deepcopy(acts), changes=True)
    st["standby"] = [{"recipe": "tp2", "gpus": [A, B]}]
    # Planned, no pass taking it yet: what is observed.
    page = html(st)
    assert 'data-lane="chat-a" data-phase="asleep"' in page and 'data-lane="tp2" data-phase="serving"' in page, page
    st["loop"] = {"pass": {"actions": [f"sleep tp2@{A}+{B}", f"wake chat-a@{A}", f"wake chat-b@{B}"]}}
    st = with_verdict(st)
    page = html(st)
    assert 'data-lane="chat-a" data-phase="waking"' in page and 'data-lane="chat-b" data-phase="waking"' in page
    assert 'data-lane="tp2" data-phase="going-to-sleep"' in page and ">going to sleep<" in page, page
    assert st["verdict"]["word"] == "converging"
    # The pass woke chat-a already: the plan made now holds no wake for it, the pass is still running.
    st["plan"]["actions"] = [a for a in st["plan"]["actions"] if a["recipe"] != "chat-a"]
    st["containers"][0]["sleeping"] = False
    assert 'data-lane="chat-a" data-phase="serving"' in html(st)
    # An enter and a leave in flight.
    omni = container("reconciler-omni-b", "omni", [B])
    leave = {"kind": "leave", "recipe": "omni", "gpus": [B], "reason": "no longer wanted"}
    enter = {"kind": "enter", "recipe": "wide", "gpus": [A, B], "reason": "wanted by the manifest"}
    st = doc([omni], desired={A: "wide", B: "wide"}, actions=[leave, enter], changes=True)
    st["loop"] = {"pass": {"actions": [f"leave omni@{B}", f"enter wide@{A}+{B}"]}}
    page = html(with_verdict(st))
    assert 'data-lane="omni" data-phase="leaving"' in page and 'data-lane="wide" data-phase="entering"' in page
    # This page's own apply in flight says the same words.
    st = doc([chat_a], desired={A: "chat-a"}, actions=[copy.deepcopy(acts[1])], changes=True)
    progress = {f"chat-a@{A}": {"kind": "wake", "phase": "waking", "detail": "waking"}}
    page = live_html(PageData(status=st, files=[], audit=[], health=None, recipes={}, progress=progress))
    assert 'data-lane="chat-a" data-phase="waking"' in page, page


def test_the_blocked_tables_what_to_do_is_the_fix_and_a_failed_audit_row_its_error() -> None:
    blocker = {"recipe": "wide", "gpus": [A, B], "reason": "container x holds dark-compute-a", "holder": "x"}
    part = sections.plan_section({"blockers": [{**blocker, "cause": "held"}]})
    assert advice_for("held") in part and "free the slot or change the manifest" in part
    assert part.count("container x holds dark-compute-a") == 1, part
    record = {
        "time": 1.0,
        "front": "loop",
        "who": "",
        "action": "enter",
        "target": "omni@b",
        "outcome": "failed",
        "reason": "wanted by the manifest",
        "detail": "health check timed out after 60 s",
    }
    row = sections.audit_section([record])
    assert "health check timed out after 60 s" in row and "wanted by the manifest" not in row, row


def test_the_header_says_gpu_na_without_gpu_telemetry_and_bytes_read_in_binary_units() -> None:
    st = doc([], desired={})
    st["gpu_telemetry"] = "none"
    head = view.header(st, None, version="0")
    assert "gpu n/a" in head and "gpu: ok" not in head
    st["gpu_telemetry"] = "nvml"
    assert "gpu: ok" in view.header(st, None, version="0")
    from reconciler.api.page.markup import size

    assert (size(3 << 20), size(5 << 30)) == ("3.0 MiB", "5.0 GiB")
