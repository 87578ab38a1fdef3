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
    env = {"RECONCILER_STATE_DIR": str(tmp_path / "state")}
    done = switch(root, "exclusive", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "host": "demo",
        "manifest": "manifests/demo.yaml",
        "from": "split",
        "topology": "exclusive",
        "changed": True,
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
    assert "known ['exclusive', 'split']" in done.stderr
    assert (root / "manifests" / "demo.yaml").read_bytes() == named


def test_a_file_changed_while_the_switch_read_it_is_refused(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.service.switch as switch_mod

    monkeypatch.setenv("RECONCILER_STATE_DIR", str(tmp_path / "state"))
    manifest(root, SPLIT_AND_EXCLUSIVE)
    path = root / "manifests" / "demo.yaml"
    real = switch_mod.read_trusted
    reads = []

    def read_then_edit(p: Path, **kw: object) -> bytes:
        data = real(p, **kw)  # type: ignore[arg-type]
        reads.append(data)
        if len(reads) == 1:
            path.write_text(SPLIT_AND_EXCLUSIVE + "# an operator's edit meanwhile\n")
        return data

    monkeypatch.setattr(switch_mod, "read_trusted", read_then_edit)
    with pytest.raises(SwitchRefused, match="changed while the switch read it"):
        HostService(str(root), caller=user_caller("cli", uid=os.getuid())).switch("exclusive")
    assert path.read_text().endswith("# an operator's edit meanwhile\n") and "topology: split" in path.read_text()
