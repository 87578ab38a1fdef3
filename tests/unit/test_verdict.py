"""The one verdict (docs/design.md, "The verdict"): ``reconciler.plan.verdict.decide`` over a status, and every view
that says it reading it from there: the page's header, ``/healthz``'s answer, the command line's line, the fleet's
row and the metrics' gauges; and the page's snapshot made again after a pass that began and ended between two polls
(the cause of a page that showed a switch's old cards and its phantom plan for up to thirty seconds).
"""

from __future__ import annotations

from typing import Any

from reconciler.api.page import snapshot as page_snapshot
from reconciler.api.page import view
from reconciler.cli.render import _verdict_line
from reconciler.loop.health import health_answer, with_verdict
from reconciler.observe.fleet import HostRow
from reconciler.plan.verdict import WORDS, Verdict, acting, decide
from reconciler.service.status import with_verdict as status_with_verdict


class Plain:
    def __getattr__(self, name: str) -> Any:
        return lambda text: text


def status(**plan: Any) -> dict[str, Any]:
    base = {"changes": False, "blocked": False, "actions": [], "blockers": [], "held": [], "unavailable": []}
    return {"converged": True, "sources": {"docker": "ok", "proc": "ok", "gpu": "ok"}, "plan": {**base, **plan}}


ENTER = {"kind": "enter", "recipe": "omni", "gpus": ["b"], "reason": "wanted"}
BLOCKER = {"recipe": "wide", "gpus": ["a", "b"], "reason": "stop it", "holder": "x", "cause": "foreign"}
HELD = {"recipe": "omni", "gpus": ["b"], "reason": "in backoff"}


def test_each_word_and_the_order_they_win_in() -> None:
    assert decide(status()).word == "converged"
    assert decide(status(actions=[ENTER], changes=True)).word == "converging"
    assert decide(status(held=[HELD])) == Verdict("held", "omni on b held in backoff")
    assert decide(status(held=[HELD], actions=[ENTER])).word == "converging"
    assert decide(status(blockers=[BLOCKER], blocked=True, actions=[ENTER])).word == "blocked"
    assert decide(status(unavailable=["docker"], blockers=[BLOCKER])).word == "unavailable"
    down = {**status(), "sources": {"docker": "ok", "proc": "ok", "gpu": "unavailable: nvml"}}
    assert decide(down).word == "unavailable"
    bad = {**status(unavailable=["docker"]), "error": {"code": "config_invalid", "problems": []}}
    assert decide(bad).word == "invalid"
    assert list(WORDS) == ["invalid", "unavailable", "blocked", "converging", "held", "converged"]


def test_a_pass_of_the_loop_acting_is_converging_whatever_the_plan_made_meanwhile_says() -> None:
    """The last wake of a switch done, the pass not ended yet: the plan made now is empty, the verdict converging
    (so no view says converged before the pass that converges it has ended)."""
    st = {**status(), "loop": {"pass": {"actions": ["wake chat-a@a", "sleep tp2@a+b"]}, "passes": 3}}
    assert acting(st) == ["wake chat-a@a", "sleep tp2@a+b"]
    v = decide(st)
    assert v.word == "converging" and "wake chat-a@a" in v.reason
    assert status_with_verdict(st)["converged"] is False and st["verdict"]["word"] == "converging"
    assert "the running loop is acting (wake chat-a@a, sleep tp2@a+b)" in _verdict_line(st, Plain())  # type: ignore[arg-type]
    # Between passes (no pass published) and for a loop of an older release (no key at all): the plan decides.
    for loop in ({"pass": None}, {}, None):
        assert decide({**status(), "loop": loop}).word == "converged"


def test_every_view_reads_the_one_verdict_the_status_carries() -> None:
    for st in (status(), status(actions=[ENTER]), status(held=[HELD]), status(blockers=[BLOCKER], blocked=True)):
        st = status_with_verdict(st)
        word = st["verdict"]["word"]
        assert view.verdict(st).word == word
        assert f'data-verdict="{word}"' in view.header(st, None, version="0")
        row = HostRow(name="h", url="http://h", reachable=True, status=st, error="", seconds=0.0)
        assert row.verdict == word
        line = _verdict_line(st, Plain())  # type: ignore[arg-type]
        assert line.startswith("converged") if word == "converged" else line.startswith("not converged")
    # /healthz: its code the loop's, its verdict the status's.
    code, body = health_answer(
        age=1.0, resync_s=60, down_codes={}, last={"result": "converged", "at": 1.0}, files_valid=True, passes=4
    )
    assert code == 200 and body["verdict"] == "converged"
    body = with_verdict(body, Verdict("converging", "the running loop is acting: enter omni@b"))
    assert body["verdict"] == "converging" and body["passes"] == 4 and body["ok"] is True


def test_the_metrics_gauges_say_the_verdict() -> None:
    from reconciler.loop.metrics import Metrics

    m = Metrics()
    m.set_verdict(Verdict("converging", "x"))
    text = m.render().decode()
    assert 'reconciler_verdict{verdict="converging"} 1.0' in text and "reconciler_drift 1.0" in text
    assert 'reconciler_verdict{verdict="converged"} 0.0' in text
    m.set_verdict(Verdict("converged", "y"))
    assert "reconciler_drift 0.0" in m.render().decode()


class _Result:
    def __init__(self, st: dict[str, Any]):
        self.st = st
        self.observed = type("Observed", (), {"shm": None})()

    def to_json(self) -> dict[str, Any]:
        return self.st


class _Service:
    """The host as the page's snapshot asks it: a status that the test changes, counted."""

    def __init__(self) -> None:
        self.st = status_with_verdict(status())
        self.asked = 0

    def status(self) -> _Result:
        self.asked += 1
        return _Result(self.st)

    def audit(self, *, since: float) -> Any:
        return type("Audit", (), {"records": []})()

    def desired(self) -> Any:
        from reconciler.base.errors import ReconcilerError

        raise ReconcilerError("not needed here")


def test_a_pass_that_began_and_ended_between_two_polls_is_seen_at_the_next(monkeypatch: Any, tmp_path: Any) -> None:
    """The page's own switch: its redirect made the snapshot at once (the manifest had changed: the plan to wake and
    sleep), then the loop's pass ran and ended before the next poll. Its result is the one before it ("converged")
    and no poll saw the pass lock held: only the pass counter says a pass ended. On the old signature the phantom
    plan stayed until MAX_AGE_S."""

    class Shm:
        def __init__(self, view: Any):
            pass

        def to_json(self) -> dict[str, Any]:
            return {"files": []}

    monkeypatch.setattr(page_snapshot, "ShmStatusResult", Shm)
    service = _Service()
    service.st = status_with_verdict(status(actions=[ENTER], changes=True))
    health = {"passes": 7, "last_pass": {"result": "converged", "at": 1.0}, "files": "valid"}
    snap = page_snapshot.Snapshot(str(tmp_path), lambda: service, health=lambda: (200, health))  # type: ignore[arg-type,return-value]
    snap.current()
    assert snap.verdict() == decide(service.st) and snap.verdict().word == "converging"  # type: ignore[union-attr]
    made = snap.made_count
    snap.current()
    assert snap.made_count == made  # nothing changed: the same snapshot, no new look
    # The pass: acted and ended between two polls; the host is as wanted, the last result "converged" again.
    service.st = status_with_verdict(status())
    health = {**health, "passes": 8}
    snap.current()
    assert snap.made_count == made + 1, "a pass ended: the snapshot is made again"
    assert snap.verdict() == Verdict("converged", "the host matches its manifests")
    assert 'data-verdict="converged"' in snap.html and "wanted" not in str(snap.data.status["plan"]["actions"])  # type: ignore[union-attr]
