"""The audit trail: appended, rotated, never rewritten; every destructive call of every front-end leaves a record
with who, what, why, the outcome, bytes freed and duration (a real confirmed reclaim through the real command
line here; the API and MCP tests check their own records)."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

from reconciler.store.audit import AuditLog


def test_records_are_appended_rotated_and_read_back_in_order(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=400, keep=2)
    for n in range(12):
        log.append({"front": "cli", "action": "shm-reclaim", "n": n, "reason": "x" * 40})
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all((tmp_path / f).stat().st_size <= 400 for f in files)
    assert oct((tmp_path / "audit.jsonl").stat().st_mode & 0o777) == "0o600"
    got = [r["n"] for r in log.read()]
    assert got == sorted(got) and got[-1] == 11 and len(got) < 12  # the oldest rotated away, the rest in order
    cut = log.read()[-2]["time"]
    assert [r["n"] for r in log.read(since=cut)][-1] == 11


def test_a_line_cut_by_a_crash_is_skipped_and_secrets_never_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.append({"action": "apply", "reason": "vllm serve --api-key sk-live-SECRET123"})
    with open(path, "a") as fh:
        fh.write('{"action": "apply", "reas')  # a crash mid-write
    log.append({"action": "apply", "reason": "after"})
    text = path.read_text()
    assert "SECRET123" not in text
    assert [r["reason"] for r in log.read()][-1] == "after"


def test_a_confirmed_reclaim_from_the_command_line_is_in_the_audit(tmp_path: Path, tmpfs_dir: Path) -> None:
    from e2e_helpers import make_root

    root = make_root(tmp_path, shm=tmpfs_dir, api=None, name="audit-cli")
    orphan = tmpfs_dir / "vllm_offload_crashed.mmap"
    orphan.write_bytes(b"\0" * 65536)
    t0 = time.time()
    dry = root.cli("shm", "reclaim")
    assert dry.rc == 0 and orphan.exists(), dry
    done = root.cli("shm", "reclaim", "--confirm", "--json")
    assert done.rc == 0 and not orphan.exists(), done
    a = root.cli("audit", "--json", "--since", str(t0))
    assert a.rc == 0, a
    (rec,) = a.data["records"]  # the dry run changed nothing and is not an action
    assert rec["front"] == "cli" and rec["action"] == "shm-reclaim" and rec["outcome"] == "ok"
    assert rec["bytes_freed"] == 65536 and rec["paths"] == [str(orphan)] and rec["seconds"] >= 0
    text = root.cli("audit")
    head, row = text.stdout.splitlines()
    assert head.split() == ["TIME", "BY", "ACTION", "OUTCOME", "SECONDS", "FREED", "WHAT"], text
    me = pwd.getpwuid(os.getuid()).pw_name  # the command line's user is who did it
    assert row.split()[1:7] == ["cli", f"({me})", "shm-reclaim", "ok", row.split()[5], "64.00"], text
    assert row.index("shm-reclaim") == head.index("ACTION") and row.endswith("1 orphan offload file(s)"), text
    assert root.cli("audit", "--since", "yesterday").rc == 1
    state = Path(root.env["RECONCILER_STATE_DIR"]) / root.host / "audit.jsonl"
    assert json.loads(state.read_text().splitlines()[-1])["action"] == "shm-reclaim"
    assert os.stat(state).st_mode & 0o077 == 0
