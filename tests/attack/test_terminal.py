"""Escape sequences never reach root's terminal: hostile offload file names on a real tmpfs (ESC sequences that
retitle the window or clear the screen, a C1 CSI U+009B, DEL, a carriage return) and a container whose last log line
carries escapes, printed by whole ``reconciler`` processes: ``shm status``, the dry run of ``shm reclaim``,
``plan``, ``status`` and ``apply``. No raw control character but newline and tab in any stdout or stderr; each is
shown escaped (``\\x1b``, ``\\u009b``); the JSON output still holds the names as they are; and on a terminal (a real
pty) the tool's own colours are still written while the names' escapes are not.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time

import pytest
from e2e_helpers import LoopProcess, Root, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.root]

# Every character the boundary must escape; newline and tab are the only ones allowed raw.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
NAMES = (
    "vllm_offload_\x1b]0;owned\x07\x1b[2J.mmap",  # OSC retitle, then clear the screen
    "vllm_offload_\u009b31mred.mmap",  # C1 CSI: an ESC-[ of its own on some terminals
    "vllm_offload_del\x7f\rfake.mmap",  # DEL, and a carriage return to overwrite the line
)


def _no_raw(where: str, text: str) -> None:
    found = sorted({hex(ord(c)) for c in RAW.findall(text)})
    assert not found, f"{where}: raw control characters {found} in:\n{text!r}"[:3000]


def test_hostile_file_names_are_shown_escaped(root: Root) -> None:
    root.manifest()
    for name in NAMES:
        (root.shm / name).write_bytes(b"\0" * 4096)
    escaped = ("\\x1b]0;owned\\x07\\x1b[2J", "\\u009b31mred", "\\x7f\\rfake")
    for args in (("shm", "status"), ("plan",), ("status",)):
        r = root.cli(*args)
        assert "Traceback" not in r.stderr, r
        _no_raw(" ".join(args), r.stdout + r.stderr)
        if args[0] == "shm":
            assert all(e in r.stdout for e in escaped), r.stdout
    # The dry run's hint names the files to pass to --path, escaped too. A native-offload lane running anywhere on
    # the engine (another root's) refuses every reclaim: wait for it to go, then read the hint.
    deadline = time.monotonic() + 120
    while True:
        hint = root.cli("shm", "reclaim")
        _no_raw("shm reclaim", hint.stdout + hint.stderr)
        if "native offload" not in hint.stdout + hint.stderr or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert hint.rc == 0 and "--path" in hint.stdout and all(e in hint.stdout for e in escaped), hint
    # JSON is unchanged: the names as they are, escaped by JSON itself.
    data = root.cli("shm", "status", "--json")
    _no_raw("shm status --json", data.stdout)
    assert {os.path.basename(f["path"]) for f in data.data["files"]} == set(NAMES)


def test_a_container_log_line_with_escapes_is_shown_escaped(root: Root, start_loop) -> None:  # type: ignore[no-untyped-def]
    name = root.recipe("omni", start_timeout_s=8)
    data = root.recipe_data(name)
    data["container"]["command"] = [
        "sh",
        "-c",
        "printf 'ERROR: bad \\033]0;owned\\007\\033[2J\\302\\23331m gone\\010 over\\n'; exit 3",
    ]
    root.write_recipe(name, data)
    root.manifest((name, ["dark-compute-a"]))
    applied = root.cli("apply", "--yes")
    assert applied.rc == 1 and "ERROR: bad" in applied.stdout + applied.stderr, applied
    _no_raw("apply", applied.stdout + applied.stderr)
    lp: LoopProcess = start_loop()
    try:
        lp.wait("action", kind="enter", result="failed", timeout=90)
        # Once the loop has published its backoff, plan and status quote the failure as the last error.
        status = wait_until(
            lambda: (r := root.cli("status")) and "ERROR: bad" in r.stdout and r,
            timeout=30,
            what="status quoting the container's log line",
        )
        plan = root.cli("plan")
        assert "ERROR: bad" in plan.stdout + plan.stderr, plan
        for where, r in (("status", status), ("plan", plan)):
            _no_raw(where, r.stdout + r.stderr)
        assert "\\x1b]0;owned\\x07\\x1b[2J\\u009b31m gone\\x08 over" in status.stdout, status.stdout
        js = root.cli("status", "--json")
        # JSON is unchanged: the line as it was, escaped by JSON itself.
        _no_raw("status --json", js.stdout)
        assert "ERROR: bad \\u001b]0;owned\\u0007\\u001b[2J\\u009b31m gone\\b over" in js.stdout, js.stdout
    finally:
        lp.stop()


def test_on_a_terminal_the_tools_colours_stay_and_the_names_escapes_do_not(root: Root) -> None:
    root.manifest()
    for name in NAMES[:2]:
        (root.shm / name).write_bytes(b"\0" * 4096)
    env = {k: v for k, v in root.env.items() if k != "NO_COLOR"}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        root.cli_args("shm", "status"), stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the pty's other end closed: the command is done
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(leader)
    text = out.decode()
    # The state's colour: orphan, or blocked while some engine's native-offload container runs.
    assert "\x1b[1mSTATE\x1b[0m" in text and re.search("\x1b\\[3[13]m(orphan|blocked)\x1b\\[0m", text), repr(text)
    assert "\\x1b]0;owned\\x07\\x1b[2J" in text and "\\u009b31mred" in text, repr(text)
    # Only the tool's own colour codes are raw: with them taken out, nothing raw is left.
    _no_raw("shm status on a pty", re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\r\n", "\n"))


# A newline in a name would let it forge a line of the tool's own (FORGED at the start of a line); a quote would end
# the copy-paste command's quoting; an ESC sequence would drive the terminal.
FORGING = (
    "vllm_offload_a\nFORGED: removed 0 file(s)\x1b[2K.mmap",
    'vllm_offload_it\'s "quoted"\t$(touch pwned).mmap',
)


def _no_forged_line(where: str, text: str) -> None:
    _no_raw(where, text)
    forged = [line for line in text.splitlines() if line.lstrip().startswith("FORGED")]
    assert not forged, f"{where}: a file name's newline made a line of its own: {forged!r}\n{text}"[:3000]


def test_a_name_with_a_newline_or_a_quote_forges_no_line_in_any_text_output(root: Root, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every command that prints the tmpfs's files, in text: shm status, the dry run of shm reclaim (with the exact
    command it suggests), plan, status, apply and audit. A name's newline, tab, ESC and quotes are shown escaped;
    the suggested command, read by a shell, names exactly these files, and run, removes exactly them."""
    root.manifest()
    for name in FORGING:
        (root.shm / name).write_bytes(b"\0" * 4096)
    outputs = {" ".join(a): root.cli(*a) for a in (("shm", "status"), ("plan",), ("status",), ("audit",))}
    deadline = time.monotonic() + 120
    while True:
        hint = root.cli("shm", "reclaim")
        if "native offload" not in hint.stdout + hint.stderr or time.monotonic() > deadline:
            break
        time.sleep(2)
    outputs["shm reclaim"] = hint
    for where, r in outputs.items():
        assert "Traceback" not in r.stderr, r
        _no_forged_line(where, r.stdout + r.stderr)
    assert "\\nFORGED" in outputs["shm status"].stdout, outputs["shm status"].stdout
    (line,) = [x for x in hint.stdout.splitlines() if "reclaim --confirm" in x]
    command = line.split(": ", 1)[1]
    words = subprocess.run(
        ["bash", "-c", f"set -- {command.removeprefix('reconciler ')}; printf '%s\\0' \"$@\""],
        capture_output=True,
        check=True,
        timeout=30,
        cwd=tmp_path,
    ).stdout.split(b"\0")[:-1]
    paths = [w.decode() for w, flag in zip(words[1:], words, strict=False) if flag == b"--path"]
    assert sorted(paths) == sorted(str(root.shm / n) for n in FORGING), words
    assert not (tmp_path / "pwned").exists()
    done = root.cli("shm", "reclaim", *[a.decode() for a in words[2:]])
    _no_forged_line("shm reclaim --confirm", done.stdout + done.stderr)
    assert done.rc == 0 and not any((root.shm / n).exists() for n in FORGING), done
    applied = root.cli("apply", "--yes")
    _no_forged_line("apply", applied.stdout + applied.stderr)
