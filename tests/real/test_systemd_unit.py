"""``reconciler systemd-unit``: the unit the package carries (reconciler/data/reconciler.service, which
examples/reconciler.service links to), with ExecStart naming this install, --root and --metrics-addr; what it prints
passes `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def unit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True)


def test_for_an_install_in_opt_it_is_the_shipped_example() -> None:
    done = unit("--root", "/etc/reconciler", "systemd-unit", "--exec", "/opt/pipx/venvs/reconciler/bin/reconciler")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (REPO / "examples" / "reconciler.service").read_text()


def test_it_names_this_install_and_passes_systemd_analyze(tmp_path: Path) -> None:
    done = unit("--root", str(tmp_path), "systemd-unit", "--metrics-addr", "127.0.0.1:9999")
    assert done.returncode == 0, done.stderr
    exec_start = [ln for ln in done.stdout.splitlines() if ln.startswith("ExecStart=")]
    script = Path(sys.executable).parent / "reconciler"
    expected = f"{script}" if script.exists() else f"{Path(sys.executable).resolve()} -m reconciler"
    assert exec_start == [f"ExecStart={expected} run --root {tmp_path} --metrics-addr 127.0.0.1:9999"], exec_start
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: make setup installs systemd")
    path = tmp_path / "reconciler.service"
    path.write_text(done.stdout)
    verified = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True)
    assert verified.returncode == 0 and verified.stdout.strip() == verified.stderr.strip() == "", verified


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--root", "/etc/reconciler", "systemd-unit", "--exec", "/opt/my tools/reconciler"], "holds ' '"),
        (["--root", "/etc/reconciler", "systemd-unit", "--metrics-addr", "127.0.0.1:9464;rm"], "holds ';'"),
        (["--root", "/etc/%h", "systemd-unit"], "holds '%'"),
    ],
)
def test_what_a_unit_would_not_read_as_written_is_refused(args: list[str], says: str) -> None:
    done = unit(*args)
    assert done.returncode == 1 and says in done.stderr and done.stdout == "" and "Traceback" not in done.stderr


# ---------------------------------------------------------------- the front door's own unit


def test_the_door_unit_for_an_install_in_opt_is_the_shipped_example() -> None:
    done = unit(
        "--root", "/etc/reconciler", "systemd-unit", "--door", "--exec", "/opt/pipx/venvs/reconciler/bin/reconciler"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (REPO / "examples" / "reconciler-door.service").read_text()


def test_the_door_unit_runs_the_door_of_this_root_and_passes_systemd_analyze(tmp_path: Path) -> None:
    done = unit("--root", str(tmp_path), "systemd-unit", "--door")
    assert done.returncode == 0, done.stderr
    conf = dict(ln.split("=", 1) for ln in done.stdout.splitlines() if "=" in ln and not ln.startswith("#"))
    script = Path(sys.executable).parent / "reconciler"
    expected = f"{script}" if script.exists() else f"{Path(sys.executable).resolve()} -m reconciler"
    # Its own process: the door, never the loop, and nothing of the loop's (no notify, no watchdog).
    assert conf["ExecStart"] == f"{expected} door --root {tmp_path}", conf["ExecStart"]
    assert conf["Type"] == "exec" and "WatchdogSec" not in conf
    # It shares the loop's private directories (it publishes its requests in flight where the drain reads them)
    # and may write only the manifests' directory besides (a demand switch), holding no capability at all.
    assert conf["RuntimeDirectory"] == "reconciler" and conf["RuntimeDirectoryPreserve"] == "yes"
    assert conf["StateDirectory"] == "reconciler" and conf["ProtectSystem"] == "strict"
    assert conf["ReadWritePaths"] == f"-{tmp_path}/manifests"
    assert conf["CapabilityBoundingSet"] == "" and conf["NoNewPrivileges"] == "yes"
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: make setup installs systemd")
    path = tmp_path / "reconciler-door.service"
    path.write_text(done.stdout)
    verified = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True)
    assert verified.returncode == 0 and verified.stdout.strip() == verified.stderr.strip() == "", verified


def test_a_door_unit_systemd_would_not_read_as_written_is_refused() -> None:
    done = unit("--root", "/etc/%h", "systemd-unit", "--door")
    assert done.returncode == 1 and "holds '%'" in done.stderr and done.stdout == ""
