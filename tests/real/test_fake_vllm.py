"""Tests of the vLLM stand-in in examples/fake-vllm/, which the demo and the end-to-end tests start.

The end-to-end tests trust it to behave like the field report's vLLM, so these check that behaviour on the real
things: worker processes mapping one file on a real tmpfs (seen through /proc/*/maps by device and inode), the
report's Errno 14 on a full tmpfs, health over real HTTP, and the image built by build.sh running in the real
Docker engine with the host's /usr mounted read-only.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from e2e_helpers import wait_until as e2e_wait_until

FAKE_DIR = Path(__file__).resolve().parents[2] / "examples" / "fake-vllm"
SCRIPT = FAKE_DIR / "fake_vllm.py"
IMAGE = "reconciler/fake-vllm:latest"
MIB = 1 << 20
# 32 MiB: two of them do not fit the 64 MiB test tmpfs once something else holds a few MiB.
OFFLOAD_GIB = "0.03125"
OFFLOAD_BYTES = 32 * MIB


def load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fake_vllm", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fake_vllm", module)  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


# Polled more often than the end-to-end tests do: these wait on single host processes, in tens of milliseconds.
wait_until = functools.partial(e2e_wait_until, every=0.02)


def mapping_pids(path: Path) -> set[int]:
    """Host pids whose /proc/PID/maps map ``path``, matched by device and inode as the reconciler does."""
    st = os.stat(path)
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path("/proc", entry, "maps").read_text()
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue  # unreadable (pid 1 in a microVM, say) or gone mid-scan: neither maps the test's file
        for line in text.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) < 5 or fields[4] != str(st.st_ino):
                continue
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            if os.makedev(major, minor) == st.st_dev:
                found.add(int(entry))
                break
    return found


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


class HostRun:
    """fake_vllm.py as a plain host process, its log in a file (a pipe nobody reads could block it)."""

    def __init__(self, *, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child has its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), *args, "--port", "0", "--host", "127.0.0.1"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def port(self) -> int:
        found = wait_until(
            lambda: re.search(r"Uvicorn running on http://[\d.]+:(\d+)", self.log()),
            timeout=10,
            what=f"the listening line in {self.log_path}",
        )
        assert isinstance(found, re.Match)
        return int(found.group(1))

    def worker_pids(self) -> set[int]:
        return {int(p) for p in re.findall(r"\(VllmWorker TP\d+ pid=(\d+)\) INFO .* started", self.log())}

    def wait(self, timeout: float = 10) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the workers die with it (PR_SET_PDEATHSIG)
            self.proc.wait(timeout=10)


@pytest.fixture
def run_fake(tmp_path: Path) -> Iterator[Callable[..., HostRun]]:
    runs: list[HostRun] = []

    def start(*args: str, env: dict[str, str] | None = None) -> HostRun:
        run = HostRun(args=args, log_path=tmp_path / f"fake-vllm-{len(runs)}.log", env=env)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


def offload_args(shm: Path, engine_id: str, *, size_gib: str = OFFLOAD_GIB, tp: int = 2) -> list[str]:
    return [
        "vllm",
        "serve",
        "fake/tp",
        "--tensor-parallel-size",
        str(tp),
        "--kv-offloading-size",
        size_gib,
        "--shm-dir",
        str(shm),
        "--engine-id",
        engine_id,
    ]


# --- command line, in process -------------------------------------------------------------------------------


def test_command_line_reads_vllm_words_fractional_gib_and_env() -> None:
    fake = load_module()
    s = fake.parse_settings(
        ["vllm", "serve", "org/model", "-tp", "2", "--kv-offloading-size", "0.0625", "--max-model-len", "4096"],
        {"FAKE_VLLM_SHM_DIR": "/x", "FAKE_VLLM_ENGINE_ID": "e1", "FAKE_VLLM_MODE": "crash-after=2.5,start-delay=1"},
    )
    assert (s.model, s.tensor_parallel_size, s.offload_bytes) == ("org/model", 2, 64 * MIB)
    assert s.offload_path == "/x/vllm_offload_e1.mmap"
    assert (s.mode.crash_after_s, s.mode.start_delay_s, s.mode.fail_start) == (2.5, 1.0, False)
    assert s.ignored_args == ("--max-model-len", "4096")
    assert (s.host, s.port) == ("0.0.0.0", 8000)
    # Flags win over the environment; a fresh engine id per start when none is given.
    s2 = fake.parse_settings(["--fake-mode", "never-healthy", "--shm-dir", "/y"], {"FAKE_VLLM_MODE": "fail-start"})
    assert s2.mode == fake.Mode(never_healthy=True) and s2.shm_dir == "/y" and s2.offload_bytes == 0
    assert s2.engine_id != fake.parse_settings([], {}).engine_id


def test_unknown_mode_is_a_usage_error_naming_the_switches(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake-mode", "crash-later"], capture_output=True, text=True, timeout=10
    )
    assert proc.returncode == 2
    assert "FAKE_VLLM_MODE/--fake-mode: unknown switch 'crash-later'" in proc.stderr
    assert "crash-after=SECONDS" in proc.stderr


# --- host processes on a real tmpfs ----------------------------------------------------------------------------


@pytest.mark.root
def test_tp2_workers_share_one_prefaulted_file(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake(*offload_args(tmpfs_dir, "share"))
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    path = tmpfs_dir / "vllm_offload_share.mmap"
    assert sorted(p.name for p in tmpfs_dir.iterdir()) == [path.name]
    st = path.stat()
    # Sized by ftruncate and fully allocated by the prefault, not sparse.
    assert st.st_size == OFFLOAD_BYTES and st.st_blocks * 512 == OFFLOAD_BYTES
    workers = run.worker_pids()
    assert len(workers) == 2 and run.proc.pid not in workers
    assert mapping_pids(path) == workers  # both workers, and only they


@pytest.mark.root
def test_sigterm_unmaps_and_unlinks_then_exits_0(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake(*offload_args(tmpfs_dir, "stop"))
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    workers = run.worker_pids()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 0
    assert list(tmpfs_dir.iterdir()) == []
    assert not any(Path("/proc", str(p)).exists() for p in workers)
    assert f"Removed native KV offload buffer {tmpfs_dir}/vllm_offload_stop.mmap" in run.log()


@pytest.mark.root
@pytest.mark.parametrize("after", ["0", "0.3"])
def test_crash_leaves_an_orphan_nobody_maps(after: str, tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake(*offload_args(tmpfs_dir, "crash"), env={"FAKE_VLLM_MODE": f"crash-after={after}"})
    run.port()
    assert run.wait() == 137
    path = tmpfs_dir / "vllm_offload_crash.mmap"
    assert path.stat().st_blocks * 512 == OFFLOAD_BYTES
    wait_until(lambda: not mapping_pids(path), timeout=5, what="the killed workers to drop their mappings")
    log = run.log()
    assert "exiting without cleanup" in log and "Removed" not in log
    # crash-after=0 dies as soon as the workers mapped, before /health could ever say 200.
    assert ("Application startup complete." in log) == (after != "0")


@pytest.mark.root
def test_full_tmpfs_fails_with_errno_14_and_starts_once_the_orphan_is_gone(
    tmpfs_dir: Path, run_fake: Callable[..., HostRun]
) -> None:
    # The field report's failure: an orphan offload file fills most of the tmpfs.
    orphan = tmpfs_dir / "vllm_offload_orphan.mmap"
    orphan.write_bytes(b"\1" * (48 * MIB))
    run = run_fake(*offload_args(tmpfs_dir, "full"))
    port = run.port()
    assert run.wait() == 1
    log = run.log()
    assert "OSError: [Errno 14] Bad address" in log
    assert "WorkerProc failed to start." in log and "Engine core initialization failed" in log
    assert "Application startup complete." not in log
    with pytest.raises(urllib.error.URLError):
        health(port)  # the server is gone with the process
    # The failed start leaves its partly prefaulted buffer behind, as the report found.
    assert (tmpfs_dir / "vllm_offload_full.mmap").exists()
    for f in tmpfs_dir.iterdir():
        f.unlink()
    again = run_fake(*offload_args(tmpfs_dir, "full"))
    port = again.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200 after the orphan is gone")
    assert len(mapping_pids(tmpfs_dir / "vllm_offload_full.mmap")) == 2


@pytest.mark.root
def test_health_is_503_until_every_worker_mapped(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake(*offload_args(tmpfs_dir, "slow"), env={"FAKE_VLLM_MODE": "start-delay=1.0"})
    port = run.port()
    path = tmpfs_dir / "vllm_offload_slow.mmap"
    assert health(port) == 503 and not path.exists()
    seen: list[tuple[int, int]] = []

    def healthy() -> bool:
        code = health(port)
        seen.append((code, len(mapping_pids(path)) if path.exists() else 0))
        return code == 200

    wait_until(healthy, timeout=10, what="health 200")
    # Every 200 came after both workers mapped the file; 503 was answered while they loaded.
    assert (503, 0) in seen and seen[-1] == (200, 2)


@pytest.mark.root
def test_never_healthy_stays_503_and_still_cleans_up(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake(*offload_args(tmpfs_dir, "never"), env={"FAKE_VLLM_MODE": "never-healthy"})
    port = run.port()
    wait_until(lambda: "never becoming healthy" in run.log(), timeout=10, what="the never-healthy line")
    assert len(mapping_pids(tmpfs_dir / "vllm_offload_never.mmap")) == 2
    assert [health(port) for _ in range(5)] == [503] * 5
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 0 and list(tmpfs_dir.iterdir()) == []


@pytest.mark.root
def test_fail_start_exits_1_with_a_clear_line_and_no_file(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake(*offload_args(tmpfs_dir, "fail"), env={"FAKE_VLLM_MODE": "fail-start"})
    assert run.wait() == 1
    assert "ERROR" in run.log() and "fake failure at start (FAKE_VLLM_MODE=fail-start)" in run.log()
    assert list(tmpfs_dir.iterdir()) == []


@pytest.mark.root
def test_without_offload_it_only_serves_health(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake("serve", "fake/small", "--shm-dir", str(tmpfs_dir))
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
        assert json.load(resp)["data"][0]["id"] == "fake/small"
    assert list(tmpfs_dir.iterdir()) == []
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 0


# --- the OpenAI API, the request gauges and the probe-failing switches -----------------------------------------


def post(port: int, path: str, body: dict[str, object], *, timeout: float = 10) -> tuple[int, bytes, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), ""


def gauges(port: int) -> tuple[float, float]:
    from reconciler.apply.vllm_metrics import parse_gauges

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        found = parse_gauges(resp.read().decode())
    assert found is not None
    return found


def test_chat_is_deterministic_structured_and_streams_as_sse(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    run = run_fake("serve", "fake/chat", "--shm-dir", str(tmpfs_dir))
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    ask = {"model": "fake/chat", "messages": [{"role": "user", "content": "Reply with the single word: ready"}]}
    answers = [json.loads(post(port, "/v1/chat/completions", ask)[1]) for _ in range(2)]
    assert answers[0]["choices"] == answers[1]["choices"], "the same prompt, the same answer"
    assert (
        answers[0]["choices"][0]["message"]["content"]
        == "Fake answer from fake/chat: Reply with the single word: ready"
    )
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 4}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    structured = json.loads(post(port, "/v1/chat/completions", {**ask, "response_format": fmt})[1])
    assert json.loads(structured["choices"][0]["message"]["content"]) == {"answer": 4}
    status, body, ctype = post(port, "/v1/chat/completions", {**ask, "stream": True})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [ln[len("data: ") :] for ln in body.decode().split("\n\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == (
        "Fake answer from fake/chat: Reply with the single word: ready"
    )
    status, body, _ = post(port, "/v1/completions", {"model": "fake/chat", "prompt": "abc"})
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "Fake answer from fake/chat: abc"
    assert post(port, "/v1/chat/completions", {**ask, "model": "other"})[0] == 404


def test_held_requests_show_as_running_and_waiting_until_released(
    tmpfs_dir: Path, run_fake: Callable[..., HostRun]
) -> None:
    import threading

    run = run_fake("serve", "fake/held", "--max-num-seqs", "1", "--shm-dir", str(tmpfs_dir))
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    assert gauges(port) == (0.0, 0.0)
    got: dict[int, tuple[int, bytes, str]] = {}

    def ask(i: int) -> None:
        got[i] = post(
            port,
            "/v1/chat/completions",
            {"model": "fake/held", "fake_hold_s": 30, "messages": [{"role": "user", "content": f"request {i}"}]},
            timeout=40,
        )

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in (1, 2)]
    for t in threads:
        t.start()
    wait_until(lambda: gauges(port) == (1.0, 1.0), timeout=5, what="one running (max-num-seqs 1), one waiting")

    def release() -> bool:
        urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{port}/fake/release", data=b"", method="POST"), timeout=2
        ).close()
        return not any(t.is_alive() for t in threads)

    wait_until(release, timeout=10, what="both requests released", every=0.2)
    assert {i: json.loads(b)["choices"][0]["message"]["content"] for i, (_, b, _) in got.items()} == {
        1: "Fake answer from fake/held: request 1",
        2: "Fake answer from fake/held: request 2",
    }
    assert gauges(port) == (0.0, 0.0)


# Each switch breaks exactly what one probe checks; the other probes still pass against the same server.
PROBES = {
    "models": {"name": "models", "kind": "models"},
    "smoke": {"name": "smoke", "prompt": "Reply with the single word: ready", "matches": "(?i)ready"},
    "json": {
        "name": "json",
        "prompt": "2 + 2 as JSON",
        "json_schema": {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]},
    },
    "stream": {"name": "stream", "prompt": "Reply with the single word: ready", "stream": True},
    "latency": {"name": "latency", "prompt": "hi", "max_latency_s": 0.5},
}


@pytest.mark.parametrize(
    ("mode", "fails", "says"),
    [
        ("models-missing", {"models"}, "/v1/models lists no model, not 'fake/probed'"),
        ("chat-error", {"smoke", "json", "stream", "latency"}, "HTTP 500, expected 200"),
        ("bad-json", {"json"}, "the answer is not JSON"),
        ("wrong-text", {"smoke"}, "does not match /(?i)ready/: 'I cannot help with that.'"),
        ("broken-stream", {"stream"}, "the stream ended without 'data: [DONE]'"),
        ("slow-chat=0.8", {"latency"}, "over the limit of 0.5 s"),
    ],
)
def test_each_switch_fails_its_probe(
    mode: str, fails: set[str], says: str, tmpfs_dir: Path, run_fake: Callable[..., HostRun]
) -> None:
    from reconciler.apply.probes import run_probe
    from reconciler.model import Recipe

    run = run_fake("serve", "fake/probed", "--shm-dir", str(tmpfs_dir), env={"FAKE_VLLM_MODE": mode})
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    recipe = Recipe.model_validate(
        {
            "tensor_parallel_size": 1,
            "model": {"id": "fake/probed"},
            "container": {"image": "reconciler/fake-vllm:latest", "command": ["vllm"]},
            "health": {"url": f"http://127.0.0.1:{port}/health"},
            "probes": list(PROBES.values()),
        }
    )
    results = {p.name: run_probe(p, recipe) for p in recipe.probes}
    assert {n for n, r in results.items() if not r.ok} == fails, {n: r.detail for n, r in results.items()}
    assert all(says in results[n].detail for n in fails), {n: results[n].detail for n in fails}


# --- the image in the real engine -------------------------------------------------------------------------------


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


@pytest.fixture
def image(docker_api: object) -> str:
    subprocess.run([str(FAKE_DIR / "build.sh")], check=True, capture_output=True, timeout=120)
    return IMAGE


@pytest.mark.docker
@pytest.mark.root
def test_image_runs_tp2_on_host_usr_and_stop_or_crash_decide_the_file(image: str, tmpfs_dir: Path) -> None:
    names: list[str] = []

    def start(name_part: str, *extra: str) -> str:
        name = f"fake-vllm-test-{name_part}-{uuid.uuid4().hex[:8]}"
        names.append(name)
        docker(
            "run",
            "-d",
            "--name",
            name,
            "--init",
            "-v",
            "/usr:/usr:ro",
            "--ipc=host",
            "--network=host",
            "-v",
            f"{tmpfs_dir}:/offload",
            *extra,
            image,
            "vllm",
            "serve",
            "fake/tp2",
            "--tensor-parallel-size",
            "2",
            "--kv-offloading-size",
            OFFLOAD_GIB,
            "--shm-dir",
            "/offload",
            "--engine-id",
            name_part,
            "--port",
            "0",
        )
        return name

    try:
        name = start("stop")
        found = wait_until(
            lambda: re.search(r"Uvicorn running on http://[\d.]+:(\d+)", docker("logs", name)),
            timeout=20,
            what="the container's listening line",
        )
        assert isinstance(found, re.Match)
        port = int(found.group(1))
        wait_until(lambda: health(port) == 200, timeout=20, what="the container's health 200")
        path = tmpfs_dir / "vllm_offload_stop.mmap"
        # Host pids of the container's processes (docker-init, the API process, two workers).
        pids = {int(p) for p in docker("top", name, "-eo", "pid").split()[1:]}
        mappers = mapping_pids(path)
        assert len(mappers) == 2 and mappers <= pids
        docker("stop", name)
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name) == "0"
        assert list(tmpfs_dir.iterdir()) == []

        crashed = start("crash", "-e", "FAKE_VLLM_MODE=crash-after=0.3")
        wait_until(
            lambda: docker("inspect", "-f", "{{.State.Status}}", crashed) == "exited",
            timeout=20,
            what="the crashing container to exit",
        )
        assert docker("inspect", "-f", "{{.State.ExitCode}}", crashed) == "137"
        orphan = tmpfs_dir / "vllm_offload_crash.mmap"
        assert orphan.stat().st_blocks * 512 == OFFLOAD_BYTES and not mapping_pids(orphan)
    finally:
        for n in names:
            docker("rm", "-f", n, check=False)


# --- sleep mode ----------------------------------------------------------------------------------------------
# The vLLM stand-in's sleep mode (examples/fake-vllm/fake_vllm.py), as vLLM's server shows it: with
# ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` it serves ``POST /sleep?level=N``, ``POST /wake_up``
# (``?tags=weights|kv_cache``), ``GET /is_sleeping``, ``POST /collective_rpc`` and ``POST /reset_prefix_cache``; asleep,
# ``/health`` stays 200, completions answer 503, ``vllm:engine_sleep_state`` says which state, and a sleep aborts the
# requests in flight. Run as a real host process over real HTTP.

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
CHAT = {"model": "fake/sleepy", "messages": [{"role": "user", "content": "Reply with the single word: ready"}]}
ANSWER = "Fake answer from fake/sleepy: Reply with the single word: ready"


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def sleep_state(port: int) -> str:
    """The sleep_state label whose vllm:engine_sleep_state sample is 1."""
    text = get(port, "/metrics")[1].decode()
    on = [ln for ln in text.splitlines() if ln.startswith("vllm:engine_sleep_state{") and ln.endswith(" 1.0")]
    assert len(on) == 1, text
    return on[0].split('sleep_state="')[1].split('"')[0]


def is_sleeping(port: int) -> bool:
    status, body = get(port, "/is_sleeping")
    assert status == 200, body
    return bool(json.loads(body)["is_sleeping"])


def start(run_fake: Callable[..., HostRun], tmp: Path, *extra: str, env: dict[str, str] | None = None) -> int:
    run = run_fake("serve", "fake/sleepy", "--shm-dir", str(tmp), *extra, env=env)
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    return port


def test_level_1_sleep_and_wake(tmp_path: Path, run_fake: Callable[..., HostRun]) -> None:
    port = start(run_fake, tmp_path, "--enable-sleep-mode", env={**DEV, "FAKE_VLLM_MODE": "wake-delay=0.3"})
    assert not is_sleeping(port) and sleep_state(port) == "awake"
    assert post(port, "/sleep?level=1", {})[0] == 200
    assert is_sleeping(port) and sleep_state(port) == "weights_offloaded"
    assert health(port) == 200, "/health proves nothing about sleep: it stays 200"
    status, body, _ = post(port, "/v1/chat/completions", CHAT)
    assert status == 503 and b"sleeping" in body
    t0 = time.monotonic()
    assert post(port, "/wake_up", {})[0] == 200
    assert time.monotonic() - t0 >= 0.3, "the wake takes the delay set"
    assert not is_sleeping(port) and sleep_state(port) == "awake"
    status, body, _ = post(port, "/v1/chat/completions", CHAT)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == ANSWER


def test_level_2_wakes_by_tags_and_answers_garbage_until_weights_reload(
    tmp_path: Path, run_fake: Callable[..., HostRun]
) -> None:
    port = start(run_fake, tmp_path, "--enable-sleep-mode", "-tp", "2", env=DEV)
    assert post(port, "/sleep?level=2", {})[0] == 200
    assert sleep_state(port) == "discard_all"
    assert post(port, "/wake_up?tags=weights", {})[0] == 200
    assert is_sleeping(port), "the KV cache is still asleep"
    assert post(port, "/v1/chat/completions", CHAT)[0] == 503
    assert post(port, "/wake_up?tags=kv_cache", {})[0] == 200
    assert not is_sleeping(port)
    status, body, _ = post(port, "/v1/chat/completions", CHAT)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] != ANSWER, "weights discarded"
    status, body, _ = post(port, "/collective_rpc", {"method": "reload_weights"})
    assert status == 200 and json.loads(body) == {"results": [None, None]}, "one answer per TP worker"
    assert json.loads(post(port, "/v1/chat/completions", CHAT)[1])["choices"][0]["message"]["content"] == ANSWER
    assert post(port, "/reset_prefix_cache", {})[0] == 200
    assert post(port, "/collective_rpc", {"method": "nothing"})[0] == 500
    assert post(port, "/sleep?level=3", {})[0] == 400


def test_a_sleep_aborts_the_requests_in_flight(tmp_path: Path, run_fake: Callable[..., HostRun]) -> None:
    port = start(run_fake, tmp_path, "--enable-sleep-mode", env=DEV)
    got: list[tuple[int, bytes, str]] = []
    asker = threading.Thread(
        target=lambda: got.append(post(port, "/v1/chat/completions", {**CHAT, "fake_hold_s": 30}, timeout=40)),
        daemon=True,
    )
    asker.start()
    wait_until(lambda: gauges(port) == (1.0, 0.0), timeout=5, what="the request in flight")
    assert post(port, "/sleep", {})[0] == 200
    asker.join(timeout=10)
    assert got and got[0][0] == 500 and b"aborted" in got[0][1], got


def test_failures_on_demand_and_no_endpoints_without_dev_mode(tmp_path: Path, run_fake: Callable[..., HostRun]) -> None:
    port = start(run_fake, tmp_path / "a", "--enable-sleep-mode", env={**DEV, "FAKE_VLLM_MODE": "sleep-fail"})
    assert post(port, "/sleep", {})[0] == 500 and not is_sleeping(port), "a failed sleep leaves it awake"
    plain = start(run_fake, tmp_path / "b", "--enable-sleep-mode")
    assert post(plain, "/sleep", {})[0] == 404 and get(plain, "/is_sleeping")[0] == 404, "dev mode off: not served"
    off = start(run_fake, tmp_path / "c", env=DEV)
    status, body, _ = post(off, "/sleep", {})
    assert status == 500 and b"--enable-sleep-mode" in body
    woke = start(run_fake, tmp_path / "d", "--enable-sleep-mode", env={**DEV, "FAKE_VLLM_MODE": "wake-fail"})
    assert post(woke, "/sleep", {})[0] == 200
    assert post(woke, "/wake_up", {})[0] == 500 and is_sleeping(woke), "a failed wake leaves it asleep"


@pytest.mark.root
def test_unlink_mapped_leaves_the_bytes_mapped_with_no_name(tmpfs_dir: Path, run_fake: Callable[..., HostRun]) -> None:
    # A current vLLM (its offload file unlinked once every worker mapped it): no name in the dir, the bytes still
    # used in statfs and mapped "(deleted)" by each worker; GET /version answers the release.
    run = run_fake(
        *offload_args(tmpfs_dir, "fixed"), "--fake-mode", "unlink-mapped", env={"FAKE_VLLM_VERSION": "0.11.2"}
    )
    port = run.port()
    wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
    assert list(tmpfs_dir.iterdir()) == []
    vfs = os.statvfs(tmpfs_dir)
    assert (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize >= OFFLOAD_BYTES
    workers = run.worker_pids()
    assert len(workers) == 2
    for pid in workers:
        maps = Path("/proc", str(pid), "maps").read_text()
        assert f"{tmpfs_dir}/vllm_offload_fixed.mmap (deleted)" in maps
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=2) as resp:
        assert json.loads(resp.read()) == {"version": "0.11.2"}
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 0
    vfs = os.statvfs(tmpfs_dir)
    assert (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize < MIB
