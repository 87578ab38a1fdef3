"""Each numbered safety rule of docs/design.md is guarded by at least one test that names it: by the marker
``@pytest.mark.safety_rule(N)``, or by citing "safety rule N" in its docstring or its module's. Read from the source of tests/, so
a rule added to the design without a guard fails here, and so does a rule whose last guard is removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DESIGN = TESTS.parent / "docs" / "design.md"


def rules() -> dict[int, str]:
    text = DESIGN.read_text()
    section = text.split("## Safety rules", 1)[1].split("\n## ", 1)[0]
    return {int(n): title for n, title in re.findall(r"^(\d+)\. \*\*(.+?)\*\*", section, re.M)}


def guards() -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        tree = ast.parse(path.read_text(), str(path))
        # a module whose docstring names a rule guards it with all its tests
        for n in re.findall(r"safety rules? (\d+)", ast.get_docstring(tree) or "", re.I):
            found.setdefault(int(n), set()).add(str(path.relative_to(TESTS)))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith("test_"):
                continue
            name = f"{path.relative_to(TESTS)}::{node.name}"
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr == "safety_rule"
                ):
                    for arg in deco.args:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
                            found.setdefault(arg.value, set()).add(name)
            doc = ast.get_docstring(node) or ""
            for n in re.findall(r"safety rules? (\d+)", doc, re.I):
                found.setdefault(int(n), set()).add(name)
    return found


def test_the_design_numbers_its_rules() -> None:
    assert sorted(rules()) == list(range(1, len(rules()) + 1)) and len(rules()) >= 13, rules()


def test_every_safety_rule_has_a_test_that_guards_it() -> None:
    have = guards()
    missing = {n: title for n, title in rules().items() if not have.get(n)}
    assert missing == {}, f"safety rules no test names (mark one @pytest.mark.safety_rule(N)): {missing}"
    unknown = sorted(set(have) - set(rules()))
    assert unknown == [], f"tests name rules the design does not have: {unknown} ({[sorted(have[n]) for n in unknown]})"
