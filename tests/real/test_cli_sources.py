"""When a source is down, `status` and `plan` say so and nothing more: unknown is shown as unknown (exit 1), and
the advice names the cause (real `reconciler` processes; Docker is made unreachable by pointing the host file at
a socket where nothing listens)."""

from __future__ import annotations

from pathlib import Path

import yaml
from e2e_helpers import make_root

from reconciler.cli.render import Style, render_plan
from reconciler.plan.actions import Blocker, Plan
from reconciler.plan.causes import BlockerCause


def _dead_docker_root(tmp_path: Path, shm: Path):  # type: ignore[no-untyped-def]
    root = make_root(tmp_path, shm=shm, api=None, name="dead-docker")
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["docker"]["url"] = f"unix://{tmp_path}/nothing-listens.sock"
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


def test_status_with_docker_down_shows_unknown_and_exits_1(tmp_path: Path, tmpfs_dir: Path) -> None:
    root = _dead_docker_root(tmp_path, tmpfs_dir)
    text = root.cli("status")
    assert text.rc == 1, text
    assert "has free" not in text.stdout, text
    assert text.stdout.count("unknown (docker unavailable)") == 2, text
    assert "error: docker source unavailable" in text.stderr
    data = root.cli("status", "--json")
    assert data.rc == 1
    slots = data.data["slots"]
    assert all(s["free"] is None and s["unknown"] == ["docker"] for s in slots.values()), slots
    assert data.data["converged"] is False


def test_plan_with_docker_down_gives_no_ownership_advice(tmp_path: Path, tmpfs_dir: Path) -> None:
    root = _dead_docker_root(tmp_path, tmpfs_dir)
    root.write_manifest_text(f"host: {root.host}\nassignments: []\n")
    r = root.cli("plan")
    assert r.rc == 1, r
    assert "never stops what it does not own" not in r.stdout + r.stderr
    assert "docker source unavailable" in r.stderr


def _plan(*blockers: Blocker) -> Plan:
    return Plan(host="h", blockers=blockers)


def test_blocked_advice_follows_the_cause() -> None:
    s = Style(color=False)
    source = Blocker(
        "r", ("a",), "offload files cannot be inspected: proc unavailable: pid 1 ...", "", cause=BlockerCause.UNSEEN
    )
    held = Blocker(
        "r", ("a",), "container x holds GPU slot a and is not managed by this tool", "x", cause=BlockerCause.HELD
    )
    room = Blocker("r", ("a",), "tmpfs would have 1 MiB free", "tmpfs", cause=BlockerCause.TMPFS)
    assert (source.cause, held.cause, room.cause) == ("source", "held", "tmpfs")
    only_source = render_plan(_plan(source), None, s)
    assert "fix what the reading named above says" in only_source and "never stops" not in only_source
    only_held = render_plan(_plan(held), None, s)
    assert "free the slot or change the manifest" in only_held and "source" not in only_held.split("Blocked")[1]
    assert "Make room on the offload tmpfs" in render_plan(_plan(room), None, s)
    assert _plan(held).to_json()["blockers"][0]["cause"] == "held"
