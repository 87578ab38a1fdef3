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


# Bash's own completion machinery run on the script: the words it offers after a command line (COMP_WORDS as bash
# fills them, the last word the one being completed). What a user's Tab gives is the surface; shtab's rendering of
# it changes between its releases (1.7 quotes every word, 1.13 none) and is not.
_COMPLETE = r"""
source "$1"; shift
COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
_shtab_reconciler
printf '%s\n' "${COMPREPLY[@]}"
"""


def bash_offers(script: Path, *words: str) -> list[str]:
    """Run where the only file is plan.json, so an argument that completes file names offers that one."""
    here = script.parent / "cwd"
    here.mkdir(exist_ok=True)
    (here / "plan.json").touch()
    proc = subprocess.run(
        ["bash", "-c", _COMPLETE, "complete", str(script), "reconciler", *words],
        capture_output=True,
        text=True,
        cwd=here,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stderr, (words, proc.returncode, proc.stderr)
    return sorted(w for w in proc.stdout.splitlines() if w)


def options_of(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", help_text.split("\n", 1)[1]))


def test_every_shells_completion(tmp_path: Path) -> None:
    usage = reconciler("completion", "--help").splitlines()[0]
    m = re.search(r"\{([a-z,]+)\}", usage)
    assert m, usage
    shells = m.group(1).split(",")
    check_lines("completion/SHELLS", shells)
    helps = walk()
    scripts = {shell: reconciler("completion", shell) for shell in shells}

    # bash: what Tab offers after every command, for a word and for an option, held by a golden file.
    script = tmp_path / "reconciler.bash"
    script.write_text(scripts["bash"])
    offers = []
    for path in helps:
        for word in ("", "-"):
            line = " ".join((*path, word)) if path else word
            offers.append(f"reconciler {line!r}: {' '.join(bash_offers(script, *path, word))}")
    offers.append(f"reconciler run --log-format '': {' '.join(bash_offers(script, 'run', '--log-format', ''))}")
    assert any(o.startswith("reconciler 'shm ': reclaim status") for o in offers), offers
    check("completion/bash.txt", "".join(f"{o}\n" for o in offers))

    # Every shell's script names every command and every option the help lists (zsh's own completion system is not
    # run here: it needs an interactive zsh with compinit).
    for shell, text in scripts.items():
        for path, help_text in helps.items():
            for name in (*path[-1:], *sorted(options_of(help_text))):
                assert name in text, (
                    f"`reconciler completion {shell}` never names {name!r} (of reconciler {' '.join(path)})"
                )


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
    # Beside the operator's files, schemas/ publishes the records the tool writes (evidence.schema.json, written by
    # hand and held to the records by tests/unit/test_qualify_evidence.py).
    written = {"schemas/evidence.schema.json"}
    assert set(digests) == {f"schemas/{p.name}" for p in (REPO / "schemas").glob("*.json")} - written, digests
    check_json("schemas/sha256.json", digests)


def test_alert_rule_names() -> None:
    rules = yaml.safe_load((REPO / "configs" / "prometheus" / "alerts.yml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(names) == len(set(names)), names
    check_lines("alerts.txt", names)
