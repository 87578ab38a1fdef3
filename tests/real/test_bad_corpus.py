"""The bad-input corpus: every broken root is refused with its file, line and a clear message, and changes nothing.

tests/cases/bad/_base/ is a valid root; each tests/cases/bad/NNN-name/ holds the files that differ from it (a
``remove`` file lists base files to delete first) and an ``expect`` file: the first line is ``PATH`` or
``PATH:LINE`` as the error must start, each further line a substring of that same error line. ``@SHM@`` in any
file stands for the test's tmpfs (shm.dir must be a tmpfs mount point).

Each case runs ``reconciler validate`` and ``reconciler plan`` in-process (``cli.main``); a handful also run as
whole processes. The expectation: exit 1, the file (and line) named, the message, no traceback, and the root's
files untouched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli import main

CASES = Path(__file__).resolve().parents[1] / "cases" / "bad"
BASE = CASES / "_base"
ALL = sorted(p.name for p in CASES.iterdir() if p.is_dir() and p.name[:3].isdigit())
# Run as whole processes too: one of each file kind and of the ways a file can be broken.
AS_PROCESS = [
    name
    for name in ALL
    if name.split("-", 1)[1]
    in {
        "manifest-assignments-twice-second-empty",
        "recipe-binary-nul",
        "recipe-is-a-directory",
        "host-latin1",
        "shm-pattern-star-alone",
        "shm-dir-not-tmpfs",
        "volume-host-root",
        "manifest-offload-over-tmpfs",
    }
]


def build_root(case: str, dest: Path, shm: Path) -> Path:
    """The base root with the case's files over it, ``@SHM@`` replaced by ``shm``."""
    root = dest / "root"
    shutil.copytree(BASE, root)
    src = CASES / case
    remove = src / "remove"
    if remove.exists():
        for rel in remove.read_text().split("\n"):
            if rel:
                (root / rel).unlink()
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and str(rel) not in ("expect", "remove"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, root / rel)
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            if b"@SHM@" in data:
                f.write_bytes(data.replace(b"@SHM@", str(shm).encode()))
    return root


def expectation(case: str) -> tuple[str, list[str]]:
    lines = (CASES / case / "expect").read_text().splitlines()
    return lines[0], [s for s in lines[1:] if s]


def fingerprint(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def check(case: str, code: int, out: str, err: str) -> None:
    where, subs = expectation(case)
    assert code == 1, f"{case}: exit {code}, expected 1\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err and "Traceback" not in out, f"{case}: a traceback\n{err}"
    has_line = where.rsplit(":", 1)[-1].isdigit()
    lines = [ln for ln in err.splitlines() if ln.startswith(where + (": " if has_line else ":"))]
    assert lines, f"{case}: no error names {where}\nstderr:\n{err}"
    assert any(all(s in ln for s in subs) for ln in lines), f"{case}: no error at {where} says {subs}\nstderr:\n{err}"
    for ln in err.splitlines():
        path = ln.split(":", 1)[0]
        assert path and (path.startswith(("configs", "manifests"))), f"{case}: an error that names no file: {ln!r}"


def test_the_base_root_is_valid(tmp_path: Path, shared_tmpfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_root(ALL[0], tmp_path, shared_tmpfs)
    shutil.rmtree(root)
    shutil.copytree(BASE, root)
    for f in root.rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes().replace(b"@SHM@", str(shared_tmpfs).encode()))
    assert main(["--root", str(root), "validate"]) == 0, capsys.readouterr().err
    for name in ("omni", "lane"):
        (root / "manifests/base.yaml").write_text(
            f"host: corpus\nassignments:\n  - recipe: {name}\n    gpus: {'[dark-compute-a, dark-compute-b]' if name == 'lane' else '[dark-compute-b]'}\n"
        )
        assert main(["--root", str(root), "validate"]) == 0, capsys.readouterr().err


def test_the_corpus_is_large_and_every_case_has_an_expectation() -> None:
    assert len(ALL) >= 100
    for case in ALL:
        where, subs = expectation(case)
        assert where.startswith(("configs", "manifests")) and subs, case


@pytest.mark.parametrize("case", ALL)
def test_bad_root_is_refused(case: str, tmp_path: Path, shared_tmpfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_root(case, tmp_path, shared_tmpfs)
    before = fingerprint(root)
    code = main(["--root", str(root), "validate"])
    out, err = capsys.readouterr()
    check(case, code, out, err)
    # plan loads the same files first and stops there: exit 1, the same message, Docker never asked.
    code = main(["--root", str(root), "plan"])
    out, err = capsys.readouterr()
    check(case, code, out, err)
    assert fingerprint(root) == before, "validate and plan changed nothing"


@pytest.mark.parametrize("case", AS_PROCESS)
def test_bad_root_is_refused_by_the_command(case: str, tmp_path: Path, shared_tmpfs: Path) -> None:
    root = build_root(case, tmp_path, shared_tmpfs)
    env = {**os.environ, "RECONCILER_LOCK_DIR": str(tmp_path / "lock"), "NO_COLOR": "1"}
    env.pop("RECONCILER_ROOT", None)
    for command in (["validate"], ["plan"], ["validate", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", "--root", str(root), *command],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        check(case, proc.returncode, proc.stdout, proc.stderr)
