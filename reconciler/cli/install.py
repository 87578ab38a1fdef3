"""Commands that set a host up: ``reconciler init [--dry-run]`` writes a root from what the machine says (the cards by
NVML, WSL2, the engine, /dev/shm), never over a file that is there; ``reconciler systemd-unit`` prints the unit that
runs the loop for this install (the package carries it: ``reconciler/data/reconciler.service``; with ``--door`` the
front door's, ``reconciler-door.service``); ``reconciler
alert-rules`` prints the Prometheus alert and record rules the package carries (``reconciler/data/prometheus/``).

Registered by ``reconciler.cli.build_parser``; the service's ``init_root`` does the work, imported when the command
runs (the start-up budget of every other command).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from reconciler.base.terminal import emit_json
from reconciler.cli.common import EXIT_OK, console


def cmd_init(args: argparse.Namespace) -> int:
    from reconciler.service.init_root import init_root  # the start-up budget: NVML, the engine client, the loader

    con = console(args)
    res = init_root(args.root, dry_run=args.dry_run, no_gpu=args.no_gpu)
    if args.json:
        emit_json(res.to_json(), con.out)
        return EXIT_OK
    print("found:", file=con.out)
    for line in res.found():
        print(f"  {line}", file=con.out)
    verb = "would write" if res.dry_run else "wrote"
    print(f"{verb} in {res.root} (host {res.host}):", file=con.out)
    for rel in sorted(res.files):
        print(f"  {rel}", file=con.out)
    if not res.dry_run and res.no_gpu:
        print(
            f"next: `reconciler --root {res.root} apply` starts its recipes on the stand-in image (where `make demo` "
            "did not build it: examples/fake-vllm/build.sh); edit configs/recipes/first.toml and `plan` shows the "
            "change",
            file=con.out,
        )
    elif not res.dry_run:
        print(
            f"next: copy configs/recipes/TEMPLATE.toml.example to a recipe of yours, assign it in "
            f"manifests/{res.host}.yaml, then `reconciler --root {res.root} plan`",
            file=con.out,
        )
    return EXIT_OK


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
    p.set_defaults(func=cmd_init)
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
    p.set_defaults(func=cmd_systemd_unit)
    p = sub.add_parser(
        "alert-rules",
        parents=parents,
        help="print the Prometheus alert and record rules for the loop's metrics (a rule file for Prometheus)",
        description="Print the Prometheus rule file this package carries (the alerts and records on the loop's "
        "metrics; configs/prometheus/alerts.yml in the repository): "
        "`reconciler alert-rules > /etc/prometheus/rules/reconciler.yml`, named under rule_files.",
    )
    p.set_defaults(func=cmd_alert_rules)


UNIT_EXEC = (
    "ExecStart=/opt/pipx/venvs/reconciler/bin/reconciler run --root /etc/reconciler --metrics-addr 127.0.0.1:9464"
)
DOOR_EXEC = "ExecStart=/opt/pipx/venvs/reconciler/bin/reconciler door --root /etc/reconciler"
DOOR_WRITES = "ReadWritePaths=-/etc/reconciler/manifests"  # a demand switch rewrites the host's manifest there
# What systemd would read as a specifier, a variable, a quote or a word break in ExecStart's path arguments.
_UNSAFE_IN_UNIT = set(" \t\n\"'\\%$;")


def this_install() -> str:
    """The console script of this install (the one beside the running interpreter, as pipx, uv tool and a venv lay
    it out); else the interpreter with ``-m reconciler``."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "reconciler")
    return script if os.access(script, os.X_OK) else f"{os.path.abspath(sys.executable)} -m reconciler"


def render_unit(template: str, *, exe: str, root: str, metrics_addr: str, door: bool = False) -> str:
    """The shipped unit with ``ExecStart`` naming ``exe``, ``root`` and ``metrics_addr`` (the door's: ``exe`` and
    ``root``, and ``ReadWritePaths`` the root's manifests); refused (ValueError) for a relative root or a value
    systemd would not read as one word."""
    if not os.path.isabs(root):
        raise ValueError(f"--root {root!r}: the unit needs an absolute path (systemd starts in /)")
    words = (
        ("the install's path", exe.removesuffix(" -m reconciler")),
        ("--root", root),
        ("--metrics-addr", metrics_addr),
    )
    for what, value in words:
        bad = sorted(set(value) & _UNSAFE_IN_UNIT)
        if bad:
            raise ValueError(f"{what} {value!r} holds {''.join(bad)!r}, which a unit file would not read as written")
    if door:
        if template.count(DOOR_EXEC) != 1 or template.count(DOOR_WRITES) != 1:
            raise ValueError("the shipped door unit has no ExecStart line to fill in: reinstall the package")
        manifests = os.path.join(root, "manifests")
        return template.replace(DOOR_EXEC, f"ExecStart={exe} door --root {root}").replace(
            DOOR_WRITES, f"ReadWritePaths=-{manifests}"
        )
    if template.count(UNIT_EXEC) != 1:
        raise ValueError("the shipped unit has no ExecStart line to fill in: reinstall the package")
    return template.replace(UNIT_EXEC, f"ExecStart={exe} run --root {root} --metrics-addr {metrics_addr}")


def cmd_systemd_unit(args: argparse.Namespace) -> int:
    from reconciler.base.errors import ReconcilerError  # start-up: the command line's other commands never need it

    template = _data_text("reconciler-door.service" if args.door else "reconciler.service")
    root = os.path.abspath(args.root)
    try:
        text = render_unit(
            template, exe=args.exec or this_install(), root=root, metrics_addr=args.metrics_addr, door=args.door
        )
    except ValueError as exc:
        raise ReconcilerError(str(exc)) from None
    print(text, end="", file=console(args).out)
    return EXIT_OK


def cmd_alert_rules(args: argparse.Namespace) -> int:
    text = _data_text("prometheus", "alerts.yml")
    print(text, end="", file=console(args).out)
    return EXIT_OK


def _data_text(*parts: str) -> str:
    """A file shipped in the package's data/ (an installed wheel's or the checkout's)."""
    # The start-up budget: importlib.resources (with tempfile, shutil, bz2 and lzma) is imported by the two commands
    # that print a shipped file, not by every command that builds the parser.
    from importlib.resources import files

    node = files("reconciler") / "data"
    for part in parts:
        node = node / part
    return node.read_text(encoding="utf-8")
