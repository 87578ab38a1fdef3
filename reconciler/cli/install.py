"""Commands that set a host up: ``reconciler init [--dry-run]`` writes a root from what the machine says (the cards by
NVML, WSL2, the engine, /dev/shm), never over a file that is there; ``reconciler systemd-unit`` prints the unit that
runs the loop for this install (the package carries it: ``reconciler/data/reconciler.service``; with ``--door`` the
front door's, ``reconciler-door.service``); ``reconciler
alert-rules`` prints the Prometheus alert and record rules the package carries (``reconciler/data/prometheus/``).

Registered by ``reconciler.cli.build_parser``: their options here, their handlers in
``reconciler.cli.commands.install`` (the service's ``init_root`` does the work), loaded when one of them runs (the
start-up budget of every other command).
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.cli.common import Command


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "init",
        parents=parents,
        help="write a root from what this machine says: GPUs by UUID, WSL2, the engine, /dev/shm (never overwrites)",
        description="Read this machine (each NVIDIA card through NVML, WSL2, the container engine that answers at "
        "$DOCKER_HOST or the default sockets, the tmpfs of /dev/shm) and write configs/host.yaml, an empty manifest "
        "and a recipe template under --root. It never overwrites a file: with any of them there it refuses and "
        "changes nothing. What it writes passes `reconciler validate`. With --no-gpu it writes a root whose recipes "
        "run on the stand-in vLLM image instead, to try recipes of your own before a GPU host.",
    )
    p.add_argument("--dry-run", action="store_true", help="say what it found and would write; write nothing")
    p.add_argument(
        "--no-gpu",
        action="store_true",
        help="a root to try the tool on a machine without a GPU: host `try`, two stand-in slots and two recipes "
        "of the stand-in vLLM image `make demo` builds (reconciler/fake-vllm:latest)",
    )
    p.set_defaults(func=Command("install", "cmd_init"))
    p = sub.add_parser(
        "systemd-unit",
        parents=parents,
        help="print the systemd unit that runs the loop for this install and --root (Type=notify, watchdog, hardening)",
        description="Print the systemd unit this package carries, its ExecStart naming this install's console script "
        "(or --exec), --root (made absolute) and --metrics-addr: "
        "`reconciler --root /etc/reconciler systemd-unit > /etc/systemd/system/reconciler.service`. With --door, the "
        "front door's own unit: `... systemd-unit --door > /etc/systemd/system/reconciler-door.service`.",
    )
    p.add_argument("--exec", metavar="PATH", help="the command to run instead of this install's console script")
    p.add_argument(
        "--metrics-addr", default="127.0.0.1:9464", help="the loop's listener (default 127.0.0.1:9464, loopback)"
    )
    p.add_argument(
        "--door",
        action="store_true",
        help="print the front door's unit instead (reconciler door, its own process; it listens on host.yaml's "
        "door.listen)",
    )
    p.set_defaults(func=Command("install", "cmd_systemd_unit"))
    p = sub.add_parser(
        "alert-rules",
        parents=parents,
        help="print the Prometheus alert and record rules for the loop's metrics (a rule file for Prometheus)",
        description="Print the Prometheus rule file this package carries (the alerts and records on the loop's "
        "metrics; configs/prometheus/alerts.yml in the repository): "
        "`reconciler alert-rules > /etc/prometheus/rules/reconciler.yml`, named under rule_files.",
    )
    p.set_defaults(func=Command("install", "cmd_alert_rules"))
