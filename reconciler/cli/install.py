"""Commands that set a host up: ``reconciler init [--dry-run]`` writes a root from what the machine says (the cards by
NVML, WSL2, the engine, /dev/shm), never over a file that is there.

Registered by ``reconciler.cli.build_parser``; the service's ``init_root`` does the work, imported when the command
runs (the start-up budget of every other command).
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.base.terminal import emit_json
from reconciler.cli.common import EXIT_OK, console


def cmd_init(args: argparse.Namespace) -> int:
    from reconciler.service.init_root import init_root  # the start-up budget: NVML, the engine client, the loader

    con = console(args)
    res = init_root(args.root, dry_run=args.dry_run)
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
    if not res.dry_run:
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
        "changes nothing. What it writes passes `reconciler validate`.",
    )
    p.add_argument("--dry-run", action="store_true", help="say what it found and would write; write nothing")
    p.set_defaults(func=cmd_init)
