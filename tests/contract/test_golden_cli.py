"""The command line's text surface, held by golden files (tests/data/golden/help/, completion/, schemas/): the
``--help`` of every command and subcommand, found by walking the help itself from ``reconciler --help`` down, the
completion script of every shell ``reconciler completion`` offers, the names of the shipped alert rules (configs/prometheus/alerts.yml), and the published schemas, byte for byte what
``reconciler schema KIND`` prints, with their sha256.

Each is the real command run as a process (``python -m reconciler``) with COLUMNS=100 and NO_COLOR=1, so argparse
wraps the same way on every terminal. ``GOLDEN_UPDATE=1 pytest tests/contract`` records a change made on purpose.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from contract.golden import check, check_json, check_lines

REPO = Path(__file__).resolve().parent.parent.parent
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")},
    "COLUMNS": "100",
    "NO_COLOR": "1",
    "PYTHONPATH": str(REPO),
}


def reconciler(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stderr, f"reconciler {' '.join(args)} -> {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def subcommands(help_text: str) -> list[str]:
    """The subcommands a help lists: under 'positional arguments:', the names indented by four (argparse's layout of
    a subparsers action; a positional argument of the command itself is indented by two)."""
    section = help_text.split("\npositional arguments:\n", 1)
    if len(section) < 2:
        return []
    block = section[1].split("\n\n", 1)[0]
    return re.findall(r"^    ([a-z][a-z0-9-]*)(?: |$)", block, flags=re.M)


def walk(path: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    text = reconciler(*path, "--help")
    out = {path: text}
    for name in subcommands(text):
        out.update(walk((*path, name)))
    return out


def test_every_commands_help() -> None:
    helps = walk()
    commands = [" ".join(p) for p in helps]
    # The walk itself must have found the tree (a layout change of the help would otherwise hold nothing).
    assert "shm status" in commands and "completion" in commands, commands
    check_lines("help/COMMANDS", ["reconciler " + c if c else "reconciler" for c in commands])
    for path, text in helps.items():
        check(f"help/{'_'.join(('reconciler', *path))}.txt", text)


def test_every_shells_completion() -> None:
    usage = reconciler("completion", "--help").splitlines()[0]
    m = re.search(r"\{([a-z,]+)\}", usage)
    assert m, usage
    shells = m.group(1).split(",")
    check_lines("completion/SHELLS", shells)
    for shell in shells:
        # The script is shtab's rendering of the parser: a release of shtab that writes it otherwise changes it too.
        check(f"completion/{shell}", reconciler("completion", shell))


def test_the_published_schemas_are_what_schema_prints_byte_for_byte() -> None:
    usage = reconciler("schema", "--help").splitlines()[0]
    m = re.search(r"\{([a-z,]+)\}", usage)
    assert m, usage
    digests = {}
    for kind in m.group(1).split(","):
        published = REPO / "schemas" / f"{kind}.schema.json"
        printed = reconciler("schema", kind)
        assert printed.encode() == published.read_bytes(), (
            f"`reconciler schema {kind}` differs from {published.relative_to(REPO)}: run `make schemas`"
        )
        digests[f"schemas/{published.name}"] = hashlib.sha256(published.read_bytes()).hexdigest()
    assert set(digests) == {f"schemas/{p.name}" for p in (REPO / "schemas").glob("*.json")}, digests
    check_json("schemas/sha256.json", digests)


def test_alert_rule_names() -> None:
    rules = yaml.safe_load((REPO / "configs" / "prometheus" / "alerts.yml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(names) == len(set(names)), names
    check_lines("alerts.txt", names)
