"""``reconciler switch NAME`` (reconciler/service/switch.py over load/topology_edit.py): the manifest's ``topology:``
value set, every other byte kept, audited with its caller; refused, changing nothing, for an unknown name, a manifest
without named topologies, or a file that changed while the switch read it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real.test_topologies import SPLIT_AND_EXCLUSIVE, demo_root, manifest
from reconciler.service import HostService, user_caller
from reconciler.service.switch import SwitchRefused

COMMENTED = "# the report's two topologies\n" + SPLIT_AND_EXCLUSIVE.replace(
    "topology: split", "topology: split    # restored the normal split topology"
)


@pytest.fixture
def root(tmp_path: Path, shared_tmpfs: Path) -> Path:
    return demo_root(tmp_path / "root", shared_tmpfs)


def switch(where: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(where), "switch", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_a_switch_changes_the_topology_value_alone_and_is_audited(root: Path, tmp_path: Path) -> None:
    manifest(root, COMMENTED)
    path = root / "manifests" / "demo.yaml"
    os.chmod(path, 0o640)
    env = {"RECONCILER_STATE_DIR": str(tmp_path / "state"), "RECONCILER_LOCK_DIR": str(tmp_path / "lock")}
    done = switch(root, "exclusive", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "host": "demo",
        "manifest": "manifests/demo.yaml",
        "from": "split",
        "topology": "exclusive",
        "changed": True,
        "loop_running": False,
    }
    assert path.read_text() == COMMENTED.replace("topology: split ", "topology: exclusive ", 1)
    assert path.stat().st_mode & 0o777 == 0o640, "the file keeps its mode"
    again = switch(root, "exclusive", env=env)
    assert again.returncode == 0 and "already" in again.stdout
    audit = subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(root), "audit", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    records = [r for r in json.loads(audit.stdout)["records"] if r.get("action") == "switch"]
    assert records and records[0]["outcome"] == "ok" and "split -> exclusive" in records[0]["reason"], records
    assert records[0]["front"] == "cli" and "who" in records[0]


def test_an_unknown_name_or_no_named_topologies_is_refused_and_nothing_changes(root: Path, tmp_path: Path) -> None:
    env = {"RECONCILER_STATE_DIR": str(tmp_path / "state")}
    plain = (root / "manifests" / "demo.yaml").read_bytes()
    done = switch(root, "exclusive", env=env)
    assert done.returncode == 1 and "no named topologies" in done.stderr and "Traceback" not in done.stderr
    assert (root / "manifests" / "demo.yaml").read_bytes() == plain
    manifest(root, SPLIT_AND_EXCLUSIVE)
    named = (root / "manifests" / "demo.yaml").read_bytes()
    done = switch(root, "other", "--json", env=env)
    assert done.returncode == 1 and json.loads(done.stdout)["error"]["code"] == "switch_refused"
    assert "'other' is no topology of manifests/demo.yaml: its topologies: exclusive, split;" in done.stderr
    assert "[" not in done.stderr, "the known names as words, not a Python list"
    # A name that differs in case (or by a typo) is named back (issue 44, item 8).
    done = switch(root, "Split", env=env)
    assert done.returncode == 1, done
    assert "'Split' is no topology of manifests/demo.yaml: did you mean split? (its topologies: exclusive, split)" in (
        done.stderr
    )
    assert "[" not in done.stderr
    assert (root / "manifests" / "demo.yaml").read_bytes() == named


def test_a_switch_with_no_loop_running_says_nothing_converges_it_yet(root: Path, tmp_path: Path) -> None:
    env = {"RECONCILER_STATE_DIR": str(tmp_path / "state"), "RECONCILER_LOCK_DIR": str(tmp_path / "lock")}
    manifest(root, SPLIT_AND_EXCLUSIVE)
    done = switch(root, "exclusive", env=env)
    assert done.returncode == 0, done.stderr
    assert "the loop converges it" not in done.stdout, done.stdout
    assert (
        "no loop is running for host demo, so nothing converges it yet: run `reconciler apply`, or switch with "
        "`reconciler switch exclusive --wait`"
    ) in done.stdout, done.stdout


def test_a_file_changed_while_the_switch_read_it_is_refused(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.service.manifest_edit as edit_mod

    monkeypatch.setenv("RECONCILER_STATE_DIR", str(tmp_path / "state"))
    manifest(root, SPLIT_AND_EXCLUSIVE)
    path = root / "manifests" / "demo.yaml"
    real = edit_mod.read_trusted
    reads = []

    def read_then_edit(p: Path, **kw: object) -> bytes:
        data = real(p, **kw)  # type: ignore[arg-type]
        reads.append(data)
        if len(reads) == 1:
            path.write_text(SPLIT_AND_EXCLUSIVE + "# an operator's edit meanwhile\n")
        return data

    monkeypatch.setattr(edit_mod, "read_trusted", read_then_edit)
    with pytest.raises(SwitchRefused, match="changed while the switch read it"):
        HostService(str(root), caller=user_caller("cli", uid=os.getuid())).switch("exclusive")
    assert path.read_text().endswith("# an operator's edit meanwhile\n") and "topology: split" in path.read_text()


THREE = (
    "# three topologies, and comments that must survive\n"
    + SPLIT_AND_EXCLUSIVE.replace("topology: split", "topology: split  # the usual")
    + "  solo-a:   # omni alone, on the other card\n    - recipe: omni\n      gpus: [dark-compute-a]\n"
)


@pytest.mark.parametrize("targets", [("exclusive", "solo-a"), ("exclusive", "exclusive")])
def test_two_switches_at_once_one_wins_and_the_other_is_refused_as_changed(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, targets: tuple[str, str]
) -> None:
    """Two switches of one manifest at once (two threads of one process, each as the HTTP API or MCP would call it):
    both read the file before either writes, and each write is slow. One lock serialises the check of the bytes
    read and the write (safety rule 8): exactly one wins, the other is refused as changed, the file holds the
    winner's topology with every other byte kept, and both are in the audit trail as they ended."""
    import threading
    import time

    import reconciler.service.manifest_edit as edit_mod
    import reconciler.service.switch as switch_mod

    monkeypatch.setenv("RECONCILER_STATE_DIR", str(tmp_path / "state"))
    manifest(root, THREE)
    path = root / "manifests" / "demo.yaml"
    both_read = threading.Barrier(2, timeout=30)
    real_edit, real_write = switch_mod.set_topology, edit_mod.write_atomic

    def edit_once_both_read(text: str, name: str) -> str:
        both_read.wait()  # each has read the file: neither has written
        return real_edit(text, name)

    def slow_write(*args: object, **kw: object) -> None:
        time.sleep(0.3)  # wide open for the other switch, were its check and write not under the lock
        real_write(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(switch_mod, "set_topology", edit_once_both_read)
    monkeypatch.setattr(edit_mod, "write_atomic", slow_write)
    ended: dict[int, object] = {}

    def switch_to(i: int, name: str) -> None:
        svc = HostService(str(root), caller=user_caller("api", uid=os.getuid()))
        try:
            ended[i] = svc.switch(name)
        except SwitchRefused as exc:
            ended[i] = exc

    threads = [threading.Thread(target=switch_to, args=(i, n)) for i, n in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    won = [i for i, r in ended.items() if not isinstance(r, Exception)]
    lost = [i for i, r in ended.items() if isinstance(r, SwitchRefused)]
    assert len(won) == 1 and len(lost) == 1, ended
    winner = targets[won[0]]
    assert "changed while the switch read it" in str(ended[lost[0]]), ended
    assert path.read_text() == THREE.replace("topology: split ", f"topology: {winner} ", 1)
    records = [
        r for r in HostService(str(root), caller=user_caller("cli", uid=0)).audit().records if r["action"] == "switch"
    ]
    assert sorted(r["outcome"] for r in records) == ["ok", "refused"], records
    (ok,) = [r for r in records if r["outcome"] == "ok"]
    (refused,) = [r for r in records if r["outcome"] == "refused"]
    assert ok["reason"] == f"topology split -> {winner}" and "changed while the switch read it" in refused["reason"]


def test_switches_racing_through_the_command_line_lose_no_update(root: Path, tmp_path: Path) -> None:
    """Two `reconciler switch` processes started at once, a few times over: whichever order they end in, no switch
    writes over another it did not see. Every exit 0 that switched is an audited "ok" and every exit 1 an audited
    refusal; the
    "ok" records chain (each switches from the topology the one before it set) and the file holds the last one's
    topology with every other byte kept (safety rule 8)."""
    env = {"RECONCILER_STATE_DIR": str(tmp_path / "state")}
    manifest(root, THREE)
    path = root / "manifests" / "demo.yaml"
    base = [sys.executable, "-m", "reconciler", "--root", str(root), "switch"]
    outcomes: list[tuple[int, bool]] = []  # (exit code, switched: not "already" that topology)
    for targets in (("exclusive", "solo-a"), ("split", "exclusive"), ("solo-a", "split")):
        procs = [
            (
                name,
                subprocess.Popen(
                    [*base, name], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                ),
            )
            for name in targets
        ]
        for name, proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode in (0, 1) and "Traceback" not in err, err
            assert proc.returncode == 0 or "changed while the switch read it" in err, err
            outcomes.append((proc.returncode, f"topology is {name} already" not in out))
    audit = subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(root), "audit", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    records = [r for r in json.loads(audit.stdout)["records"] if r.get("action") == "switch"]
    oks = [r["reason"].removeprefix("topology ").split(" -> ") for r in records if r["outcome"] == "ok"]
    refused = [r for r in records if r["outcome"] == "refused"]
    assert len(oks) == sum(rc == 0 and switched for rc, switched in outcomes), (outcomes, records)
    assert len(refused) == sum(rc == 1 for rc, _ in outcomes), (outcomes, records)
    now = "split"
    for before, after in oks:
        assert before == now, f"a switch wrote over one it did not see: {oks}"
        now = after
    assert path.read_text() == THREE.replace("topology: split ", f"topology: {now} ", 1)
