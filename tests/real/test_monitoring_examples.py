"""The monitoring examples the README shows are what the real tools accept: Prometheus's configuration with the alert
rules (promtool) and the Alertmanager routing (amtool), and the routing sends every severity the rules use somewhere,
critical ones to the pager."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str, package: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} not found: install Debian's {package} package (.ci/setup-host does)"
    return found


def test_the_example_prometheus_config_and_its_rules_check() -> None:
    out = subprocess.run(
        [_tool("promtool", "prometheus"), "check", "config", "examples/prometheus.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rules found" in out.stdout + out.stderr


def test_the_example_alertmanager_routing_checks_and_pages_on_critical() -> None:
    path = REPO / "examples" / "alertmanager.yml"
    out = subprocess.run(
        [_tool("amtool", "prometheus-alertmanager"), "check-config", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    conf = yaml.safe_load(path.read_text())
    names = {r["name"] for r in conf["receivers"]}
    assert conf["route"]["receiver"] in names
    critical = [r for r in conf["route"]["routes"] if 'severity="critical"' in r["matchers"]]
    assert critical and critical[0]["receiver"] == "pager" and "pager" in names
    rules = yaml.safe_load((REPO / "configs" / "prometheus" / "alerts.yml").read_text())
    severities = {r["labels"]["severity"] for g in rules["groups"] for r in g["rules"]}
    assert severities <= {"critical", "warning"}, severities  # warning: the default receiver; critical: the pager
