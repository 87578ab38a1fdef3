"""The command line: ``reconciler validate | plan | apply | run | status | shm``.

The entry point of the console script. Every command takes ``--root`` and ``--json`` (before or after the
command name). Exit codes are part of the contract (DESIGN.md): plan 0 nothing to do, 2 changes pending,
3 blocked, 1 error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from reconciler import __version__
from reconciler.errors import ConfigError, ReconcilerError
from reconciler.loader import default_root

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_BLOCKED = 3


def emit_json(data: Any) -> None:
    from reconciler.redact import redact_json

    # A last pass over every string on its way out: a command line missed at its source is masked here.
    sys.stdout.write(redact_json(data, indent=2, sort_keys=False, default=str) + "\n")


def report_config_error(exc: ConfigError, args: argparse.Namespace) -> int:
    for p in exc.problems:
        print(str(p), file=sys.stderr)
    if getattr(args, "json", False) and args.command == "validate":
        emit_json({"valid": False, "errors": [{"path": p.path, "line": p.line, "message": p.message} for p in exc.problems]})
    return EXIT_ERROR


# ---------------------------------------------------------------- commands


def cmd_validate(args: argparse.Namespace) -> int:
    from reconciler.loader import load_desired

    desired = load_desired(args.root)
    if args.json:
        emit_json(
            {
                "valid": True,
                "host": desired.host.name,
                "manifest": desired.manifest_path,
                "recipes": sorted(desired.recipes),
                "assignments": [
                    {"recipe": a.recipe, "gpus": list(a.slots), "recipe_hash": a.recipe_hash} for a in desired.assignments
                ],
            }
        )
    else:
        print(
            f"valid: host {desired.host.name}, {len(desired.recipes)} recipe(s), "
            f"{len(desired.assignments)} assignment(s) in {desired.manifest_path}"
        )
    return EXIT_OK


def _observe_and_plan(root: str):  # type: ignore[no-untyped-def]
    from reconciler.loader import load_desired
    from reconciler.observe import observe
    from reconciler.planner import plan

    desired = load_desired(root)
    observed = observe(desired.host)
    return desired, observed, plan(desired, observed)


def plan_exit_code(p: Any) -> int:
    if p.unavailable:
        return EXIT_ERROR
    if p.blocked:
        return EXIT_BLOCKED
    if p.actions:
        return EXIT_CHANGES
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from reconciler.render import Style, render_plan

    if args.out:
        from reconciler.fingerprint import file_digests

        files_before = file_digests(args.root)  # before loading: an edit in between makes the saved plan stale
    desired, observed, p = _observe_and_plan(args.root)
    if args.out:
        _save_plan(args.out, p, observed, files_before)
    if args.json:
        data = p.to_json()
        data["sources"] = {n: v.render() for n, v in observed.sources.items()}
        emit_json(data)
    else:
        print(render_plan(p, observed, Style()))
    code = plan_exit_code(p)
    if code == EXIT_ERROR:
        for s in observed.unavailable():
            print(f"error: {s.name} source unavailable: {s.detail}", file=sys.stderr)
    return code


def _save_plan(path: str, p: Any, observed: Any, files: dict[str, str]) -> None:
    """Write a plan with the fingerprint of what it was made from, for `reconciler apply FILE` (mode 0600)."""
    import os
    import time

    from reconciler.fingerprint import PLAN_FORMAT, Fingerprint, observed_parts

    data = {
        "format": PLAN_FORMAT,
        "host": p.host,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": Fingerprint(files, observed_parts(observed)).to_json(),
        "plan": p.to_json(),
    }
    from reconciler.redact import redact_data

    data = redact_data(data)  # reasons quote command lines
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ReconcilerError(f"cannot write the plan to {path}: {exc.strerror or exc}") from None
    print(f"plan saved to {path}; apply exactly it with `reconciler apply {path}`", file=sys.stderr)


def cmd_status(args: argparse.Namespace) -> int:
    from reconciler.render import Style, render_status, status_data

    desired, observed, p = _observe_and_plan(args.root)
    data = status_data(desired, observed, p)
    if args.json:
        emit_json(data)
    else:
        print(render_status(data, Style()))
    # Like `shm status`: a source the answer needs was down, so part of it is unknown.
    if observed.unavailable():
        for s in observed.unavailable():
            print(f"error: {s.name} source unavailable: {s.detail}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: the value given before the command name stays unless repeated after it.
    common.add_argument("--root", default=argparse.SUPPRESS, help="directory holding configs/ and manifests/")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")

    parser = argparse.ArgumentParser(
        prog="reconciler",
        description="Make a GPU serving host match its manifest: recipes on GPU slots, guarded offload shm.",
    )
    parser.add_argument("--root", default=None, help="directory holding configs/ and manifests/ (default: $RECONCILER_ROOT or .)")
    parser.add_argument("--json", action="store_true", default=False, help="machine-readable output")
    parser.add_argument("--version", action="version", version=f"reconciler {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("validate", parents=[common], help="check host, recipes and manifests (0 valid, 1 invalid)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser(
        "plan", parents=[common], help="dry run: what would change and why (0 none, 2 pending, 3 blocked, 1 error)"
    )
    p.add_argument("--out", metavar="FILE", help="also save the plan, with a fingerprint of what it was made from, "
                   "for `reconciler apply FILE`")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("status", parents=[common], help="what is on each GPU slot, containers, shm, converged or not")
    p.set_defaults(func=cmd_status)

    # Late imports: these modules import this one for its exit codes and JSON writer.
    from reconciler.cli_apply import add_commands as add_apply
    from reconciler.cli_shm import add_commands as add_shm

    add_apply(sub, parents=[common])
    add_shm(sub, parents=[common])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.root is None:
        args.root = default_root()
    try:
        return int(args.func(args))
    except ConfigError as exc:
        return report_config_error(exc, args)
    except ReconcilerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
