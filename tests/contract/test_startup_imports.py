"""The start-up budget as a contract (docs/performance.md): the modules ``reconciler --help`` loads are listed here,
so a module that starts importing something heavy at its top fails this test instead of a benchmark read months
later. tests/real/test_control.py holds the same for a command answered by the loop and for ``plan --json`` alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The command line as a whole process, listing the modules it loaded at its exit.
CLIENT = r"""
import json, os, runpy, sys
sys.argv = ["reconciler", *sys.argv[1:]]
try:
    runpy.run_module("reconciler", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    sys.stdout.flush()
    with open(os.environ["CLIENT_MODULES"], "w") as f:
        json.dump(sorted(sys.modules), f)
"""

# Every module of the package `--help` may load: the parser's, and what its commands' modules import at their top
# (each command's handler, under reconciler.cli.commands, is loaded only when that command runs).
HELP_MODULES = frozenset(
    {
        "reconciler",
        "reconciler.base",
        "reconciler.base.requests",
        "reconciler.base.terminal",
        "reconciler.base.units",
        "reconciler.cli",
        "reconciler.cli.apply",
        "reconciler.cli.common",
        "reconciler.cli.fleet",
        "reconciler.cli.install",
        "reconciler.cli.qualify",
        "reconciler.cli.run",
        "reconciler.cli.shm",
        "reconciler.cli.style",
        "reconciler.cli.tools",
        "reconciler.load",
        "reconciler.load.file_schema",
    }
)

# What no light command loads: each costs milliseconds to tens of milliseconds at every start.
HEAVY = (
    "importlib.resources",
    "importlib.metadata",
    "tempfile",
    "urllib.request",
    "http.client",
    "email",
    "ssl",
    "socket",
    "pydantic",
    "yaml",
    "tomllib",
    "jsonschema",
    "docker",
    "requests",
    "pynvml",
    "prometheus_client",
    "starlette",
    "uvicorn",
    "mcp",
)


def loaded(tmp_path: Path, *args: str) -> list[str]:
    out = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", CLIENT, *args],
        env={"CLIENT_MODULES": str(out), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=False,
        timeout=60,
    )
    return json.loads(out.read_text())


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_help_loads_only_the_listed_modules_of_the_package_and_nothing_heavy(tmp_path: Path) -> None:
    modules = loaded(tmp_path, "--help")
    ours = {m for m in modules if m == "reconciler" or m.startswith("reconciler.")}
    assert ours == HELP_MODULES, (
        f"--help loads {sorted(ours - HELP_MODULES)} beyond the list and no longer {sorted(HELP_MODULES - ours)}: "
        "import it where it is used (a function), or add it here with the start-up it costs measured "
        "(tests/bench/bench_commands.py)"
    )
    assert not heavy(modules), heavy(modules)
    third_party = {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"reconciler", "__main__"}
    # setuptools' hooks in a venv (its .pth's, and an editable install's finder), and the interpreter's own site
    # hook (Debian's python3 ships a sitecustomize), not ours
    site_hooks = {"_distutils_hack", "sitecustomize", "usercustomize"}
    assert {m for m in third_party if not m.startswith("__editable__")} <= site_hooks, third_party


def test_every_subcommands_help_loads_nothing_heavy(tmp_path: Path) -> None:
    for args in (("plan", "--help"), ("apply", "--help"), ("shm", "status", "--help"), ("run", "--help")):
        assert not heavy(loaded(tmp_path, *args)), args


def test_every_commands_handler_is_found_and_none_is_loaded_by_the_parser() -> None:
    """Each command names its handler (``reconciler.cli.common.Command``) by module and function, imported when it
    runs: every one named resolves to a function, and building the parser loaded none of their modules."""
    import argparse

    from reconciler.cli import build_parser
    from reconciler.cli.common import Command

    before = set(sys.modules)
    parser = build_parser()
    named: list[Command] = []

    def walk(p: argparse.ArgumentParser) -> None:
        func = p.get_default("func")
        if isinstance(func, Command):
            named.append(func)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in dict.fromkeys(action.choices.values()):
                    walk(sub)

    walk(parser)
    loaded = {m for m in set(sys.modules) - before if m.startswith("reconciler.cli.commands")}
    assert not loaded, loaded
    assert len(named) >= 20, named
    for command in named:
        assert callable(command.handler()), command
