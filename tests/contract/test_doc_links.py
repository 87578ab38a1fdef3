"""Every link between the pages resolves: each relative link and anchor of README.md and of every page under docs/
names a file of the repository (never one outside it) and, with ``#anchor``, a heading of that page, as GitHub
makes anchors of headings. Every page of the manual is reached from its index, docs/README.md."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# [text](target) and ![alt](target), not inside code; a target ends at its first space (a title may follow).
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The page without its fenced blocks and inline code, where a bracket is code, not a link."""
    out, fence = [], ""
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m and (not fence or m.group(1).startswith(fence)):
            fence = "" if fence else m.group(1)
            out.append("")
            continue
        out.append("" if fence else re.sub(r"`[^`]*`", "``", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchor of every heading of ``page`` (outside its fenced blocks), a repeated one numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    fence = ""
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m and (not fence or m.group(1).startswith(fence)):
            fence = "" if fence else m.group(1)
            continue
        if fence:
            continue
        h = re.match(r"^#{1,6} (.+?)\s*$", line)
        if h:
            base = slug(h.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    text = prose(page.read_text(encoding="utf-8"))
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in LINK.finditer(text)]


def test_the_slugs_are_githubs() -> None:
    assert slug("Named topologies and `reconciler switch`") == "named-topologies-and-reconciler-switch"
    assert slug("A lane switch you can trust: probes, drain, fallback") == (
        "a-lane-switch-you-can-trust-probes-drain-fallback"
    )
    assert slug("Free VRAM per card: `gpu_reserve`") == "free-vram-per-card-gpu_reserve"


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    checked = 0
    for page in PAGES:
        for line, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a page of this repository
                continue
            checked += 1
            where = f"{page.relative_to(REPO)}:{line}: {target}"
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / unquote(path_part)).resolve() if path_part else page
            if not dest.is_relative_to(REPO):
                broken.append(f"{where}: points outside the repository")
                continue
            if not dest.exists():
                broken.append(f"{where}: no such file")
                continue
            if anchor:
                if dest.suffix != ".md":
                    broken.append(f"{where}: an anchor into a file that is not a page")
                elif anchor not in anchors(dest):
                    broken.append(f"{where}: {dest.relative_to(REPO)} has no heading with the anchor #{anchor}")
    assert checked >= 80, f"only {checked} relative links found: is the link pattern still right?"
    assert not broken, "\n".join(broken)


def test_every_page_of_the_manual_is_reached_from_its_index() -> None:
    index = REPO / "docs" / "README.md"
    reached = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index) if not t.startswith("#")}
    pages = {p.resolve() for p in PAGES if p.parent != REPO and p != index}
    assert not pages - reached, f"not linked from docs/README.md: {sorted(str(p) for p in pages - reached)}"


def test_the_readme_is_short_and_keeps_its_two_commands_first() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250, "the README is at most 250 lines: the rest belongs in docs/"
    first = re.search(r"```text\n(.*?)```", text, re.S)
    assert first and [ln.split()[:2] for ln in first.group(1).splitlines()] == [["make", "demo"], ["make", "test"]]
    assert "(docs/README.md)" in text
