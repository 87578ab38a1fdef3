"""The handlers of ``reconciler init``, ``systemd-unit`` and ``alert-rules`` (registered by
``reconciler.cli.install``): a root written from what the machine says (``reconciler.service.init_root``), the unit
that runs the loop or the door for this install, and the shipped alert rules. Loaded when one of them runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from reconciler.base.errors import ReconcilerError
from reconciler.base.terminal import emit_json
from reconciler.cli.common import EXIT_OK, console
from reconciler.service.init_root import init_root


def cmd_init(args: argparse.Namespace) -> int:
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
