"""Import contract: the model and planner are pure. They import no Docker, NVML, metrics or file-watching code,
directly or through anything they import."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("docker", "pynvml", "prometheus_client", "watchdog", "requests", "urllib3")


def test_model_and_planner_import_nothing_that_talks_to_the_world() -> None:
    code = (
        "import sys\n"
        "import reconciler.model, reconciler.plan.planner, reconciler.plan.observed\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"pure layers pulled in: {out}"


FRONT_ENDS = (
    "reconciler.cli",
    "reconciler.cli.apply",
    "reconciler.cli.shm",
    "reconciler.cli.tools",
    "reconciler.cli.run",
    "reconciler.cli.front_ends",
    "reconciler.control.client",
    "reconciler.control.server",
    "reconciler.api",
    "reconciler.mcp_server",
)


def test_front_ends_stand_on_the_service_never_on_each_other() -> None:
    """Each front-end (the command line's modules, the HTTP API, the MCP server) imports the service layer and
    the core, never another front-end; and nothing in the core imports a front-end. Checked on the source: the
    import statements of every module of the package."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "reconciler"
    found: dict[str, set[str]] = {}
    for path in pkg.rglob("*.py"):
        mod = "reconciler." + ".".join(path.relative_to(pkg).with_suffix("").parts)
        mod = mod.removesuffix(".__init__")
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[mod] = names
    # The allowed edges: the parser (reconciler.cli) registers the other command-line modules' commands, and hands a
    # command the running loop answers to the client of its socket; `mcp`'s handler serves the MCP server on stdio;
    # `run`'s builds the loop with the front-ends it hosts (reconciler.cli.front_ends, the one place that wires the
    # loop to its servers).
    allowed = {
        ("reconciler.cli", "reconciler.cli.apply"),
        ("reconciler.cli", "reconciler.cli.run"),
        ("reconciler.cli", "reconciler.cli.shm"),
        ("reconciler.cli", "reconciler.cli.tools"),
        ("reconciler.cli.commands.mcp", "reconciler.mcp_server"),
        ("reconciler.__main__", "reconciler.cli"),
        ("reconciler.cli", "reconciler.control.client"),
        ("reconciler.cli.commands.run", "reconciler.cli.front_ends"),
        ("reconciler.cli.front_ends", "reconciler.api"),
        ("reconciler.cli.front_ends", "reconciler.control.server"),
    }
    bad = sorted(
        (mod, imp)
        for mod, imports in found.items()
        for imp in imports
        if imp in FRONT_ENDS
        and imp != mod
        and (mod, imp) not in allowed
        and not (mod == "reconciler.api" and imp == "reconciler.mcp_server")  # the API mounts the MCP app at /mcp
    )
    assert bad == [], f"front-ends leaning on each other or the core importing a front-end: {bad}"
    assert "reconciler.service" in found
