"""Explicit inputs instead of reaching back (docs/design.md, "The service layer and its front-ends"): a module is
handed what it uses and writes only its own objects' private fields, and the service's calls are made by modules
that take the call's context, never the service itself.
"""

from __future__ import annotations

import ast

from contract.test_layers import PKG, _imports, _module


def _private_writes(source: str, name: str) -> list[str]:
    """Each assignment in ``source`` (the module ``name``) to a ``_private`` field of an object other than ``self``
    or ``cls``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for x in ast.walk(target):
                if (
                    isinstance(x, ast.Attribute)
                    and isinstance(x.ctx, ast.Store)
                    and x.attr.startswith("_")
                    and not x.attr.startswith("__")
                    and not (isinstance(x.value, ast.Name) and x.value.id in ("self", "cls"))
                ):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_no_module_writes_a_private_field_of_another_object() -> None:
    """A call's module that sets ``service._host_name`` for the service's next call to find is an input passed
    backwards: what a call needs is handed to it, and what it learns it returns."""
    writes = [
        w for p in sorted(PKG.rglob("*.py")) for w in _private_writes(p.read_text(), str(p.relative_to(PKG.parent)))
    ]
    assert writes == [], "private fields of another object written:\n  " + "\n  ".join(writes)


def test_the_private_write_finder_sees_each_form() -> None:
    src = "def f(s, self):\n    s._a = 1\n    s.b._c += 1\n    x: int = 0\n    self._ok = s\n    s.public = 1\n"
    assert _private_writes(src, "m.py") == ["m.py:2: s._a", "m.py:3: s.b._c"]


def test_no_call_of_the_service_imports_the_service() -> None:
    """Only the package's facade imports ``host_service``; the modules that make its calls take a ``CallContext``
    (``reconciler.service.context``) or the part of it they use, even for type checkers."""
    back = [
        f"{_module(p)}:{line}"
        for p in sorted((PKG / "service").glob("*.py"))
        for imp, line, _inner in _imports(p)
        if imp == "reconciler.service.host_service" and _module(p) != "reconciler.service"
    ]
    assert back == [], f"modules of the service that import the service back: {back}"
