"""What the attack tests share: an unprivileged user (uid 65534, ``nobody``, through ``setpriv``) who runs the
system's Python (the project's virtual environment lies under /root, out of its reach), a scratch directory it can
reach, and a root-only file that no attack may change.

The tool itself runs as root (``reconciler`` from this checkout, through ``Root.cli`` and ``LoopProcess`` of
tests/e2e_helpers.py), as it does on a real host.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import LoopProcess, stop_process

from attack.helpers import PRECIOUS, PYTHON, Attacker


@pytest.fixture(scope="session")
def attacker() -> Attacker:
    if os.geteuid() != 0:
        pytest.fail("the attack tests run the tool as root and the attacker as uid 65534: run them as root")
    for tool in ("setpriv", "prlimit"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} (util-linux) is needed to act as an unprivileged user")
    if not Path(PYTHON).exists():
        pytest.fail(f"{PYTHON} is needed: the attacker runs the system's Python")
    a = Attacker()
    a.python("import os; assert os.getuid() == 65534 and os.geteuid() == 65534")
    return a


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory the unprivileged user can reach (0755, root's), under /tmp; removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="reconciler-attack-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def public(scratch: Path) -> Path:
    """A world-writable sticky directory, like /run/lock and /tmp."""
    d = scratch / "public"
    d.mkdir()
    d.chmod(0o1777)
    return d


@pytest.fixture
def precious(scratch: Path) -> Path:
    """A root-only file (0600) whose content every test checks afterwards."""
    p = scratch / "precious"
    p.write_text(PRECIOUS)
    p.chmod(0o600)
    return p


@pytest.fixture
def loops() -> Iterator[list[LoopProcess]]:
    """The loops a test starts (it appends each): stopped afterwards, killed if they do not end within 30 s."""
    started: list[LoopProcess] = []
    yield started
    for lp in started:
        if lp.proc.poll() is None:
            stop_process(lp.proc, timeout=30)
