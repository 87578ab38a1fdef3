"""The layer contract: each package of reconciler/ imports only its own package and the layers below it, counting
the imports inside functions too (docs/design.md, "Architecture").

  base < model < plan < store < host < observe < load < apply < loop < service < door < control < mcp_server < api < cli

Read from the source (every import statement of every module, at any depth), so an import a function makes on
first use counts as much as one at the top; and the graph of modules has no cycle. The second test keeps the reason
of every import that stays inside a function written beside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "reconciler"
LAYERS = (
    "base",
    "model",
    "plan",
    "store",
    "host",
    "observe",
    "load",
    "apply",
    "loop",
    "service",
    "door",
    "control",
    "mcp_server",
    "api",
    "cli",
)
# Anyone may import these: the package's version, and the entry point that only calls the command line.
ANYONE = {"reconciler", "reconciler.__main__"}
# Why an import may stay inside a function: the words its comment must hold (one of them).
REASONS = ("start-up", "startup", "optional", "sdk")


def _module(path: Path) -> str:
    mod = "reconciler." + ".".join(path.relative_to(PKG).with_suffix("").parts)
    return mod.removesuffix(".__init__")


def _typing_only(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports are read by type checkers only, never run."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path, *, runtime_only: bool = False) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of reconciler's own modules in ``path``;
    ``runtime_only`` leaves out those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, inner: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if runtime_only and _typing_only(child):
                continue
            deeper = inner or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module == "reconciler":
                    out.extend((f"reconciler.{a.name}", child.lineno, inner) for a in child.names)
                elif child.module.startswith("reconciler."):
                    out.append((child.module, child.lineno, inner))
            elif isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, inner) for a in child.names if a.name.startswith("reconciler"))
            visit(child, deeper)

    visit(tree, False)
    return out


def _layer(mod: str) -> int | None:
    parts = mod.split(".")
    if len(parts) < 2 or mod in ANYONE or parts[1] == "__version__":
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else -1


def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    return {_module(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_every_module_belongs_to_a_layer() -> None:
    strays = sorted(m for m in _graph() if _layer(m) == -1)
    assert strays == [], f"modules outside every layer of {LAYERS}: {strays}"


def test_no_layer_imports_one_above_it() -> None:
    up = []
    for mod, imports in _graph().items():
        here = _layer(mod)
        for imp, line, inner in imports:
            there = _layer(imp)
            if here is None or there is None or there <= here:
                continue
            up.append(f"{mod}:{line} imports {imp}{' (inside a function)' if inner else ''}")
    assert up == [], "imports of a layer above:\n  " + "\n  ".join(up)


def test_no_import_cycle_between_modules() -> None:
    """Counting every import that runs (at the top or in a function); an import for type checkers only is no
    edge: it never runs."""
    runtime = {_module(p): _imports(p, runtime_only=True) for p in sorted(PKG.rglob("*.py"))}
    graph = {m: {i for i, _, _ in imps if i != m} for m, imps in runtime.items()}
    # a package's module importing the package's own facade counts as importing that facade's module
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for mod in sorted(graph):
        if mod not in state:
            walk(mod, [mod])
    assert cycles == [], "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)


# The circles through imports for type checkers that are allowed while being taken apart, each by its modules: none
# is left. An entry that no longer closes a circle fails the test below too, so no new circle hides in its place.
TYPED_CYCLES_LEFT: tuple[frozenset[str], ...] = ()


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of ``graph`` of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, nexts = work[-1]
            nxt = next((n for n in nexts if n in graph and (n not in index or n in on_stack)), None)
            if nxt is not None:
                if nxt in index:
                    low[node] = min(low[node], index[nxt])
                else:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_cycle_between_modules_even_counting_imports_for_type_checkers() -> None:
    """An import under ``if TYPE_CHECKING:`` never runs, but it is a dependence all the same: a module that names its
    caller's type to be handed the caller whole reaches back into it. No circle of modules, type-only imports
    counted, beyond those on ``TYPED_CYCLES_LEFT``, each of which must still be one."""
    graph = {m: {i for i, _, _ in imps if i != m} for m, imps in _graph().items()}
    found = _circles(graph)
    new = [sorted(c) for c in found if c not in TYPED_CYCLES_LEFT]
    gone = [sorted(c) for c in TYPED_CYCLES_LEFT if c not in found]
    assert new == [], "import cycles, counting imports for type checkers:\n  " + "\n  ".join(
        " <-> ".join(c) for c in new
    )
    assert gone == [], "no longer a cycle: take it off TYPED_CYCLES_LEFT:\n  " + "\n  ".join(
        " <-> ".join(c) for c in gone
    )


def test_the_circle_finder_finds_each_circle_whole_and_no_other() -> None:
    graph = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "d": {"d2"}, "d2": {"d"}, "x": set(), "y": {"a"}}
    assert sorted(map(sorted, _circles(graph))) == [["a", "b", "c"], ["d", "d2"]]


def _explained(lines: list[str], i: int) -> bool:
    """The import on line ``i`` (0-based) has a reason: in a comment on its line, or above it, where the comment
    may head a block of imports (the lines between are imports too)."""
    if "#" in lines[i] and any(r in lines[i].split("#", 1)[1].lower() for r in REASONS):
        return True
    j = i - 1
    while j >= 0 and lines[j].strip().startswith(("from ", "import ")):
        j -= 1
    block = []  # the comment lines right above (a reason may take several)
    while j >= 0 and lines[j].strip().startswith("#"):
        block.append(lines[j].strip().lower())
        j -= 1
    return any(r in text for text in block for r in REASONS)


def test_an_import_inside_a_function_says_why() -> None:
    """An import left inside a function carries its reason in a comment on its line or the line above: the start-up
    budget of a command (``start-up``) or an SDK only some commands need (``optional``); never a cycle (an import
    placed in a function to hide one: the graph above counts it)."""
    unexplained = []
    for path in sorted(PKG.rglob("*.py")):
        lines = path.read_text().splitlines()
        for _imp, line, inner in _imports(path):
            if not inner:
                continue
            if not _explained(lines, line - 1):
                unexplained.append(f"{path.relative_to(PKG.parent)}:{line}: {lines[line - 1].strip()}")
    assert unexplained == [], (
        f"imports inside functions without a reason ({', '.join(REASONS)}) beside them:\n  " + "\n  ".join(unexplained)
    )


# Imports of the package left inside functions, across the package. The goal is 40, reached: what is left is a lazy
# door each (the loop's client before a command is parsed, the error classes and redaction's patterns for the few
# commands that print one, an SDK one command needs), the service's 13 and observe()'s 8 among them, which are being
# reworked. An import that waits for its first use is mostly a module that should be split by who uses it (as each
# command's handler is its own module, imported when the command runs: reconciler/cli/commands/); lower this when
# the count falls, never raise it.
MAX_INNER_IMPORTS = 40


def test_imports_inside_functions_stay_under_their_ceiling() -> None:
    """Imports of the package inside functions number at most ``MAX_INNER_IMPORTS``; the goal is 40 (77 before the
    command line's handlers became modules of their own)."""
    inner = [
        f"{path.relative_to(PKG.parent)}:{line} {imp}"
        for path in sorted(PKG.rglob("*.py"))
        for imp, line, is_inner in _imports(path)
        if is_inner
    ]
    assert len(inner) <= MAX_INNER_IMPORTS, (
        f"{len(inner)} imports of the package inside functions, over the ceiling of {MAX_INNER_IMPORTS} (the goal is "
        "40): import at the top of a module that only its users load, or split the module by who uses it:\n  "
        + "\n  ".join(inner)
    )


MAX_LINES = 600  # a module past this holds more than one concern: split it by meaning (ruff's C901 bounds functions)


def test_no_module_is_over_600_lines() -> None:
    long = sorted(
        (n, str(p.relative_to(PKG.parent)))
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    )
    assert long == [], f"modules over {MAX_LINES} lines: {long}"


# The host's boundary (docs/design.md, "The host's boundary: one engine protocol"): the rest of the package speaks
# to an engine through its protocol; which implementation a URL reaches is chosen in one place (the observer's
# default engine), and the standard-library reader serves that and the machine's look for engines alone.
ENGINE = "reconciler.host.engine"
ENGINE_CHOOSERS = {
    f"{ENGINE}.docker": {"reconciler.observe.containers"},
    f"{ENGINE}.connect": {"reconciler.observe.containers"},
    f"{ENGINE}.podman": set(),
    f"{ENGINE}.http": {"reconciler.observe.machine"},
}


def test_outside_the_boundary_an_engine_is_reached_through_its_protocol() -> None:
    strays = []
    for mod, imports in _graph().items():
        if mod.startswith(ENGINE):
            continue
        for imp, line, _inner in imports:
            if imp.startswith(ENGINE) and imp != f"{ENGINE}.protocol" and mod not in ENGINE_CHOOSERS.get(imp, set()):
                strays.append(f"{mod}:{line} imports {imp}")
    assert strays == [], "an engine's implementation imported past the protocol:\n  " + "\n  ".join(strays)


def test_the_boundary_has_no_cycle_even_counting_imports_for_type_checkers() -> None:
    """Inside the host's boundary and out of it, an import for type checkers counts as an edge too: the package
    stands on what is below it and nothing of it needs what is above."""
    graph = {m: {i for i, _, _ in imps} for m, imps in _graph().items()}
    host = {m for m in graph if m.startswith("reconciler.host")}
    reach: set[str] = set()
    todo = [i for m in host for i in graph[m] if i not in host]
    while todo:
        nxt = todo.pop()
        if nxt in reach or nxt not in graph:
            continue
        reach.add(nxt)
        todo.extend(graph[nxt])
    assert not reach & host, f"the boundary reaches itself again through {sorted(reach - host)}"


def test_the_apply_layer_has_no_cycle_even_counting_imports_for_type_checkers() -> None:
    """The apply layer's steps stand on one context value, and the context on the host's seams: an import for type
    checkers counts as an edge too, so no module of the layer needs, even for its annotations, one that needs it."""
    graph = {m: {i for i, _, _ in imps if i != m} for m, imps in _graph().items() if m.startswith("reconciler.apply")}
    cycles = [sorted(c) for c in _circles(graph)]
    assert cycles == [], "import cycles in the apply layer:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)
