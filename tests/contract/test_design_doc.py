"""docs/design.md is the one design in the tree, and every citation of it names something that is there.

A citation is ``docs/design.md`` followed by a quoted section title (``docs/design.md, "JSON output"``) or by
safety rule numbers (``docs/design.md, safety rule 10``, ``safety rules 4 and 5``, ``safety rules 1-3 of
docs/design.md``). Nothing in the repository points at a design document outside it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"


def tracked_text() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for name in names:
        path = REPO / name
        if (
            name in ("docs/design.md", "tests/contract/test_design_doc.py")
            or not path.is_file()
            or path.suffix in (".png", ".json")
        ):
            continue
        try:
            out[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def sections_and_rules() -> tuple[set[str], int]:
    text = DESIGN.read_text(encoding="utf-8")
    titles = {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.M)}
    rules_part = text.split("## Safety rules", 1)[1].split("\n## ", 1)[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. ", rules_part, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)), f"safety rules numbered 1..n in order: {numbers}"
    return titles, len(numbers)


def test_nothing_points_at_a_design_outside_the_repository() -> None:
    outside = [name for name, text in tracked_text().items() if re.search(r"\bDESIGN\.md\b", text)]
    assert outside == [], f"these cite DESIGN.md, which is not in the repository: {outside}"


def test_every_citation_names_a_section_or_rule_that_exists() -> None:
    titles, rules = sections_and_rules()
    assert rules >= 13 and {"The command line", "JSON output", "Safety rules", "Metrics"} <= titles
    cited = 0
    for name, text in tracked_text().items():
        flat = re.sub(r"\s+", " ", text.replace("#", " "))
        for m in re.finditer(r"docs/design\.md", flat):
            cited += 1
            around = flat[max(0, m.start() - 40) : m.end() + 60]
            title = re.match(r',? "([^"]+)"', flat[m.end() :])
            if title:
                assert title.group(1) in titles, f"{name}: cites section {title.group(1)!r}, not in docs/design.md"
            for first, last in re.findall(r"safety rules? (\d+)(?:(?:-| and | to )(\d+))?", around):
                for n in (first, last):
                    assert not n or 1 <= int(n) <= rules, f"{name}: cites safety rule {n}; docs/design.md has {rules}"
    assert cited >= 15, f"only {cited} citations of docs/design.md found"
