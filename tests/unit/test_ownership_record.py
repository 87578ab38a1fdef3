"""The install's record of the containers it created (reconciler.store.state), on a state directory of the test's own:
ids recorded at create, a lost create's container found by its name and token, gone ids forgotten, and the one
migration of an install from before the record. docs/design.md, safety rule 9."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.store import state

HOST = "h"


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    monkeypatch.setenv(state.ENV, str(d))
    return d


def test_a_new_install_records_every_create_and_a_lost_answer_by_its_token() -> None:
    state.ensure_install_id(HOST)
    assert state.read_ownership(HOST).created == frozenset()
    state.record_pending(HOST, "lane-a", "t1")
    state.record_created(HOST, "id-a", token="t1")
    state.record_pending(HOST, "lane-b", "t2")  # its create's answer never comes
    own = state.read_ownership(HOST)
    assert own.created == {"id-a"} and own.pending == {("lane-b", "t2")}
    # The next pass finds lane-b by its name and token (a copy under another name, or without the token, is not it).
    found = state.settle_created(
        HOST, [("id-a", "lane-a", "t1"), ("id-b", "lane-b", "t2"), ("id-c", "lane-b-copy", "t2"), ("id-d", "x", None)]
    )
    own = state.read_ownership(HOST)
    assert found == ["id-b"] and own.created == {"id-a", "id-b"} and own.pending == frozenset()
    # Containers that are gone are forgotten; the healthy and adopted lists are kept as they were.
    state.mark_healthy(HOST, "id-a")
    state.settle_created(HOST, [("id-b", "lane-b", "t2")])
    own = state.read_ownership(HOST)
    assert own.created == {"id-b"} and own.healthy == {"id-a"}


def test_an_install_from_before_the_record_is_migrated_once(state_dir: Path) -> None:
    (state_dir / HOST).mkdir(mode=0o700)
    (state_dir / HOST / "install.json").write_text(json.dumps({"install_id": "a" * 32, "host": HOST}))
    (state_dir / HOST / "install.json").chmod(0o600)
    assert state.read_ownership(HOST).created is None  # until its first pass: the labels decide, as they did
    state.migrate_created(HOST, ["lane-1"])
    assert state.read_ownership(HOST).created == {"lane-1"}
    log = [json.loads(line) for line in (state_dir / HOST / "ownership.log").read_text().splitlines()]
    assert [(e["event"], e["ids"]) for e in log] == [("record-created", ["lane-1"])]
    # A record lost later is not migrated again: no container is this install's until adopted (fail closed).
    (state_dir / HOST / "containers.json").unlink()
    assert state.read_ownership(HOST).created == frozenset()


def test_pending_creates_are_bounded() -> None:
    state.ensure_install_id(HOST)
    for i in range(state.MAX_PENDING + 5):
        state.record_pending(HOST, f"lane-{i}", f"t{i}")
    pending = state.read_ownership(HOST).pending
    assert len(pending) == state.MAX_PENDING and ("lane-0", "t0") not in pending
