"""The set-up (.ci/setup-host) installs only what the project needs, and leaves `reconciler` runnable by name.

The package check asks apt itself what installing the set-up's packages would bring onto an empty system (a
simulation, ``apt-get -s`` against an empty package database: nothing is installed), once as the set-up installs
them and once with their recommends, so the check is seen to catch what it guards against.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / ".ci" / "setup-host"
# What `apt-get install prometheus` brought with its recommends on Debian 12: agents and tools no GPU host asked for.
UNWANTED = ("prometheus-node-exporter", "smartmontools", "nvme-cli", "ipmitool", "openipmi", "freeipmi-common")


def _packages() -> list[str]:
    out = subprocess.run(["bash", str(SETUP), "--packages"], capture_output=True, text=True, check=True).stdout
    return out.split()


def _simulate(packages: list[str], tmp_path: Path, *, recommends: bool) -> list[str]:
    """The packages apt would install on a system with none (``Inst NAME`` lines of a simulation)."""
    empty = tmp_path / "status"
    empty.write_text("")
    cmd = ["apt-get", "-s", "-o", f"Dir::State::status={empty}", "install", *packages]
    if not recommends:
        cmd.insert(2, "--no-install-recommends")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "LC_ALL": "C"})
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout[-2000:]}{proc.stderr}"
    return re.findall(r"^Inst (\S+)", proc.stdout, flags=re.M)


def test_every_apt_install_of_the_setup_skips_recommends() -> None:
    lines = [
        ln
        for ln in SETUP.read_text().splitlines()
        if re.search(r"\bapt-get\b.*\binstall\b", ln) and not ln.lstrip().startswith(("#", "echo"))
    ]
    assert lines, "no apt-get install in .ci/setup-host"
    assert all("--no-install-recommends" in ln for ln in lines), lines


def test_the_setup_pulls_in_no_monitoring_agent(tmp_path: Path) -> None:
    packages = _packages()
    assert {"docker.io", "prometheus", "curl", "jq"} <= set(packages), packages
    plain = _simulate([*packages, "apparmor"], tmp_path, recommends=False)
    assert "docker.io" in plain and "prometheus" in plain, plain[:20]
    assert not set(plain) & set(UNWANTED), sorted(set(plain) & set(UNWANTED))
    # The same packages with their recommends: the unwanted ones come in, so the check above can fail.
    loaded = _simulate(packages, tmp_path, recommends=True)
    assert "prometheus-node-exporter" in loaded and len(loaded) > len(plain), len(loaded)


def test_reconciler_is_on_the_path_and_is_this_checkouts() -> None:
    found = shutil.which("reconciler", path="/usr/local/bin:/usr/bin:/bin")
    assert found, "no `reconciler` on the PATH: .ci/setup-host links .venv/bin/reconciler into /usr/local/bin"
    assert Path(found).resolve() == (REPO / ".venv" / "bin" / "reconciler").resolve(), (
        f"{found} is another checkout's ({Path(found).resolve()}): run `make setup` here"
    )
    out = subprocess.run([found, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("reconciler ")


def test_the_demos_setup_brings_no_test_tool(tmp_path: Path) -> None:
    out = subprocess.run(["bash", str(SETUP), "--demo", "--packages"], capture_output=True, text=True, check=True)
    demo = set(out.stdout.split())
    assert {"docker.io", "python3-venv", "curl", "jq"} <= demo, demo
    full = set(_packages())
    # The test tools are the full set-up's alone: a workstation running the demo gets no Podman, proxy or Prometheus.
    test_tools = {"podman", "catatonit", "haproxy", "prometheus", "debootstrap", "busybox-static", "systemd"}
    assert test_tools <= full, full
    assert not demo & test_tools, sorted(demo & test_tools)
    pulled = _simulate(sorted(demo), tmp_path, recommends=False)
    assert not {"podman", "haproxy", "prometheus"} & set(pulled), sorted(set(pulled))
    assert "setup-host --demo" in (REPO / "Makefile").read_text()
