"""The README runs: every command example in README.md and docs/*.md is executed, as typed, and its output compared
with what the page shows, so a changed flag, port, message or JSON key fails here instead of failing the reader.

How a page is read (the page itself says so where a reader can see it):

- A fenced block whose lines start with ``$ `` is a session: each ``$`` line is run by bash, in one shell per
  block (a variable set by one command is there for the next), from a copy of this checkout's ``configs/``,
  ``manifests/`` and ``examples/`` (so ``--root examples/demo`` is the demo root, and edits touch only the copy),
  with the PATH a root shell has: ``reconciler`` must be the set-up's link in /usr/local/bin. The lines below a
  command are its output (stdout and stderr as a terminal shows them). A trailing ``# exit N`` on a command is
  checked too.
- Before a block, an HTML comment ``<!-- example ... -->`` (invisible on the rendered page) may prepare the host:
  ``loop: running`` (a ``reconciler run`` on the demo root, default listener) or ``loop: stopped`` (the default),
  and shell lines run first, in the same shell, with the helpers of ``HELPERS`` (``demo_manifest split``, ...).
- A ``python`` block preceded by ``<!-- example file: NAME -->`` is written to NAME before the next session runs.
- A block that is deliberately not run says so on its first line: ``# not run by the README's test: WHY``.

Compared with placeholders: times, durations, ids (12, 32 and 64 hex digits), pids and temporary paths are
replaced on both sides before the comparison, runs of spaces are one, and a line ``…`` alone stands for any lines.
The examples run against the real demo host (``host: demo``, the real engine, the demo's tmpfs, the default state
and lock directories, the default port 9464); the last test tears the demo down with ``examples/demo/run.sh
--teardown`` and checks that nothing of it is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = "# not run by the README's test:"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEMO_SHM = "/run/reconciler-demo/shm"
LOOP_ADDR = "127.0.0.1:9464"  # `reconciler run`'s default: the README's curl examples use it

# Bash helpers the hidden set-up lines of a block may call (cwd: the copy of the checkout).
HELPERS = r"""
DEMO=examples/demo
SHM=/run/reconciler-demo/shm
EXCLUSIVE='host: demo
assignments:
  - recipe: deepseek-256k-offload
    gpus: [dark-compute-a, dark-compute-b]'
demo_manifest() {  # split | exclusive | empty
  case "$1" in
    split) cp "$README_REPO/examples/demo/manifests/demo.yaml" $DEMO/manifests/demo.yaml ;;
    exclusive) printf '%s\n' "$EXCLUSIVE" >$DEMO/manifests/demo.yaml ;;
    empty) printf 'host: demo\nassignments: []\n' >$DEMO/manifests/demo.yaml ;;
  esac
}
demo_converge() { reconciler --root $DEMO apply --yes >/dev/null 2>&1 || reconciler --root $DEMO apply --yes; }
demo_clear_shm() { rm -f $SHM/vllm_offload_*.mmap; }
# A live process that maps an offload file and holds it open (its pid and file go to $README_PIDS: the test ends
# it after the block and removes its file, which would otherwise be an orphan in the next block's way).
demo_holder() {
  python3 -c 'import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); os.ftruncate(fd, int(sys.argv[2]))
m = mmap.mmap(fd, int(sys.argv[2])); m[:] = b"\1" * len(m); open(sys.argv[3], "w").close(); time.sleep(3600)' \
    "$1" "$2" "$1.ready" >/dev/null 2>&1 &
  echo "$! $1" >>"$README_PIDS"
  until [ -e "$1.ready" ]; do sleep 0.05; done; rm -f "$1.ready"
}
"""


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


def directives(block: Block) -> tuple[dict[str, str], list[str]]:
    """(``key: value`` directives, shell lines) of a block's example comment."""
    inner = "\n".join(block.comment)
    inner = inner.split("<!-- example", 1)[1].rsplit("-->", 1)[0] if inner else ""
    keys: dict[str, str] = {}
    shell: list[str] = []
    for ln in inner.splitlines():
        m = re.match(r"^\s*(loop):\s*(\S+)\s*$", ln)
        if m:
            keys[m.group(1)] = m.group(2)
        elif ln.strip():
            shell.append(ln)
    return keys, shell


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


def matches(expected: list[str], actual: list[str]) -> bool:
    """``expected`` equals ``actual``, where a line ``…`` alone stands for any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "…":
        return any(matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and matches(expected[1:], actual[1:])


# ---------------------------------------------------------------- the environment


class Tour:
    """The copy of the checkout the examples run in, and the demo loop they may need."""

    def __init__(self, base: Path):
        self.cwd = base / "checkout"
        self.cwd.mkdir()
        for part in ("configs", "manifests", "examples"):
            shutil.copytree(REPO / part, self.cwd / part, symlinks=True)
        (self.cwd / ".venv").symlink_to(REPO / ".venv")
        self.pids = base / "pids"
        self.pids.touch()
        self.helpers = base / "helpers.sh"
        self.helpers.write_text(HELPERS)
        self.loop: subprocess.Popen[bytes] | None = None
        self.loop_log = base / "loop.log"
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
            "README_REPO": str(REPO),
            "README_PIDS": str(self.pids),
        }
        for k in ("RECONCILER_TEST_DOCKER_URL", "DOCKER_HOST"):
            if k in os.environ:
                self.env[k] = os.environ[k]

    def shell(self, script: str, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", f"source {self.helpers}\n{script}"],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def set_loop(self, want: str) -> None:
        """A fresh loop for each block that shows one (its counters then hold that block's work only), on a tmpfs
        without offload files (an earlier try's orphan would be the new loop's to reclaim), or none."""
        self.stop_loop()
        if want == "running":
            for f in Path(DEMO_SHM).glob("vllm_offload_*.mmap"):
                f.unlink()
            self.loop = subprocess.Popen(
                ["reconciler", "--root", "examples/demo", "run"],
                cwd=self.cwd,
                env=self.env,
                stdout=self.loop_log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + 60
            while b" pass " not in self.loop_log.read_bytes():
                assert self.loop.poll() is None, f"the demo loop exited:\n{self.loop_log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no first pass:\n{self.loop_log.read_text()[-3000:]}"
                time.sleep(0.2)

    def stop_loop(self) -> None:
        if self.loop is not None and self.loop.poll() is None:
            self.loop.send_signal(signal.SIGTERM)
            try:
                self.loop.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.loop.kill()
                self.loop.wait()
        self.loop = None

    def end_helpers(self) -> None:
        for line in self.pids.read_text().splitlines():
            pid, _, path = line.partition(" ")
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGTERM)
            if path:
                Path(path).unlink(missing_ok=True)
        self.pids.write_text("")


def _mounted(path: str) -> bool:
    return subprocess.run(["mountpoint", "-q", path], check=False).returncode == 0


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory, docker_api, image: str) -> Iterator[Tour]:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.fail("the README's examples run as root, as the README says (tmpfs, every /proc/PID, the engine)")
    assert shutil.which("reconciler", path=ROOT_PATH), "no `reconciler` on the PATH: run `make setup`"
    t = Tour(tmp_path_factory.mktemp("readme"))
    t.outer = outer_container(docker_api)
    # A demo host left from before (make demo) is torn down first: the examples start from a known host.
    down = t.shell("bash examples/demo/run.sh --teardown", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    os.makedirs(DEMO_SHM, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", DEMO_SHM], check=True)
    try:
        yield t
    finally:
        t.stop_loop()
        t.end_helpers()
        # Nothing of the demo stays on the machine, whichever tests ran (the last test checks this same teardown).
        t.shell("bash examples/demo/run.sh --teardown", timeout=300)


# ---------------------------------------------------------------- the tests


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


def test_every_command_example_is_run_or_says_why_not() -> None:
    sessions = [b for b in BLOCKS if b.is_session]
    assert len(SESSIONS) >= 8, [b.where for b in SESSIONS]
    for b in sessions:
        if b.not_run is not None:
            assert len(b.not_run) > 10, f"{b.where}: say why it is not run"
    for b in BLOCKS:
        if b.file_name:
            assert b.lang == "python", f"{b.where}: an example file is a python block"


@pytest.mark.docker
@pytest.mark.root
@pytest.mark.parametrize("block", SESSIONS, ids=[b.where for b in SESSIONS])
def test_the_example_runs_as_shown(block: Block, tour: Tour) -> None:
    # A second try, from its set-up again, where a loop runs: any engine event wakes the loop, and a pass of its
    # own may reclaim the orphan an example made for a front-end to reclaim. Drift fails both tries.
    tries = 2 if directives(block)[0].get("loop") == "running" else 1
    for attempt in range(tries):
        try:
            run_block(block, tour)
            return
        except AssertionError:
            if attempt == tries - 1:
                raise


def run_block(block: Block, tour: Tour) -> None:
    keys, setup = directives(block)
    tour.set_loop(keys.get("loop", "stopped"))
    for b in BLOCKS:  # files the page shows before this session (the MCP client)
        if b.file_name and b.page == block.page and b.line < block.line:
            (tour.cwd / b.file_name).write_text("\n".join(b.body) + "\n")
    cmds = commands(block)
    assert cmds, f"{block.where}: a session without a `$ ` command"
    out_dir = tour.cwd.parent / "out"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir()
    script = [
        "set +e",
        "__setup() {",
        *(setup or [":"]),
        "}",
        f"__setup >{out_dir}/setup 2>&1 || {{ echo setup failed; cat {out_dir}/setup; exit 99; }}",
    ]
    for n, (cmd, _) in enumerate(cmds):
        script += [f"{{ {cmd}\n}} >{out_dir}/{n}.out 2>&1 </dev/null", f"echo $? >{out_dir}/{n}.rc"]
    try:
        ran = tour.shell("\n".join(script), timeout=400)
    finally:
        tour.end_helpers()
    assert ran.returncode != 99, f"{block.where}: the hidden set-up failed:\n{ran.stdout}{ran.stderr}"
    for n, (cmd, shown) in enumerate(cmds):
        got = (out_dir / f"{n}.out").read_text(errors="replace").splitlines()
        rc = int((out_dir / f"{n}.rc").read_text())
        m = re.search(r"#.*\bexit (\d+)", cmd)
        if m:
            assert rc == int(m.group(1)), (
                f"{block.where}: `{cmd}` exited {rc}, the page says {m.group(1)}\n" + "\n".join(got)
            )
        want, have = normalize(shown), normalize(as_on_a_host(shown, got, tour.outer))
        loop = f"\n--- the loop's log\n{tour.loop_log.read_text()[-3000:]}" if tour.loop is not None else ""
        assert matches(want, have), (
            f"{block.where}: `{cmd}` printed something else than the page shows (exit {rc}).\n"
            "--- the page (normalized)\n"
            + "\n".join(want)
            + "\n--- the command (normalized)\n"
            + "\n".join(have)
            + loop
        )


@pytest.mark.docker
@pytest.mark.root
def test_the_demo_teardown_leaves_nothing_of_the_demo(tour: Tour, docker_api) -> None:  # type: ignore[no-untyped-def]
    tour.stop_loop()
    where = tour.shell(
        ".venv/bin/python -c 'from reconciler.lock import HostLock, state_path\n"
        "from reconciler.state import host_dir\n"
        'print(host_dir("demo"), HostLock("demo", command="").path, state_path("demo"))\''
    )
    demo_state, lock, loop_state = (Path(p) for p in where.stdout.split())
    tour.shell("demo_manifest split; demo_converge")  # something to tear down: a lane, state, a lock file
    assert docker_api.containers(all=True, filters={"label": "io.reconciler.host=demo"})
    assert demo_state.is_dir() and lock.exists()
    kept = tour.shell("bash examples/demo/run.sh --teardown --keep-state")
    assert kept.returncode == 0 and demo_state.is_dir() and not _mounted(DEMO_SHM), kept.stdout + kept.stderr
    down = tour.shell("bash examples/demo/run.sh --teardown")
    assert down.returncode == 0, down.stdout + down.stderr
    assert docker_api.containers(all=True, filters={"label": "io.reconciler.host=demo"}) == []
    assert not _mounted(DEMO_SHM) and not Path("/run/reconciler-demo").exists()
    assert not demo_state.exists() and not lock.exists() and not loop_state.exists()
