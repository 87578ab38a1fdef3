"""Every file the tool keeps carries its format version, and the next release reads it (docs/design.md, "What a
release reads of the last one's"): a file without the field is version 1, read as before; one of a newer version is
refused, naming both versions, and nothing is changed. On a state directory and a runtime directory of the test's
own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reconciler.base.errors import ReconcilerError
from reconciler.base.formats import FORMAT_KEY, format_problem
from reconciler.service import saved_plans
from reconciler.store import audit, history, loop_state, state
from reconciler.store.lock import ENV as LOCK_ENV

HOST = "h"


@pytest.fixture(autouse=True)
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    monkeypatch.setenv(state.ENV, str(d))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv(LOCK_ENV, str(run))
    return d


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(json.dumps(data))
    path.chmod(0o600)


def test_the_rule() -> None:
    assert format_problem({}, reads=1) is None
    assert format_problem({FORMAT_KEY: 1}, reads=1) is None
    assert "newer reconciler (format version 2; this one reads up to 1)" in (
        format_problem({FORMAT_KEY: 2}, reads=1) or ""
    )
    for bad in ("2", True, 0, None, 1.5):
        assert "no version this reconciler knows" in (format_problem({FORMAT_KEY: bad}, reads=1) or ""), bad


def test_a_state_record_is_written_with_its_version_and_read_without_it(dirs: Path) -> None:
    state.ensure_install_id(HOST)
    raw = json.loads((dirs / HOST / "install.json").read_text())
    assert raw[FORMAT_KEY] == state.RECORD_FORMAT == 1
    assert FORMAT_KEY not in state.read_record(HOST, "install.json")
    history.record_duration(HOST, "omni", "enter", 2.0)
    assert history.expected(HOST, "omni", "enter") == (2.0, 1)


def test_a_state_record_of_the_release_before_is_read_as_version_1(dirs: Path) -> None:
    """The last release's files had no version: each reads as it did (the install's id, its created containers)."""
    _write(
        dirs / HOST / "install.json", {"install_id": "a" * 32, "host": HOST, "created": 1.0, "records_created": True}
    )
    _write(dirs / HOST / "containers.json", {"created": ["c1"], "adopted": [], "healthy": ["c1"], "pending": []})
    own = state.read_ownership(HOST)
    assert own.install_id == "a" * 32 and own.created == {"c1"} and own.healthy == {"c1"}


def test_a_state_record_of_a_newer_version_is_refused(dirs: Path) -> None:
    path = dirs / HOST / "install.json"
    _write(path, {FORMAT_KEY: 2, "install_id": "a" * 32, "records_created": True})
    with pytest.raises(state.StateError) as err:
        state.read_ownership(HOST)
    assert str(err.value) == (
        f"cannot read {path}: it was written by a newer reconciler (format version 2; this one reads up to 1): run "
        "that release, or the newer one again; nothing was changed"
    )
    with pytest.raises(state.StateError):
        state.ensure_install_id(HOST)
    assert json.loads(path.read_text())[FORMAT_KEY] == 2, "nothing was changed"


def test_an_audit_line_carries_its_version_and_a_newer_one_says_so(dirs: Path) -> None:
    log = audit.audit_log(HOST)
    written = log.append({"front": "cli", "action": "apply", "outcome": "ok"})
    assert FORMAT_KEY not in written
    line = json.loads(log.path.read_text().splitlines()[0])
    assert line[FORMAT_KEY] == audit.AUDIT_FORMAT == 1
    with open(log.path, "a") as fh:
        fh.write(json.dumps({"time": 5.0, "front": "cli", "action": "apply", "outcome": "ok"}) + "\n")  # no version
        fh.write(json.dumps({FORMAT_KEY: 3, "time": 6.0, "action": "teleport"}) + "\n")
    first, before, newer = log.read()
    assert first == written and before["time"] == 5.0 and FORMAT_KEY not in before
    assert newer["outcome"] == "unreadable" and "format version 3; this one reads up to 1" in newer["detail"]
    assert "action" not in newer and newer["time"] == 6.0


def test_the_ownership_log_carries_its_version(dirs: Path) -> None:
    state.record(HOST, {"event": "adopt", "ids": ["c1"]})
    line = json.loads((dirs / HOST / "ownership.log").read_text())
    assert line[FORMAT_KEY] == 1 and line["event"] == "adopt"


def test_the_loop_state_carries_its_version_and_a_newer_one_is_not_read() -> None:
    loop_state.write_loop_state(HOST, {"pid": os.getpid(), "last": "ok"})
    path = loop_state.state_path(HOST)
    assert json.loads(path.read_text())[FORMAT_KEY] == 1
    assert loop_state.read_loop_state(HOST) == {"pid": os.getpid(), "last": "ok"}
    _write(path, {"pid": os.getpid(), "last": "ok"})  # the release before's
    assert loop_state.read_loop_state(HOST) == {"pid": os.getpid(), "last": "ok"}
    _write(path, {FORMAT_KEY: 2, "pid": os.getpid(), "last": "ok"})
    assert loop_state.read_loop_state(HOST) is None


def test_a_saved_plan_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    _write(path, {"format": "reconciler-plan/2", "plan": {}, "fingerprint": {}})
    with pytest.raises(ReconcilerError) as err:
        saved_plans.read_plan_document(str(path))
    assert "a plan saved by a newer reconciler (format 'reconciler-plan/2'; this one reads 'reconciler-plan/1')" in str(
        err.value
    )
    assert "nothing was applied" in str(err.value)
    _write(path, {"format": "something-else/9"})
    with pytest.raises(ReconcilerError, match="not a saved plan of this tool"):
        saved_plans.read_plan_document(str(path))
