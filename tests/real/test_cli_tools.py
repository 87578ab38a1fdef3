"""``reconciler --version`` from the one place it is written, and shell completion generated from the parser.

bash's completion is run for real (the generated function, called as bash calls it on a Tab); zsh's is checked
to name every command and option of the parser, and with ``zsh -n`` where zsh is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import reconciler
from reconciler.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def test_the_version_is_written_once_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert metadata.version("reconciler") == reconciler.__version__
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"reconciler {reconciler.__version__}\n"


def completion(shell: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "reconciler", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout


def _bash_complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers on a Tab after ``words`` (the last one being completed), through the generated function."""
    line = " ".join(words)
    quoted = " ".join(f"'{w}'" for w in words)
    cmd = (
        f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
        f"COMP_LINE='{line}'; COMP_POINT={len(line)}; "
        "$(complete -p reconciler | sed -E 's/.*-F ([^ ]+).*/\\1/') reconciler; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    out = subprocess.run(["bash", "--norc", "-c", cmd], capture_output=True, text=True, timeout=60, check=True)
    return [w.strip() for w in out.stdout.splitlines() if w.strip()]


def test_bash_completes_commands_subcommands_and_options(tmp_path: Path) -> None:
    script = tmp_path / "reconciler.bash"
    script.write_text(completion("bash"))
    assert _bash_complete(script, ["reconciler", "sh"]) == ["shm"]
    assert set(_bash_complete(script, ["reconciler", "s"])) == {
        "shm",
        "status",
        "schema",
        "switch",
        "sync",
        "systemd-unit",
    }
    assert _bash_complete(script, ["reconciler", "shm", "re"]) == ["reclaim"]
    assert "--out" in _bash_complete(script, ["reconciler", "plan", "--o"])
    assert set(_bash_complete(script, ["reconciler", "schema", ""])) == {"host", "recipe", "manifest"}
    assert set(_bash_complete(script, ["reconciler", "completion", ""])) == {"bash", "zsh"}


def _names(parser: argparse.ArgumentParser) -> set[str]:
    """Every command, subcommand and long option the parser knows."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.add(name)
                found |= _names(sub)
    return found


def test_zsh_completion_names_every_command_and_option(tmp_path: Path) -> None:
    text = completion("zsh")
    assert text.startswith("#compdef reconciler")
    names = _names(build_parser())
    assert {"validate", "plan", "apply", "shm", "reclaim", "schema", "completion", "--root", "--json"} <= names
    missing = sorted(n for n in names if n not in text)
    assert not missing, f"not in the zsh completion: {missing}"
    if shutil.which("zsh"):
        script = tmp_path / "_reconciler"
        script.write_text(text)
        subprocess.run(["zsh", "-n", str(script)], check=True, timeout=60)
