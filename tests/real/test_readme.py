"""The docs run: every command example in README.md and in every page under docs/ (the tutorial, the how-to guides,
the reference) is executed, as typed and in the order the page shows them, and its output compared with what the page
shows, so a changed flag, port, message or JSON key fails here instead of failing the reader. Each page is a test of
its own (README.md first, then docs/ in path order).

How a page is read (the page itself says so where a reader can see it):

- A fenced block whose lines start with ``$ `` is a session. Every ``$`` line of a page is run by bash in the order
  of the page, all of them in ONE shell (a variable set, a directory entered or a process started in the background
  by one command is there for every later one), from a copy of this checkout's ``configs/``, ``manifests/`` and
  ``examples/``, with the PATH a root shell has: ``reconciler`` must be the set-up's link in /usr/local/bin. There is
  no hidden set-up: what a session needs, the page types before it. The lines below a command are its output (stdout
  and stderr as a terminal shows them). A trailing ``# exit N`` on a command is checked too.
- Each page starts on the host as ``make demo`` leaves it: the demo's tmpfs mounted, omni running on
  ``dark-compute-b`` (the demo's root applied again before each page, so one page's end is never another's start).
- A ``python`` block preceded by ``<!-- example file: NAME -->`` is a file the page tells the reader to save as NAME;
  it is written there before the next session runs. No other HTML comment may steer an example.
- A block that is deliberately not run says so on its first line: ``# not run by the README's test: WHY``.

Compared with placeholders: times, durations, ids (12, 32 and 64 hex digits), pids and temporary paths are
replaced on both sides before the comparison, runs of spaces are one, and a line ``…`` alone stands for any lines.
The examples run against the real demo host (``host: demo``, the real engine, the demo's tmpfs, the default state
and lock directories, the default port 9464); the last test tears the demo down with ``examples/demo/run.sh
--teardown`` and checks that nothing of it is left.

``README_RECORD=FILE`` writes what every command printed to FILE (the page's order, each output under its command),
for updating the page after a deliberate change of output.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
NOT_RUN = "# not run by the README's test:"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEMO_SHM = "/run/reconciler-demo/shm"


# ---------------------------------------------------------------- reading the pages


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: list[str]
    comment: list[str] = field(default_factory=list)  # the lines of a preceding <!-- example ... --> comment

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def is_session(self) -> bool:
        return any(ln.startswith("$ ") for ln in self.body) or self.lang in ("sh", "shell", "console", "bash")

    @property
    def not_run(self) -> str | None:
        first = self.body[0] if self.body else ""
        return first[len(NOT_RUN) :].strip() if first.startswith(NOT_RUN) else None

    @property
    def file_name(self) -> str | None:
        m = re.match(r"<!-- example file: (\S+) -->", " ".join(self.comment))
        return m.group(1) if m else None


def read_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(`{3,})(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != fence:
            j += 1
        comment: list[str] = []
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and lines[k].rstrip().endswith("-->"):
            end = k
            while k >= 0 and "<!--" not in lines[k]:
                k -= 1
            if k >= 0 and lines[k].lstrip().startswith("<!-- example"):
                comment = lines[k : end + 1]
        blocks.append(Block(page, start + 1, lang, lines[start + 1 : j], comment))
        i = j + 1
    return blocks


BLOCKS = [b for p in PAGES for b in read_blocks(p)]
SESSIONS = [b for b in BLOCKS if b.is_session and b.not_run is None]


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """Each ``$`` command of a session with the lines shown below it."""
    out: list[tuple[str, list[str]]] = []
    for ln in block.body:
        if ln.startswith("$ "):
            out.append((ln[2:], []))
        elif out:
            out[-1][1].append(ln)
    return out


# ---------------------------------------------------------------- comparing


_PLACEHOLDERS = [
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)?"), "<TIME>"),
    (re.compile(r"\b[0-9a-f]{64}\b|\b[0-9a-f]{32}\b|\b[0-9a-f]{12}\b"), "<ID>"),
    (re.compile(r"/tmp/[\w.-]+"), "<TMP>"),
    (re.compile(r"\bpid \d+"), "pid <PID>"),
    (re.compile(r"\b\d+ (map|fd)\b"), r"<PID> \1"),
    (re.compile(r"~?\b\d+(\.\d+)? ?s\b"), "<SECONDS>"),
    (re.compile(r"\b\d+(\.\d+)?\s+(?=<SECONDS>)"), ""),  # a probe's seconds column beside its own figure
]


def normalize(lines: list[str]) -> list[str]:
    out = []
    for ln in lines:
        # On some machines even root cannot read pid 1's /proc entries (the demo excuses it): machine, not tool.
        if ln.startswith("uninspectable pid 1 "):
            continue
        for rx, rep in _PLACEHOLDERS:
            ln = rx.sub(rep, ln)
        indent = len(ln) - len(ln.lstrip(" "))
        out.append(ln[:indent] + re.sub(r" {2,}", "  ", ln[indent:].rstrip()))
    while out and not out[-1]:
        out.pop()
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """``expected`` equals ``actual``, where a line ``…`` alone stands for any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "…":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


# ---------------------------------------------------------------- the environment


def outer_container(docker_api) -> str | None:  # type: ignore[no-untyped-def]
    """The container this test itself runs in, shortened, where the engine does not list it (Docker in Docker, a CI
    job's container); None on a host. The demo's holder processes run in it too, and the tool rightly names it."""
    from reconciler.observe.procfs import container_candidates_of_pid, innermost_known

    candidates = container_candidates_of_pid(os.getpid())
    if not candidates:
        return None
    known = {c["Id"] for c in docker_api.containers(all=True)}
    return None if innermost_known(candidates, known) else candidates[0][:12]


def as_on_a_host(expected: list[str], actual: list[str], outer: str | None) -> list[str]:
    """``actual`` as a host shows it, where the examples run inside a container the engine does not list (``outer``):
    a holder there is shown "in a container unknown to this engine: ID", which the page (written on a host) does not
    show. Only that one container is taken out, and only when the tool names it: where the page shows a holder and
    the output does not name ``outer``, a line saying so is added, and the comparison fails."""
    if outer is None:
        return actual
    from reconciler.observe.shm import UNKNOWN_CONTAINER

    marker = UNKNOWN_CONTAINER + outer
    holders = [ln for ln in expected if re.search(r"\b\d+ (map|fd)\b|by pid \d+", ln)]
    if holders and not any(marker in ln for ln in actual):
        return [*actual, f"(run inside {outer}, a container unknown to the engine, and no holder was named so)"]
    return [ln.replace(f" ({marker})", "").replace(f" in {marker}", "") for ln in actual]


class Tour:
    """The copy of the checkout the examples run in."""

    def __init__(self, base: Path):
        self.cwd = base / "checkout"
        self.cwd.mkdir()
        for part in ("configs", "manifests", "examples"):
            # Links into the package (the alert rules, the unit) are copied as the files they name: the copy has no
            # reconciler/ for them to point into.
            shutil.copytree(REPO / part, self.cwd / part, symlinks=False)
        (self.cwd / ".venv").symlink_to(REPO / ".venv")
        self.out = base / "out"
        self.outer: str | None = None  # the container the examples run in, unknown to the engine (outer_container)
        self.env = {
            "PATH": ROOT_PATH,
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "COLUMNS": "200",
            # Python's stdout unbuffered, so stdout and stderr interleave as on a terminal.
            "PYTHONUNBUFFERED": "1",
        }
        # PYTHONPATH: a worktree run with another checkout's .venv (the demo's script and `reconciler` take it).
        for k in ("RECONCILER_TEST_DOCKER_URL", "DOCKER_HOST", "PYTHONPATH", "PYTHON"):
            if k in os.environ:
                self.env[k] = os.environ[k]

    def shell(self, script: str, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``script`` in bash, in its own process group: whatever it left running in the background (a loop, a
        holder of an offload file, a client) is ended with it."""
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _mounted(path: str) -> bool:
    return subprocess.run(["mountpoint", "-q", path], check=False).returncode == 0


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory, docker_api, image: str) -> Iterator[Tour]:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.fail("the README's examples run as root, as the README says (tmpfs, every /proc/PID, the engine)")
    assert shutil.which("reconciler", path=ROOT_PATH), "no `reconciler` on the PATH: run `make setup`"
    t = Tour(tmp_path_factory.mktemp("readme"))
    t.outer = outer_container(docker_api)
    # The host as `make demo` leaves it: anything of the demo host from before torn down, then its tmpfs mounted and
    # the split topology converged (omni on dark-compute-b), as the demo's last step leaves them.
    down = t.shell("bash examples/demo/run.sh --teardown")
    assert down.returncode == 0, down.stdout + down.stderr
    os.makedirs(DEMO_SHM, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", DEMO_SHM], check=True)
    up = t.shell("reconciler --root examples/demo apply --yes")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield t
    finally:
        # Nothing of the demo stays on the machine, whichever tests ran (the last test checks this same teardown).
        t.shell("bash examples/demo/run.sh --teardown")


# ---------------------------------------------------------------- the tests


def test_every_command_example_is_run_or_says_why_not() -> None:
    sessions = [b for b in BLOCKS if b.is_session]
    assert len(SESSIONS) >= 8, [b.where for b in SESSIONS]
    # Pages in docs/'s folders are run too: the tutorial's and the how-to guides' examples.
    run = {b.page.relative_to(REPO).as_posix() for b in SESSIONS}
    assert {"README.md", "docs/tutorial.md", "docs/how-to/switch.md", "docs/how-to/api.md"} <= run, sorted(run)
    for b in sessions:
        if b.not_run is not None:
            assert len(b.not_run) > 10, f"{b.where}: say why it is not run"
    for b in BLOCKS:
        if b.file_name:
            assert b.lang == "python", f"{b.where}: an example file is a python block"


def test_inside_a_container_unknown_to_the_engine_only_that_container_is_taken_as_a_host() -> None:
    from reconciler.observe.shm import UNKNOWN_CONTAINER

    page = [
        "owned  8.00 MiB  8.00 MiB  22053 map+fd  /run/x/vllm_offload_live.mmap",
        "kept:",
        "  f: mapped by pid 22053",
    ]
    inside = [
        f"owned  8.00 MiB  8.00 MiB  22053 map+fd ({UNKNOWN_CONTAINER}0123456789ab)  /run/x/vllm_offload_live.mmap",
        "kept:",
        f"  f: mapped by pid 22053 in {UNKNOWN_CONTAINER}0123456789ab",
    ]
    assert matches(normalize(page), normalize(as_on_a_host(page, inside, "0123456789ab")))
    # On a host nothing is taken out; another container than the one the test runs in still differs.
    assert not matches(normalize(page), normalize(as_on_a_host(page, inside, None)))
    assert not matches(normalize(page), normalize(as_on_a_host(page, inside, "ba9876543210")))
    # Run inside a container, the tool must name it: a holder shown with no container at all is a difference too.
    assert not matches(normalize(page), normalize(as_on_a_host(page, page, "0123456789ab")))


def test_no_example_has_hidden_set_up() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"<!--\s*example(.*?)-->", text, flags=re.S):
            assert re.fullmatch(r"\s*file: \S+\s*", m.group(1)), (
                f"{page.name}:{text[: m.start()].count(chr(10)) + 1}: an example comment other than `file: NAME` "
                "hides set-up from the reader; type it in the session instead"
            )


@pytest.mark.docker
@pytest.mark.root
@pytest.mark.parametrize(
    "page", [p for p in PAGES if any(b.page == p for b in SESSIONS)], ids=lambda p: str(p.relative_to(REPO))
)
def test_the_examples_typed_in_order_print_what_the_page_shows(page: Path, tour: Tour) -> None:
    # A second try of the whole page, which ends as it starts (the split topology converged, the tmpfs empty, no
    # loop): while the page's loop runs, any engine event wakes it, and a pass of its own may reclaim the orphan an
    # example made for a front-end to reclaim. Drift fails both tries.
    try:
        _run_page(page, tour)
    except AssertionError:
        _run_page(page, tour)


def _as_make_demo_left_it(tour: Tour) -> None:
    """The demo's split topology converged and its tmpfs mounted, whatever the page before left."""
    if not _mounted(DEMO_SHM):
        os.makedirs(DEMO_SHM, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", DEMO_SHM], check=True)
    up = tour.shell("reconciler --root examples/demo apply --yes")
    assert up.returncode == 0, up.stdout + up.stderr


def _run_page(page: Path, tour: Tour) -> None:
    blocks = [b for b in BLOCKS if b.page == page and (b in SESSIONS or b.file_name)]
    _as_make_demo_left_it(tour)
    shutil.rmtree(tour.out, ignore_errors=True)
    tour.out.mkdir()
    script = ["set +e"]
    shown: list[tuple[Block, str, list[str]]] = []
    for b in blocks:
        if b.file_name:
            # the file the page tells the reader to save, written where the next session expects it
            (tour.cwd / b.file_name).write_text("\n".join(b.body) + "\n")
            continue
        cmds = commands(b)
        assert cmds, f"{b.where}: a session without a `$ ` command"
        for cmd, lines in cmds:
            n = len(shown)
            shown.append((b, cmd, lines))
            script += [f"{{ {cmd}\n}} >{tour.out}/{n}.out 2>&1 </dev/null", f"echo $? >{tour.out}/{n}.rc"]
    ran = tour.shell("\n".join(script), timeout=1500)
    record = os.environ.get("README_RECORD")
    failures: list[str] = []
    recorded: list[str] = []
    for n, (b, cmd, lines) in enumerate(shown):
        out_file, rc_file = tour.out / f"{n}.out", tour.out / f"{n}.rc"
        if not rc_file.exists():
            failures.append(f"{b.where}: `{cmd}` never ran (the shell ended before it: exit {ran.returncode})")
            break
        got = out_file.read_text(errors="replace").splitlines()
        rc = int(rc_file.read_text())
        recorded += [f"$ {cmd}", *got, f"[exit {rc}]"]
        m = re.search(r"#.*\bexit (\d+)", cmd)
        if m and rc != int(m.group(1)):
            failures.append(f"{b.where}: `{cmd}` exited {rc}, the page says {m.group(1)}\n" + "\n".join(got))
        want, have = normalize(lines), normalize(as_on_a_host(lines, got, tour.outer))
        if not matches(want, have):
            failures.append(
                f"{b.where}: `{cmd}` printed something else than the page shows (exit {rc}).\n"
                "--- the page (normalized)\n" + "\n".join(want) + "\n--- the command (normalized)\n" + "\n".join(have)
            )
    if record:
        Path(record).write_text("\n".join(recorded) + "\n")
    assert not failures, "\n\n".join(failures[:8]) + (
        f"\n\n... and {len(failures) - 8} more" if len(failures) > 8 else ""
    )


@pytest.mark.docker
@pytest.mark.root
def test_the_demo_teardown_leaves_nothing_of_the_demo(tour: Tour, docker_api) -> None:  # type: ignore[no-untyped-def]
    where = tour.shell(
        ".venv/bin/python -c 'from reconciler.store.lock import HostLock\n"
        "from reconciler.store.loop_state import state_path\n"
        "from reconciler.store.door_state import door_state_path\n"
        "from reconciler.store.state import host_dir\n"
        'print(host_dir("demo"), HostLock("demo", command="").path, state_path("demo"), door_state_path("demo"))\''
    )
    demo_state, lock, loop_state, door_state = (Path(p) for p in where.stdout.split())
    if not _mounted(DEMO_SHM):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", DEMO_SHM], check=True)
    # something to tear down: a lane, state, a lock file (the copy's manifest is the split one: the page edits copies)
    up = tour.shell("reconciler --root examples/demo apply --yes")
    assert up.returncode == 0, up.stdout + up.stderr
    assert docker_api.containers(all=True, filters={"label": "io.reconciler.host=demo"})
    assert demo_state.is_dir() and lock.exists()
    # and the demo's front door, as an interrupted demo leaves it: running on its own, its pid in the runtime directory
    door = tour.shell(
        "setsid reconciler --root examples/demo door >/dev/null 2>&1 </dev/null & echo $! >/run/reconciler-demo/door.pid"
        "; curl -s --retry 30 --retry-connrefused --retry-delay 1 -o /dev/null -w '%{http_code}' 127.0.0.1:9466/healthz"
    )
    assert door.stdout == "200", door.stdout + door.stderr
    door_pid = int(Path("/run/reconciler-demo/door.pid").read_text())
    kept = tour.shell("bash examples/demo/run.sh --teardown --keep-state")
    assert kept.returncode == 0 and demo_state.is_dir() and not _mounted(DEMO_SHM), kept.stdout + kept.stderr
    assert f"stopped the demo's front door (pid {door_pid})" in kept.stdout, kept.stdout
    assert not Path(f"/proc/{door_pid}").exists() or "door" not in Path(f"/proc/{door_pid}/cmdline").read_text()
    down = tour.shell("bash examples/demo/run.sh --teardown")
    assert down.returncode == 0, down.stdout + down.stderr
    assert docker_api.containers(all=True, filters={"label": "io.reconciler.host=demo"}) == []
    assert not _mounted(DEMO_SHM) and not Path("/run/reconciler-demo").exists()
    assert not demo_state.exists() and not lock.exists() and not loop_state.exists()
    assert not door_state.exists(), "the front door's published state goes with the demo"


def test_the_first_host_shown_is_the_shipped_one() -> None:
    """The host, recipe and manifest the tutorial shows for a first host are examples/first-host's files, byte for
    byte, so the copied recipe is the one `validate` passes there."""
    shown = {"\n".join(b.body) for b in BLOCKS if b.page == REPO / "docs" / "tutorial.md"}
    root = REPO / "examples" / "first-host"
    for f in ("configs/host.yaml", "configs/recipes/qwen3-8b.toml", "manifests/gpu-box.yaml"):
        text = (root / f).read_text().rstrip("\n")
        assert text in shown, f"docs/tutorial.md does not show examples/first-host/{f} as it is"
