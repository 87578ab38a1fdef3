"""README's "On your own GPU host" is what `make host-install` runs: every command between the ``# readme:`` markers of
tests/fresh/host-steps.sh (which tests/fresh/host.sh runs on a stock Debian 12 container, the wheel installed with
pipx and with uv) is a line of that section of the README, so the page cannot drift from the run that proves it.
The run itself takes minutes and a network to PyPI: its own target, `make host-install`, not `make test`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = REPO / "tests" / "fresh" / "host-steps.sh"


def section(title: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def marked_commands() -> dict[str, list[str]]:
    """The commands between ``# readme: NAME`` and ``# readme: end`` in host-steps.sh, by NAME."""
    out: dict[str, list[str]] = {}
    name = None
    for line in STEPS.read_text(encoding="utf-8").splitlines():
        mark = re.fullmatch(r"\s*# readme: (\S+)", line)
        if mark:
            name = None if mark[1] == "end" else mark[1]
            if name:
                out[name] = []
        elif name:
            out[name].append(line.strip())
    return out


def test_every_command_the_install_run_types_is_on_the_page() -> None:
    page = section("On your own GPU host")
    # An alternative is a comment line that says so: `#   or: CMD`, `#   or, with uv: CMD`, `#   and then: CMD`.
    lines = {re.sub(r"^#\s+(?:or|and)\b[^:]*:\s+", "", ln.strip()).split("   #")[0].strip() for ln in page.splitlines()}
    marked = marked_commands()
    assert set(marked) >= {
        "build",
        "pipx",
        "uv-itself",
        "uv",
        "init",
        "unit",
        "rules",
        "pipx-uninstall",
        "uv-uninstall",
        "remove",
    }
    missing = [cmd for cmds in marked.values() for cmd in cmds if cmd not in lines]
    assert not missing, f"host-steps.sh types commands README's 'On your own GPU host' does not show: {missing}"
    assert "make host-install" in page and "tests/fresh/host.sh" in page


def test_the_install_builds_on_a_stock_debian_and_replaces_the_demos_link() -> None:
    """The build line needs nothing Debian's python3 lacks (it has no `build` module without python3-build), the
    install lines replace the link `make demo` leaves in /usr/local/bin (without --force pipx keeps it and says
    done), and uv, installed by pipx, lands on root's PATH."""
    marked = marked_commands()
    assert marked["build"] == ["pipx run build"]
    assert all("--force" in cmd for cmd in marked["pipx"] + marked["uv"]), marked
    assert marked["uv-itself"] == ["PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install uv"]
    steps = STEPS.read_text(encoding="utf-8")
    assert steps.count("demo_link\n") == 2 and "make demo's link was kept" in steps
    assert "python -m build" not in section("On your own GPU host").replace("python3 -m build", "")


def test_the_units_header_is_the_readmes_install() -> None:
    """The unit the package carries describes the README's install: each command of its header is a line of
    "On your own GPU host", its ExecStart is the pipx install's, and it points at no file the install lacks."""
    unit = (REPO / "reconciler" / "data" / "reconciler.service").read_text(encoding="utf-8")
    header = [ln[1:].strip() for ln in unit.split("[Unit]")[0].splitlines() if ln.startswith("#   ")]
    page = section("On your own GPU host")
    flat = page.replace("./reconciler-*.whl", "./dist/reconciler-*.whl")
    missing = [cmd for cmd in header if cmd not in flat]
    assert header and not missing, f"the unit's header shows install steps the README does not: {missing}"
    assert "ExecStart=/opt/pipx/venvs/reconciler/bin/reconciler run " in unit
    assert "/etc/reconciler/README.md" not in unit


def test_make_host_install_runs_the_script_and_make_test_does_not() -> None:
    rules = subprocess.run(["make", "-pn", "-f", str(REPO / "Makefile")], capture_output=True, text=True, cwd=REPO)
    db = rules.stdout
    target = re.search(r"^host-install:.*\n((?:\t.*\n|#.*\n)*)", db, re.M)
    assert target is not None, "no host-install target in the Makefile"
    assert "tests/fresh/host.sh" in target[1]
    test = re.search(r"^test:.*\n((?:\t.*\n|#.*\n)*)", db, re.M)
    assert test is not None and "host.sh" not in test[1]
    for script in ("host.sh", "host-steps.sh", "lib.sh", "run.sh"):
        done = subprocess.run(["bash", "-n", str(REPO / "tests" / "fresh" / script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
