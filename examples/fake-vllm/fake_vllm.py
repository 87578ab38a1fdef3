#!/usr/bin/python3
"""A stand-in for a vLLM OpenAI server with native KV offload, for hosts without GPUs.

It reproduces what the field report says a vLLM start does to the host, and nothing else: N tensor-parallel
worker processes share one ``vllm_offload_<engine id>.mmap`` file in the shm dir (worker 0 creates and sizes it,
the others wait for it and map it, every worker prefaults it with ``madvise(MADV_POPULATE_WRITE)``), a health
endpoint answers 200 only once every worker has mapped the file, and SIGTERM unmaps and unlinks it. A full
tmpfs makes the prefault fail with the report's ``OSError: [Errno 14] Bad address``; switches make it crash
without cleanup, fail at start, or never become healthy. Once healthy it answers what the reconciler's functional
probes and drains ask of vLLM: ``/v1/models``, deterministic ``/v1/chat/completions`` and ``/v1/completions`` (also
streamed as server-sent events, JSON built from a ``response_format`` schema, tool calls, the answer after a tool's
result, retrieval from a long document), ``/v1/responses``, and ``/metrics`` with ``vllm:num_requests_running`` /
``vllm:num_requests_waiting`` and the prefix cache's counters; a request can be held in flight until
``POST /fake/release``, and switches (also changed at run time by ``POST /fake/mode``) break each probe (see the
README).

Who runs it: ``examples/fake-vllm/build.sh`` packs it into the image ``reconciler/fake-vllm:latest`` (the host's
``/usr`` is bind-mounted read-only to supply Python), which the demo's recipes and the end-to-end tests start
through the reconciler; ``tests/real/test_fake_vllm.py`` also runs it directly as a host process. Standard library
only, so the host's ``/usr/bin/python3`` runs it inside the image.

Exit status: 0 after a graceful stop, 1 when the start fails (``fail-start``, a worker error such as Errno 14,
a worker that dies), 2 on a bad command line, 137 for the ``crash-after`` switch.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import http.server
import json
import math
import mmap
import os
import select
import signal
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

# What GET /version answers, as vLLM does; FAKE_VLLM_VERSION stands for another release.
VERSION = os.environ.get("FAKE_VLLM_VERSION") or "0.0.0+fake"
GIB = 1 << 30
# Linux 5.14+; Python's mmap module only exposes the constant when its build headers had it.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
POLL_S = 0.05
PREFIX_BLOCK = 16  # words per prefix-cache block (vLLM's default block size is 16 tokens)
PREFIX_CACHE_BLOCKS = 1 << 20  # blocks the GPU tier holds unless --fake-gpu-cache-tokens says otherwise
RETRIEVE_CHARS = 2000  # a user message longer than this is a document with a question: answered by retrieval
# After SIGTERM the workers get this long to unmap before they are killed; docker stop waits 10 s by default.
WORKER_STOP_GRACE_S = 5.0
CRASH_EXIT_CODE = 137  # what Docker reports for a SIGKILLed container
MODE_ENV = "FAKE_VLLM_MODE"
MODE_FILE_ENV = "FAKE_VLLM_MODE_FILE"
MODE_HELP = (
    "comma-separated switches: fail-start | never-healthy | crash-after=SECONDS | start-delay=SECONDS | "
    "models-missing | chat-error | bad-json | wrong-text | broken-stream | slow-chat=SECONDS | hold-requests | "
    "wrong-tool | bad-tool-args | ignore-tool-result | responses-empty | needle-wrong | fail-request=TEXT | "
    "sleep-delay=SECONDS | wake-delay=SECONDS | sleep-fail | wake-fail | unlink-mapped "
    f"(default from ${MODE_ENV}; empty = a normal server)"
)
# Sleep mode (vLLM's --enable-sleep-mode): its endpoints exist only with this variable set to 1, as in vLLM.
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # vllm:engine_sleep_state's sleep_state label
MIB_BYTES = 1 << 20
OFFLOAD_TOKEN_BYTES = 1024  # bytes of KV cache a token moves to or from the offload file (the fake's own figure)
# How fast the offload tier's blocks come back to the GPU: the report's reload moved 1,001,721,600 bytes in 0.344 s.
OFFLOAD_LOAD_BYTES_S = 2.9e9
# What a reasoning model thinks aloud before it answers (streamed as `reasoning` deltas, as vLLM's DeltaMessage has).
REASONING_WORDS = [
    "Let",
    "me",
    "read",
    "the",
    "question",
    "and",
    "look",
    "through",
    "the",
    "document",
    "for",
    "the",
    "sentence",
    "that",
    "answers",
    "it",
]
# Switches that take no value, each breaking what one kind of functional probe checks (see the README).
_FLAG_SWITCHES = (
    "fail-start",
    "never-healthy",
    "models-missing",
    "chat-error",
    "bad-json",
    "wrong-text",
    "broken-stream",
    "hold-requests",
    "wrong-tool",
    "bad-tool-args",
    "ignore-tool-result",
    "responses-empty",
    "needle-wrong",
    "sleep-fail",
    "wake-fail",
    "unlink-mapped",
)
_SECONDS_SWITCHES = {
    "crash-after": "crash_after_s",
    "start-delay": "start_delay_s",
    "slow-chat": "slow_chat_s",
    "sleep-delay": "sleep_delay_s",
    "wake-delay": "wake_delay_s",
}

_log_prefix = ""


def log(level: str, message: str) -> None:
    """One vLLM-looking log line on stdout, flushed at once so ``docker logs`` and test pipes see it."""
    caller = sys._getframe(1)
    stamp = datetime.now().strftime("%m-%d %H:%M:%S")
    line = f"{_log_prefix}{level} {stamp} [fake_vllm.py:{caller.f_lineno}] {message}\n"
    # One write per line keeps lines of concurrent workers from interleaving mid-line.
    os.write(sys.stdout.fileno(), line.encode())


@dataclasses.dataclass(frozen=True)
class Mode:
    """Behaviour switches parsed from ``--fake-mode`` / ``$FAKE_VLLM_MODE``."""

    fail_start: bool = False
    never_healthy: bool = False
    # Seconds after every worker mapped the file; 0 crashes before /health ever answers 200.
    crash_after_s: float | None = None
    # Seconds each worker "loads weights" before mapping; /health answers 503 meanwhile.
    start_delay_s: float = 0.0
    # The OpenAI API's failures, one per probe kind: /v1/models without the served model, completions answering
    # 500, structured output that is not the asked-for JSON, text that ignores the prompt, a stream cut short.
    models_missing: bool = False
    chat_error: bool = False
    bad_json: bool = False
    wrong_text: bool = False
    broken_stream: bool = False
    # Seconds every completion takes (a latency limit's failure).
    slow_chat_s: float = 0.0
    # Every completion waits until POST /fake/release (as if the engine were busy with it).
    hold_requests: bool = False
    # The tool and retrieval probes' failures: a call to another function than the one asked for, arguments that
    # break the function's parameter schema, a continuation that ignores the tool's result, a Responses answer
    # without output text, a needle answered with the wrong value, and an error for every request whose last
    # user message contains a text (one request of a batch).
    wrong_tool: bool = False
    bad_tool_args: bool = False
    ignore_tool_result: bool = False
    responses_empty: bool = False
    needle_wrong: bool = False
    fail_request: str = ""
    # Sleep mode: seconds POST /sleep and POST /wake_up take, and each answering 500 without changing state.
    sleep_delay_s: float = 0.0
    wake_delay_s: float = 0.0
    sleep_fail: bool = False
    wake_fail: bool = False
    # A current vLLM (since its fix of the offload leak): the offload file is unlinked as soon as every worker has
    # mapped it, so while the engine runs its bytes have no name (" (deleted)" in /proc/PID/maps) and only statfs
    # counts them.
    unlink_mapped: bool = False

    def __str__(self) -> str:
        words = [w for w in _FLAG_SWITCHES if getattr(self, w.replace("-", "_"))]
        if self.crash_after_s is not None:
            words.append(f"crash-after={self.crash_after_s:g}")
        if self.start_delay_s:
            words.append(f"start-delay={self.start_delay_s:g}")
        if self.slow_chat_s:
            words.append(f"slow-chat={self.slow_chat_s:g}")
        if self.sleep_delay_s:
            words.append(f"sleep-delay={self.sleep_delay_s:g}")
        if self.wake_delay_s:
            words.append(f"wake-delay={self.wake_delay_s:g}")
        if self.fail_request:
            words.append(f"fail-request={self.fail_request}")
        return ",".join(words) or "normal"


def parse_mode(text: str) -> Mode:
    """Parse ``fail-start,never-healthy,crash-after=S,start-delay=S,...`` (any subset, any order)."""
    fields: dict[str, object] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item or item == "normal":
            continue
        name, _, value = item.partition("=")
        if name in _FLAG_SWITCHES and not value:
            fields[name.replace("-", "_")] = True
        elif name == "fail-request" and value:
            fields["fail_request"] = value
        elif name in _SECONDS_SWITCHES and value:
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if seconds < 0:
                raise ValueError(f"{MODE_ENV}/--fake-mode: {item!r} needs a number of seconds >= 0, e.g. {name}=5")
            fields[_SECONDS_SWITCHES[name]] = seconds
        else:
            raise ValueError(f"{MODE_ENV}/--fake-mode: unknown switch {item!r}; use {MODE_HELP}")
    return Mode(**fields)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a run needs, resolved from the command line and the environment."""

    model: str
    tensor_parallel_size: int
    offload_bytes: int  # 0: native offload not configured
    shm_dir: str
    engine_id: str
    host: str
    port: int
    mode: Mode
    file_wait_s: float
    ignored_args: tuple[str, ...]
    max_num_seqs: int = 256  # requests served at once; more wait in the queue (vllm:num_requests_waiting)
    enable_sleep_mode: bool = False  # --enable-sleep-mode
    enable_pause: bool = False  # --enable-pause: POST /pause and /resume, as a vLLM that has them
    dev_mode: bool = False  # $VLLM_SERVER_DEV_MODE=1: the sleep endpoints are served
    cuda_mib: int = 0  # CUDA mode: MiB of GPU memory held awake (0: no CUDA)
    cuda_residual_mib: int = 0  # ... and still held asleep (vLLM keeps NCCL buffers and the CUDA context)
    cuda_token_kib: int = 0  # ... and per prompt token while a request runs (its KV cache)
    prefill_tok_s: float = 0.0  # prefill speed (0: at once)
    decode_tok_s: float = 0.0  # decode speed, one streamed token each 1/decode s (0: at once)
    reasoning_tokens: int = 0  # reasoning deltas before a chat answer's content
    gpu_cache_tokens: int = 0  # the GPU prefix cache's size (0: PREFIX_CACHE_BLOCKS blocks)
    offload_cache_tokens: int = 0  # the offload tier's size (0: the offload file's bytes / OFFLOAD_TOKEN_BYTES)
    spec_draft_tokens: int = 0  # speculative decoding's draft tokens a step (0: not configured)
    spec_acceptance: float = 0.0  # ... and the rate at which they are accepted
    served_names: tuple[str, ...] = ()  # --served-model-name: the names it answers to (empty: the model)
    tokens_per_s: float = 0.0  # --fake-tokens-per-s: the streaming pace (0: no pace)

    @property
    def offload_path(self) -> str:
        return os.path.join(self.shm_dir, f"vllm_offload_{self.engine_id}.mmap")


def _env_default(environ: Mapping[str, str], name: str, default: str) -> str:
    value = environ.get(name, "")
    return value if value != "" else default


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    # Environment defaults stay strings: argparse converts string defaults with `type`, so a bad value in the
    # environment gets the same clear usage error as a bad flag.
    parser = argparse.ArgumentParser(
        prog="fake_vllm.py",
        usage="fake_vllm.py [vllm] [serve] [MODEL] [options]",
        description="A vLLM stand-in: TP workers sharing one offload mmap in the shm dir, and /health.",
    )
    parser.add_argument("--model", default=None, help="model name, shown in logs and /v1/models")
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the names it answers to, as vLLM's (every one listed by /v1/models; default: the model)",
    )
    parser.add_argument(
        "--fake-tokens-per-s",
        type=float,
        default=0.0,
        help="stream at this pace (tokens a second), answering max_tokens tokens when the request gives it "
        "(default 0: as fast as it can, the usual answer)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=_env_default(environ, "FAKE_VLLM_TENSOR_PARALLEL_SIZE", "1"),
        help="number of worker processes (default $FAKE_VLLM_TENSOR_PARALLEL_SIZE or 1)",
    )
    parser.add_argument(
        "--kv-offloading-size",
        type=float,
        default=_env_default(environ, "FAKE_VLLM_KV_OFFLOADING_SIZE", "0"),
        help="offload buffer in GiB, fractions allowed (0.0625 = 64 MiB); 0 = no offload "
        "(default $FAKE_VLLM_KV_OFFLOADING_SIZE or 0)",
    )
    parser.add_argument("--kv-offloading-backend", default="native", help="accepted for vLLM compatibility")
    parser.add_argument(
        "--shm-dir",
        default=_env_default(environ, "FAKE_VLLM_SHM_DIR", "/dev/shm"),
        help="where the offload file goes (default $FAKE_VLLM_SHM_DIR or /dev/shm)",
    )
    parser.add_argument(
        "--engine-id",
        default=_env_default(environ, "FAKE_VLLM_ENGINE_ID", ""),
        help="names the file vllm_offload_<id>.mmap (default $FAKE_VLLM_ENGINE_ID or a fresh uuid per start)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="HTTP bind address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port for /health (default 8000; 0 = any free)")
    parser.add_argument("--fake-mode", default=environ.get(MODE_ENV, ""), help=MODE_HELP)
    parser.add_argument(
        "--fake-mode-file",
        default=environ.get(MODE_FILE_ENV, ""),
        help="more switches, read from this file at start when it exists: a fault that is fixed on the host, "
        f"without editing the recipe, by removing the file (default ${MODE_FILE_ENV})",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=256,
        help="requests run at once; the rest wait (vLLM's scheduler limit; default 256)",
    )
    parser.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help=f"serve POST /sleep, POST /wake_up, GET /is_sleeping (with ${DEV_MODE_ENV}=1, as vLLM)",
    )
    parser.add_argument(
        "--enable-pause",
        action="store_true",
        help="serve POST /pause and GET /is_paused (?wait_for_inflight_requests=true: admit nothing new, answer once the requests in "
        "flight finished; false: abort them) and POST /resume, as vLLM's server does since it has them",
    )
    parser.add_argument(
        "--fake-cuda-mib",
        type=int,
        default=_env_default(environ, "FAKE_VLLM_CUDA_MIB", "0"),
        help="CUDA mode (needs PyTorch and a GPU): MiB of GPU memory the server holds while awake and gives "
        "back asleep (default $FAKE_VLLM_CUDA_MIB or 0: no CUDA)",
    )
    parser.add_argument(
        "--fake-cuda-residual-mib",
        type=int,
        default=_env_default(environ, "FAKE_VLLM_CUDA_RESIDUAL_MIB", "0"),
        help="MiB it keeps asleep, as vLLM keeps its CUDA context and NCCL buffers (default 0)",
    )
    parser.add_argument(
        "--fake-cuda-token-kib",
        type=int,
        default=_env_default(environ, "FAKE_VLLM_CUDA_TOKEN_KIB", "0"),
        help="CUDA mode: KiB of GPU memory each prompt token takes while its request runs (default 0)",
    )
    for flag, env, kind, help_ in (
        ("--fake-prefill-tok-s", "FAKE_VLLM_PREFILL_TOK_S", float, "prefill speed in tokens/s (default 0: at once)"),
        ("--fake-decode-tok-s", "FAKE_VLLM_DECODE_TOK_S", float, "decode speed in tokens/s (default 0: at once)"),
        ("--fake-reasoning-tokens", "FAKE_VLLM_REASONING_TOKENS", int, "reasoning tokens before content (default 0)"),
        (
            "--fake-gpu-cache-tokens",
            "FAKE_VLLM_GPU_CACHE_TOKENS",
            int,
            "the GPU prefix cache's size in tokens, least recently used evicted (default 0: 16M tokens)",
        ),
        (
            "--fake-offload-cache-tokens",
            "FAKE_VLLM_OFFLOAD_CACHE_TOKENS",
            int,
            f"the offload tier's size in tokens (default 0: the offload file's size / {OFFLOAD_TOKEN_BYTES} bytes)",
        ),
        (
            "--fake-spec-acceptance",
            "FAKE_VLLM_SPEC_ACCEPTANCE",
            float,
            "speculative decoding: the share of draft tokens accepted, 0..1 (default 0: not configured)",
        ),
        ("--fake-spec-draft-tokens", "FAKE_VLLM_SPEC_DRAFT_TOKENS", int, "draft tokens a step (default 5)"),
    ):
        parser.add_argument(
            flag, type=kind, default=_env_default(environ, env, "5" if "draft" in flag else "0"), help=help_
        )
    parser.add_argument(
        "--fake-file-wait",
        type=float,
        default=60.0,
        help="seconds workers 1..N-1 wait for worker 0 to create the file (default 60)",
    )
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Read ``[vllm] [serve] [MODEL] [options]``; unknown vLLM options are kept aside and only logged."""
    args = list(argv)
    # Recipes written for vLLM say `vllm serve MODEL ...`; accept the same words so they run unchanged.
    if args and args[0] == "vllm":
        args.pop(0)
    if args and args[0] == "serve":
        args.pop(0)
    positional_model = args.pop(0) if args and not args[0].startswith("-") else None
    parser = build_parser(environ)
    ns, unknown = parser.parse_known_args(args)
    if ns.tensor_parallel_size < 1:
        parser.error(f"--tensor-parallel-size must be >= 1, got {ns.tensor_parallel_size}")
    if ns.max_num_seqs < 1:
        parser.error(f"--max-num-seqs must be >= 1, got {ns.max_num_seqs}")
    if ns.fake_cuda_mib < 0 or not 0 <= ns.fake_cuda_residual_mib <= max(ns.fake_cuda_mib, 0):
        parser.error("--fake-cuda-mib must be >= 0 and --fake-cuda-residual-mib between 0 and it")
    if ns.kv_offloading_size < 0:
        parser.error(f"--kv-offloading-size is in GiB and must be >= 0, got {ns.kv_offloading_size}")
    speeds = (ns.fake_prefill_tok_s, ns.fake_decode_tok_s, ns.fake_reasoning_tokens, ns.fake_gpu_cache_tokens)
    if min(speeds) < 0 or ns.fake_offload_cache_tokens < 0 or ns.fake_cuda_token_kib < 0:
        parser.error("--fake-prefill-tok-s, --fake-decode-tok-s and the --fake-*-tokens sizes must be >= 0")
    if not 0 <= ns.fake_spec_acceptance <= 1 or ns.fake_spec_draft_tokens < 1:
        parser.error("--fake-spec-acceptance is a share between 0 and 1; --fake-spec-draft-tokens at least 1")
    mode_text = ns.fake_mode
    if ns.fake_mode_file:
        try:
            with open(ns.fake_mode_file, encoding="utf-8") as fh:
                mode_text = ",".join(w for w in (mode_text, fh.read().strip()) if w)
        except FileNotFoundError:
            pass
    try:
        mode = parse_mode(mode_text)
    except ValueError as exc:
        parser.error(str(exc))
    page = mmap.PAGESIZE
    wanted = int(ns.kv_offloading_size * GIB)
    offload_bytes = -(-wanted // page) * page  # whole pages: the mapping and the tmpfs both count in pages
    return Settings(
        model=ns.model or positional_model or "fake/model",
        tensor_parallel_size=ns.tensor_parallel_size,
        offload_bytes=offload_bytes,
        shm_dir=ns.shm_dir,
        engine_id=ns.engine_id or str(uuid.uuid4()),
        host=ns.host,
        port=ns.port,
        mode=mode,
        file_wait_s=ns.fake_file_wait,
        ignored_args=tuple(unknown),
        max_num_seqs=ns.max_num_seqs,
        enable_sleep_mode=ns.enable_sleep_mode,
        enable_pause=ns.enable_pause,
        dev_mode=environ.get(DEV_MODE_ENV, "") == "1",
        cuda_mib=ns.fake_cuda_mib,
        cuda_residual_mib=ns.fake_cuda_residual_mib,
        cuda_token_kib=ns.fake_cuda_token_kib,
        prefill_tok_s=ns.fake_prefill_tok_s,
        # --fake-tokens-per-s (the door's streaming pace) is the decode speed where --fake-decode-tok-s is not given
        decode_tok_s=ns.fake_decode_tok_s or max(0.0, ns.fake_tokens_per_s),
        reasoning_tokens=ns.fake_reasoning_tokens,
        gpu_cache_tokens=ns.fake_gpu_cache_tokens,
        offload_cache_tokens=ns.fake_offload_cache_tokens or offload_bytes // OFFLOAD_TOKEN_BYTES,
        spec_draft_tokens=ns.fake_spec_draft_tokens if ns.fake_spec_acceptance > 0 else 0,
        spec_acceptance=ns.fake_spec_acceptance,
        served_names=tuple(ns.served_model_name or ()),
        tokens_per_s=max(0.0, ns.fake_tokens_per_s),
    )


def _prctl(option: int, value: int | bytes) -> None:
    # Best effort: names only help `ps`, and the death signal is backed up by a getppid() check.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    libc.prctl(option, value, 0, 0, 0)


class Stop(Exception):
    """Raised in a worker by SIGTERM/SIGINT to unwind out of any wait into its cleanup."""


def _raise_stop(signum: int, frame: object) -> None:
    raise Stop()


def _wait_for_file(path: str, size: int, timeout_s: float) -> int:
    """Workers 1..N-1: open the file once worker 0 has created it and sized it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            if os.fstat(fd).st_size >= size:
                return fd
            os.close(fd)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear with {size} bytes within {timeout_s:g} s (--fake-file-wait)")
        time.sleep(0.02)


def run_worker(*, rank: int, settings: Settings, ready_fd: int) -> int:
    """One TP worker: map and prefault the shared file, say so on ``ready_fd``, hold it until SIGTERM."""
    global _log_prefix
    _log_prefix = f"(VllmWorker TP{rank} pid={os.getpid()}) "
    _prctl(PR_SET_NAME, f"VllmWorker TP{rank}".encode())
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    fd = -1
    buffer: mmap.mmap | None = None
    try:
        log("INFO", f"Worker rank {rank} of {settings.tensor_parallel_size} started for {settings.model}")
        if settings.mode.start_delay_s:
            log("INFO", f"Loading model weights (start-delay={settings.mode.start_delay_s:g} s)")
            time.sleep(settings.mode.start_delay_s)
        if settings.offload_bytes:
            path, size = settings.offload_path, settings.offload_bytes
            try:
                if rank == 0:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                    os.ftruncate(fd, size)
                    log("INFO", f"Created native KV offload buffer {path} ({size} bytes)")
                else:
                    fd = _wait_for_file(path, size, settings.file_wait_s)
                buffer = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                log("INFO", f"Prefaulting {size} bytes of {path} with MADV_POPULATE_WRITE")
                buffer.madvise(MADV_POPULATE_WRITE)
            except (OSError, TimeoutError):
                log("ERROR", "WorkerProc failed to start.")
                trace = "".join(_log_prefix + line + "\n" for line in traceback.format_exc().splitlines())
                os.write(sys.stdout.fileno(), trace.encode())
                return 1
            log("INFO", f"Mapped {path} ({size} bytes)")
        else:
            log("INFO", "Native KV offloading not configured (--kv-offloading-size 0)")
        os.write(ready_fd, b"M")
        while True:
            signal.pause()
    except Stop:
        log("INFO", "Worker shutting down")
        return 0
    finally:
        if buffer is not None:
            buffer.close()
        if fd >= 0:
            os.close(fd)


@dataclasses.dataclass
class Switches:
    """The behaviour switches in force; ``POST /fake/mode`` replaces them while the server runs."""

    mode: Mode


@dataclasses.dataclass
class Health:
    """What /health reports; written by the main loop, read by the HTTP threads."""

    ready: bool = False
    model: str = ""
    names: tuple[str, ...] = ()  # every name it answers to (the first is ``model``)


@dataclasses.dataclass(frozen=True)
class Lookup:
    """One prompt in the prefix cache: its tokens, those found in the GPU tier, those loaded back from the offload
    tier, and the seconds that load takes."""

    tokens: int
    gpu_hits: int = 0
    external_hits: int = 0
    load_s: float = 0.0

    @property
    def cached(self) -> int:
        return self.gpu_hits + self.external_hits


class Engine:
    """The requests in flight, as vLLM's scheduler counts them: at most ``max_num_seqs`` running, the rest waiting.

    A request asked to hold (``"fake_hold_s": S`` in its body, or the ``hold-requests`` switch) keeps its place
    until ``POST /fake/release`` (or S seconds); that is how a test keeps requests in flight across a drain."""

    def __init__(
        self,
        max_num_seqs: int,
        *,
        gpu_cache_tokens: int = 0,
        offload_cache_tokens: int = 0,
        spec_draft_tokens: int = 0,
        spec_acceptance: float = 0.0,
    ):
        self.max_num_seqs = max_num_seqs
        self.cond = threading.Condition()
        self.running = 0
        self.waiting = 0
        self.holding = 0
        self.release_gen = 0
        self.abort_gen = 0  # counts the times every request in flight was aborted (a sleep aborts them, as vLLM)
        self.paused = False  # POST /pause: nothing new is admitted until POST /resume
        # vLLM's prefix cache, as its counters show it: prompt tokens (words here) looked up and found, in blocks of
        # PREFIX_BLOCK, each block known by the hash of everything before it and itself. The GPU tier holds
        # ``gpu_blocks`` and evicts the least recently used; with an offload tier, an evicted block goes there (its
        # bytes counted GPU to CPU) and a prompt that finds it there loads it back (CPU to GPU, an external hit).
        self.gpu_blocks = max(1, gpu_cache_tokens // PREFIX_BLOCK) if gpu_cache_tokens else PREFIX_CACHE_BLOCKS
        self.offload_blocks = offload_cache_tokens // PREFIX_BLOCK
        self.blocks: collections.OrderedDict[int, None] = collections.OrderedDict()  # the GPU tier, LRU first
        self.offloaded: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.external_queries = 0
        self.external_hits = 0
        self.bytes = {"GPU_to_CPU": 0, "CPU_to_GPU": 0}  # vllm:kv_offload_total_bytes by transfer_type
        self.seconds = {"GPU_to_CPU": 0.0, "CPU_to_GPU": 0.0}  # vllm:kv_offload_total_time
        # Speculative decoding: K draft tokens a step, each accepted at the set rate (0 K: not configured).
        self.spec_k = spec_draft_tokens
        self.spec_rate = spec_acceptance
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0

    def _to_gpu(self, block: int) -> None:
        self.blocks[block] = None
        self.blocks.move_to_end(block)
        while len(self.blocks) > self.gpu_blocks:
            evicted, _ = self.blocks.popitem(last=False)
            if self.offload_blocks:
                self.offloaded[evicted] = None
                self.offloaded.move_to_end(evicted)
                self.bytes["GPU_to_CPU"] += PREFIX_BLOCK * OFFLOAD_TOKEN_BYTES
                self.seconds["GPU_to_CPU"] += PREFIX_BLOCK * OFFLOAD_TOKEN_BYTES / OFFLOAD_LOAD_BYTES_S
                while len(self.offloaded) > self.offload_blocks:
                    self.offloaded.popitem(last=False)

    def cache_prompt(self, words: Sequence[str]) -> Lookup:
        """Count one prompt's lookup in the prefix cache: its leading blocks in the GPU tier are hits, the blocks
        after them found in the offload tier are external hits (loaded back), the rest is computed and cached."""
        with self.cond:
            chain = 0
            gpu = external = 0
            hitting = True
            for start in range(0, len(words) - len(words) % PREFIX_BLOCK, PREFIX_BLOCK):
                chain = hash((chain, *words[start : start + PREFIX_BLOCK]))
                if hitting and chain in self.blocks and not external:
                    gpu += PREFIX_BLOCK
                elif hitting and chain in self.offloaded:
                    del self.offloaded[chain]
                    external += PREFIX_BLOCK
                else:
                    hitting = False
                self._to_gpu(chain)
            self.prefix_queries += len(words)
            self.prefix_hits += gpu
            load = external * OFFLOAD_TOKEN_BYTES
            if self.offload_blocks:
                self.external_queries += len(words) - gpu
                self.external_hits += external
                self.bytes["CPU_to_GPU"] += load
                self.seconds["CPU_to_GPU"] += load / OFFLOAD_LOAD_BYTES_S
            return Lookup(len(words), gpu, external, load / OFFLOAD_LOAD_BYTES_S)

    def speculate(self, tokens: int) -> None:
        """Count the drafts that made ``tokens`` output tokens at the set acceptance rate."""
        if not self.spec_k or tokens <= 0:
            return
        steps = max(1, math.ceil(tokens / (1 + self.spec_k * self.spec_rate)))
        with self.cond:
            self.spec_drafts += steps
            self.spec_draft_tokens += steps * self.spec_k
            self.spec_accepted += round(steps * self.spec_k * self.spec_rate)

    def admit(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: not self.paused)  # paused: not admitted (not even waiting) until resumed
            self.waiting += 1
            self.cond.wait_for(lambda: self.running < self.max_num_seqs)
            self.waiting -= 1
            self.running += 1

    def finish(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def hold(self, seconds: float) -> None:
        with self.cond:
            gen = self.release_gen
            self.holding += 1
            try:
                self.cond.wait_for(lambda: self.release_gen != gen, timeout=seconds)
            finally:
                self.holding -= 1

    def abort_all(self) -> int:
        """Abort every request in flight (POST /sleep does, in vLLM): each answers an error; the number of them."""
        with self.cond:
            self.abort_gen += 1
            self.release_gen += 1
            self.cond.notify_all()
            return self.running + self.waiting

    def pause(self, *, wait: bool, timeout: float = 3600.0) -> bool:
        """vLLM's pause: admit nothing new; with ``wait``, return once the requests in flight finished (False when
        ``timeout`` passed first), else abort them."""
        with self.cond:
            self.paused = True
            if not wait:
                self.abort_gen += 1
                self.release_gen += 1
                self.cond.notify_all()
                return True
            return self.cond.wait_for(lambda: self.running + self.waiting == 0, timeout=timeout)

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def release(self) -> int:
        """Let every request that holds now go on; the number of them."""
        with self.cond:
            held = self.holding
            self.release_gen += 1
            self.cond.notify_all()
            return held


class Cuda:
    """CUDA mode: real GPU memory held by this process through PyTorch, ``awake_mib`` in all while awake and
    ``residual_mib`` asleep (the block that stays stands for what a sleeping vLLM keeps: its CUDA context, NCCL
    buffers, the CUDA graphs' pool). Every page is written, so the driver has really given it."""

    def __init__(self, awake_mib: int, residual_mib: int):
        import torch  # only in CUDA mode: the image and the demo have no PyTorch

        self.torch = torch
        self.awake_mib, self.residual_mib = awake_mib, residual_mib
        self.residual = self._take(residual_mib)
        self.rest: object | None = None

    def _take(self, mib: int) -> object | None:
        if mib <= 0:
            return None
        block = self.torch.empty(mib * MIB_BYTES, dtype=self.torch.uint8, device="cuda")
        block.fill_(1)
        self.torch.cuda.synchronize()
        return block

    def take_kib(self, kib: int) -> object | None:
        """More memory, for one request's KV cache while it runs (a long prompt takes more)."""
        return self._take(-(-kib // 1024)) if kib > 0 else None

    def give_back(self, block: object) -> None:
        del block
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def wake(self) -> None:
        if self.rest is None:
            self.rest = self._take(self.awake_mib - self.residual_mib)

    def sleep(self) -> None:
        self.rest = None
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()  # back to the driver, so NVML and nvidia-smi see it free


class Sleep:
    """vLLM's sleep mode as its server shows it. Level 1 offloads the weights to CPU memory and discards the KV
    cache; level 2 discards both, so after waking the weights the model answers garbage until
    ``collective_rpc reload_weights``. ``/health`` stays 200 throughout; completions answer 503 while asleep."""

    def __init__(self, cuda: Cuda | None = None):
        self.lock = threading.Lock()  # one sleep or wake at a time, as vLLM's engine core runs them
        self.level = 0
        self.weights_awake = True
        self.kv_awake = True
        self.weights_loaded = True
        self.cuda = cuda

    @property
    def sleeping(self) -> bool:
        return not (self.weights_awake and self.kv_awake)

    def state(self) -> str:
        """vllm:engine_sleep_state's sleep_state label in force."""
        return "awake" if not self.sleeping else SLEEP_STATES[min(self.level, 2)]


def _example(schema: object) -> object:
    """A deterministic value that matches a (simple) JSON Schema: what guided decoding would make of it."""
    if not isinstance(schema, dict):
        return "fake"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {k: _example(v) for k, v in props.items()}
    if kind == "array":
        return [_example(schema.get("items") or {})] * max(1, int(schema.get("minItems") or 1))
    if kind == "integer":
        return int(schema.get("minimum", 4))
    if kind == "number":
        return float(schema.get("minimum", 4))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "fake"


def _prompt_text(body: dict[str, object]) -> str:
    if "messages" in body:
        messages = body.get("messages") or []
        users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        text = users[-1] if users else ""
        return text if isinstance(text, str) else json.dumps(text)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _words(text: str) -> list[str]:
    return [w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if len(w) > 3]


def retrieve(document: str, *, mode: Mode) -> str:
    """The sentence of a long message that shares the most words with its last sentence (the question): what a
    model reading the document would answer. ``needle-wrong`` changes its digits (a needle answered wrong)."""
    sentences = [x.strip() for x in document.replace("\n", " ").replace("?", "?|").replace(". ", ".|").split("|")]
    sentences = [x for x in sentences if x]
    asked = [i for i, x in enumerate(sentences) if x.endswith("?")] or [len(sentences) - 1]
    question = set(_words(sentences[asked[-1]])) if sentences else set()
    best, score = "", 0
    for sentence in sentences[: asked[-1]]:
        n = len(question & set(_words(sentence)))
        if n > score:
            best, score = sentence, n
    if not best:
        return "The document does not say."
    if mode.needle_wrong:
        best = "".join(str((int(c) + 1) % 10) if c.isdigit() else c for c in best)
    return best


def _quoted(text: str) -> list[str]:
    """Values quoted in a message ('X' or "X"), in order: what a model would put into a call's string arguments."""
    out, quote, cur = [], "", []
    for c in text:
        if quote:
            if c == quote:
                out.append("".join(cur))
                quote, cur = "", []
            else:
                cur.append(c)
        elif c in "'\"":
            quote = c
    return out


def tool_call(body: dict[str, object], *, mode: Mode) -> dict[str, object] | None:
    """The function call a request with ``tools`` gets: the named ``tool_choice``, else the first tool named in the
    last user message, else the first tool; string arguments from the message's quoted values, the rest from the
    parameter schema. None when ``tool_choice`` is ``none`` or no tool is usable."""
    tools = [
        t.get("function")
        for t in body.get("tools") or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    user = _prompt_text(body)
    names = [str(t.get("name")) for t in tools]
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = str(choice["function"].get("name"))
    else:
        name = next((n for n in names if n in user), names[0])
    if mode.wrong_tool:
        name = next((n for n in names if n != name), "other_function")
    fn = next((t for t in tools if t.get("name") == name), {})
    schema = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    args = _example(schema) if schema else {}
    if isinstance(args, dict):
        quoted = iter(_quoted(user))
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for key, sub in props.items():
            if isinstance(sub, dict) and sub.get("type") == "string" and "const" not in sub and "enum" not in sub:
                args[key] = next(quoted, args.get(key))
    if mode.bad_tool_args:
        args = ["fake"]  # an array where the schema wants an object: breaks any parameters schema
    return {"name": name, "arguments": json.dumps(args)}


def answer_text(body: dict[str, object], *, model: str, mode: Mode) -> str:
    """The completion, deterministic: the asked-for JSON (``response_format``), else the prompt echoed back."""
    fmt = body.get("response_format") if isinstance(body.get("response_format"), dict) else {}
    structured = fmt.get("type") in ("json_schema", "json_object") if isinstance(fmt, dict) else False
    if structured and mode.bad_json:
        return '{"answer": "truncated'  # not JSON at all: the structured-output check must catch it
    if structured:
        js = fmt.get("json_schema") if isinstance(fmt.get("json_schema"), dict) else {}
        schema = js.get("schema") if isinstance(js, dict) else None
        value = _example(schema) if schema else {"answer": "fake"}
        return json.dumps(value, separators=(", ", ": "))
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") == "tool":
        # The continuation after a tool call: the answer rests on the tool's result (or ignores it, when told).
        if mode.ignore_tool_result:
            return "I could not get that information."
        return f"Fake answer from {model}: the tool returned {last.get('content')}"
    if mode.wrong_text:
        return "I cannot help with that."
    prompt = _prompt_text(body)
    if len(prompt) > RETRIEVE_CHARS:
        return retrieve(prompt, mode=mode)
    return f"Fake answer from {model}: {prompt}"


def prompt_words(body: dict[str, object]) -> list[str]:
    """Every word of the prompt as the engine sees it (system, user, assistant and tool messages, or the prompt
    or Responses input): its token count and its prefix-cache key."""
    parts: list[str] = []
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            parts.append(m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content")))
    for key in ("prompt", "input"):
        if key in body:
            parts.append(body[key] if isinstance(body[key], str) else json.dumps(body[key]))
    return " ".join(parts).split()


def responses_body(rid: str, body: dict[str, object], *, model: str, mode: Mode) -> dict[str, object]:
    """A Responses API answer (POST /v1/responses): one message with one output_text, or JSON for a
    ``text.format`` json_schema. ``responses-empty``: only a reasoning item, no output text."""
    data = body.get("input")
    if isinstance(data, list):
        users = [m.get("content") for m in data if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users and isinstance(users[-1], str) else json.dumps(data)
    else:
        prompt = str(data or "")
    text_cfg = body.get("text") if isinstance(body.get("text"), dict) else {}
    fmt = text_cfg.get("format") if isinstance(text_cfg.get("format"), dict) else {}
    if fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        text = json.dumps(_example(schema) if schema else {"answer": "fake"}, separators=(", ", ": "))
    elif mode.wrong_text:
        text = "I cannot help with that."
    else:
        text = f"Fake answer from {model}: {prompt}"
    item_id = rid.replace("resp_", "msg_")
    output: list[dict[str, object]] = [
        {
            "type": "reasoning",
            "id": rid.replace("resp_", "rs_"),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Thinking."}],
        }
    ]
    if not mode.responses_empty:
        output.append(
            {
                "type": "message",
                "id": item_id,
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": None}],
            }
        )
    words = len(prompt_words(body))
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tools": [],
        "usage": {"input_tokens": words, "output_tokens": len(text.split()), "total_tokens": words + len(text.split())},
    }


@dataclasses.dataclass(frozen=True)
class Pace:
    """How fast the engine works: prefill at ``prefill_tok_s`` (the uncached prompt tokens; a prefix loaded back from
    the offload tier takes its transfer time), decode at ``decode_tok_s`` (one streamed token each 1/decode s), and
    ``reasoning_tokens`` of reasoning before a chat answer's content. 0 speeds: at once, as before."""

    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    reasoning_tokens: int = 0
    cuda_token_kib: int = 0  # CUDA mode: KiB of GPU memory a prompt token takes while its request runs

    def prefill(self, lookup: Lookup) -> None:
        if self.prefill_tok_s > 0:
            time.sleep((lookup.tokens - lookup.cached) / self.prefill_tok_s + lookup.load_s)

    def decode(self, tokens: int) -> None:
        if self.decode_tok_s > 0 and tokens > 1:
            time.sleep((tokens - 1) / self.decode_tok_s)

    def wait_token(self, first_at: float, index: int) -> None:
        """Until token ``index`` (0 the first, sent as prefill ends) is due."""
        if self.decode_tok_s > 0 and index > 0:
            time.sleep(max(0.0, first_at + index / self.decode_tok_s - time.monotonic()))


def make_server(
    *,
    host: str,
    port: int,
    health: Health,
    mode: Mode | None = None,
    engine: Engine | None = None,
    settings: Settings | None = None,
    sleep: Sleep | None = None,
) -> http.server.ThreadingHTTPServer:
    switches = Switches(mode or Mode())
    engine = engine or Engine(256)
    sleep_: Sleep = sleep or Sleep()
    sleep_served = settings is not None and settings.dev_mode  # the dev-mode endpoints exist (else 404, as vLLM)
    sleep_enabled = settings is not None and settings.enable_sleep_mode
    tp = settings.tensor_parallel_size if settings is not None else 1
    counter = iter(range(1, 1 << 62))
    pace = (
        Pace(settings.prefill_tok_s, settings.decode_tok_s, settings.reasoning_tokens, settings.cuda_token_kib)
        if settings is not None
        else Pace()
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        mode: Mode  # the switches of this request: read once as it starts, so a change never splits an answer

        def do_GET(self) -> None:
            self.mode = switches.mode
            if self.path == "/health":
                self._answer(200 if health.ready else 503, {} if health.ready else {"status": "starting"})
            elif self.path == "/version":
                self._answer(200, {"version": VERSION})
            elif self.path == "/v1/models" and health.ready:
                served = (
                    []
                    if self.mode.models_missing
                    else [
                        {
                            "id": name,
                            "object": "model",
                            "owned_by": "vllm",
                            "root": health.model,
                            "max_model_len": 262144,
                        }
                        for name in (health.names or (health.model,))
                    ]
                )
                self._answer(200, {"object": "list", "data": served})
            elif self.path == "/v1/models":
                self._answer(503, {"status": "starting"})
            elif self.path == "/metrics":
                self._metrics()
            elif self.path == "/is_sleeping" and sleep_served:
                self._answer(200, {"is_sleeping": sleep_.sleeping})
            elif self.path == "/is_paused" and settings is not None and settings.enable_pause:
                self._answer(200, {"is_paused": engine.paused})
            else:
                self._answer(404, {"detail": "Not Found"})

        def _sleep_call(self, path: str, query: dict[str, list[str]], raw: bytes) -> None:
            """POST /sleep?level=N, /wake_up[?tags=weights|kv_cache], /collective_rpc, /reset_prefix_cache."""
            if not health.ready:
                self._answer(503, {"status": "starting"})
                return
            if path == "/reset_prefix_cache":
                with engine.cond:
                    engine.blocks.clear()
                self._answer(200, {})
                return
            if not sleep_enabled and path in ("/sleep", "/wake_up"):
                self._answer(500, _error("Sleep mode is not enabled: start the server with --enable-sleep-mode", 500))
                return
            if path == "/collective_rpc":
                try:
                    method = json.loads(raw or b"{}").get("method")
                except (ValueError, AttributeError):
                    method = None
                if method != "reload_weights":
                    self._answer(500, _error(f"unknown collective_rpc method {method!r}", 500))
                    return
                with sleep_.lock:
                    sleep_.weights_loaded = True
                log("INFO", "collective_rpc reload_weights: weights reloaded from the checkpoint")
                self._answer(200, {"results": [None] * tp})
                return
            with sleep_.lock:
                if path == "/sleep":
                    self._sleep(query)
                else:
                    self._wake(query)

        def _sleep(self, query: dict[str, list[str]]) -> None:
            try:
                level = int((query.get("level") or ["1"])[0])
                assert level in (1, 2)
            except (ValueError, AssertionError):
                self._answer(400, _error("level must be 1 or 2", 400))
                return
            if self.mode.sleep_fail:
                self._answer(500, _error(f"fake sleep failure ({MODE_ENV}=sleep-fail)", 500, "InternalServerError"))
                return
            if sleep_.sleeping:
                self._answer(200, {})
                return
            aborted = engine.abort_all()
            time.sleep(self.mode.sleep_delay_s)
            if sleep_.cuda is not None:
                sleep_.cuda.sleep()
            sleep_.level, sleep_.weights_awake, sleep_.kv_awake = level, False, False
            with engine.cond:
                engine.blocks.clear()  # the KV cache is discarded, and with it the prefix cache
            log(
                "INFO",
                f"It took {self.mode.sleep_delay_s:.6f} seconds to fall asleep (level {level}); "
                f"{aborted} request(s) in flight aborted",
            )
            self._answer(200, {})

        def _wake(self, query: dict[str, list[str]]) -> None:
            tags = set(query.get("tags") or ["weights", "kv_cache"])
            if not tags <= {"weights", "kv_cache"}:
                self._answer(400, _error(f"unknown tags {sorted(tags)}: weights, kv_cache", 400))
                return
            if self.mode.wake_fail:
                self._answer(500, _error(f"fake wake failure ({MODE_ENV}=wake-fail)", 500, "InternalServerError"))
                return
            if not sleep_.sleeping:
                self._answer(200, {})
                return
            time.sleep(self.mode.wake_delay_s)
            if "weights" in tags and not sleep_.weights_awake:
                sleep_.weights_awake = True
                sleep_.weights_loaded = sleep_.level == 1  # level 2 discarded them: reload_weights brings them
            if "kv_cache" in tags:
                sleep_.kv_awake = True
            if not sleep_.sleeping and sleep_.cuda is not None:
                sleep_.cuda.wake()
            log("INFO", f"It took {self.mode.wake_delay_s:.6f} seconds to wake up tags {sorted(tags)}")
            self._answer(200, {})

        def do_POST(self) -> None:
            self.mode = switches.mode
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path, _, qs = self.path.partition("?")
            if sleep_served and path in ("/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache"):
                self._sleep_call(path, urllib.parse.parse_qs(qs), raw)
                return
            if path in ("/pause", "/resume") and settings is not None and settings.enable_pause:
                if path == "/resume":
                    engine.resume()
                    log("INFO", "resumed: requests are admitted again")
                    self._answer(200, {})
                    return
                wait = (urllib.parse.parse_qs(qs).get("wait_for_inflight_requests") or ["false"])[0] == "true"
                drained = engine.pause(wait=wait)
                log("INFO", f"paused ({'requests in flight finished' if wait else 'requests in flight aborted'})")
                self._answer(200 if drained else 504, {})
                return
            if self.path == "/fake/release":
                self._answer(200, {"released": engine.release()})
                return
            if self.path == "/fake/mode":
                # The switches, changed while it runs: one server breaks each probe in turn (tests, the demo).
                try:
                    text = json.loads(raw or b"{}").get("mode", "")
                    switches.mode = parse_mode(str(text))
                except (ValueError, AttributeError) as exc:
                    self._answer(400, _error(str(exc), 400))
                    return
                log("INFO", f"switches now: {switches.mode}")
                self._answer(200, {"mode": str(switches.mode)})
                return
            if self.path not in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
                self._answer(404, {"detail": "Not Found"})
                return
            if not health.ready:
                self._answer(503, {"status": "starting"})
                return
            if sleep_.sleeping:
                self._answer(503, _error("The engine is sleeping: POST /wake_up first", 503, "ServiceUnavailableError"))
                return
            try:
                body = json.loads(raw or b"{}")
                assert isinstance(body, dict)
            except (ValueError, AssertionError):
                self._answer(400, _error("the request body is not a JSON object", 400))
                return
            if body.get("model") not in (health.names or (health.model,)):
                self._answer(404, _error(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError"))
                return
            if self.mode.chat_error:
                self._answer(500, _error(f"fake engine error ({MODE_ENV}=chat-error)", 500, "InternalServerError"))
                return
            if self.mode.fail_request and self.mode.fail_request in _prompt_text(body):
                self._answer(
                    500,
                    _error(
                        f"fake engine error ({MODE_ENV}=fail-request={self.mode.fail_request})",
                        500,
                        "InternalServerError",
                    ),
                )
                return
            lookup = engine.cache_prompt(prompt_words(body))
            aborts = engine.abort_gen
            engine.admit()
            kv_block = None  # CUDA mode: the GPU memory this request's KV cache takes while it runs
            try:
                hold = body.get("fake_hold_s")
                if isinstance(hold, (int, float)) and hold > 0:
                    engine.hold(float(hold))
                elif self.mode.hold_requests:
                    engine.hold(3600.0)
                if self.mode.slow_chat_s:
                    time.sleep(self.mode.slow_chat_s)
                if engine.abort_gen != aborts:
                    self._answer(500, _error("Request aborted: the engine was put to sleep", 500, "AbortError"))
                    return
                if not sleep_.weights_loaded:
                    # level 2 woke its weights without reloading them: the model speaks garbage, as vLLM's would
                    self.mode = dataclasses.replace(self.mode, wrong_text=True)
                if sleep_.cuda is not None and pace.cuda_token_kib:
                    kv_block = sleep_.cuda.take_kib(lookup.tokens * pace.cuda_token_kib)
                pace.prefill(lookup)
                if self.path == "/v1/responses":
                    rid = f"resp_fake{next(counter)}"
                    self._answer(200, responses_body(rid, body, model=health.model, mode=self.mode))
                    return
                chat = self.path == "/v1/chat/completions"
                call = tool_call(body, mode=self.mode) if chat and body.get("tools") else None
                last = (body.get("messages") or [{}])[-1] if chat else {}
                if isinstance(last, dict) and last.get("role") == "tool":
                    call = None  # the tool answered: now the model speaks
                text = "" if call else answer_text(body, model=health.model, mode=self.mode)
                paced = settings is not None and settings.tokens_per_s > 0
                if paced and isinstance(body.get("max_tokens"), int) and not call:
                    text = " ".join(["tok"] * max(1, min(int(body["max_tokens"]), 100_000)))  # type: ignore[call-overload]
                rid = f"{'chatcmpl' if chat else 'cmpl'}-fake{next(counter)}"
                thinking = REASONING_WORDS * (pace.reasoning_tokens // len(REASONING_WORDS) + 1)
                reasoning = thinking[: pace.reasoning_tokens] if chat and call is None else []
                engine.speculate(len(reasoning) + len(text.split()))
                if body.get("stream"):
                    self._stream(rid, text, chat=chat, call=call, reasoning=reasoning, lookup=lookup, body=body)
                else:
                    pace.decode(len(reasoning) + len(text.split()))
                    answer = _completion(rid, text, body, model=health.model, chat=chat, call=call, lookup=lookup)
                    if reasoning:
                        answer["choices"][0]["message"]["reasoning"] = " ".join(reasoning)  # type: ignore[index]
                        answer["usage"]["completion_tokens"] += len(reasoning)  # type: ignore[index]
                        answer["usage"]["total_tokens"] += len(reasoning)  # type: ignore[index]
                    self._answer(200, answer)
            finally:
                engine.finish()
                if kv_block is not None and sleep_.cuda is not None:
                    sleep_.cuda.give_back(kv_block)

        def _metrics(self) -> None:
            label = f'engine="0",model_name="{health.model}"'
            with engine.cond:
                running, waiting = engine.running, engine.waiting
                queries, hits = engine.prefix_queries, engine.prefix_hits
                tiers = _tier_metrics(engine, label) if engine.offload_blocks else ""
                spec = _spec_metrics(engine, label) if engine.spec_k else ""
            asleep = sleep_.state()
            text = (
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{label}}} {float(running)}\n"
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{label}}} {float(waiting)}\n"
                "# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.\n"
                "# TYPE vllm:prefix_cache_queries counter\n"
                f"vllm:prefix_cache_queries_total{{{label}}} {float(queries)}\n"
                "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.\n"
                "# TYPE vllm:prefix_cache_hits counter\n"
                f"vllm:prefix_cache_hits_total{{{label}}} {float(hits)}\n"
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f"vllm:kv_cache_usage_perc{{{label}}} {running / engine.max_num_seqs}\n"
                + (
                    # The offload connector's transfers: every prompt block stored, every prefix hit loaded back
                    # (OFFLOAD_TOKEN_BYTES a token), with --kv-offloading-size only.
                    "# HELP vllm:kv_offload_store_bytes Bytes stored from GPU to the offload medium.\n"
                    "# TYPE vllm:kv_offload_store_bytes counter\n"
                    f"vllm:kv_offload_store_bytes_total{{{label}}} {float(queries * OFFLOAD_TOKEN_BYTES)}\n"
                    "# HELP vllm:kv_offload_load_bytes Bytes loaded from the offload medium to GPU.\n"
                    "# TYPE vllm:kv_offload_load_bytes counter\n"
                    f"vllm:kv_offload_load_bytes_total{{{label}}} {float(hits * OFFLOAD_TOKEN_BYTES)}\n"
                    if settings.offload_bytes
                    else ""
                )
                + tiers
                + spec
                # vLLM's info gauge of its cache config (vllm/v1/metrics/loggers.py, log_metrics_info): the GPU
                # tier's size, num_gpu_blocks of block_size tokens.
                + "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="{PREFIX_BLOCK}",engine="0",'
                f'num_gpu_blocks="{engine.gpu_blocks}"}} 1.0\n'
                + "# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping.\n"
                "# TYPE vllm:engine_sleep_state gauge\n"
                + "".join(
                    f'vllm:engine_sleep_state{{{label},sleep_state="{state}"}} {float(state == asleep)}\n'
                    for state in SLEEP_STATES
                )
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def _stream(
            self,
            rid: str,
            text: str,
            *,
            chat: bool,
            call: dict[str, object] | None = None,
            reasoning: Sequence[str] = (),
            lookup: Lookup | None = None,
            body: dict[str, object] | None = None,
        ) -> None:
            """Server-sent events as vLLM sends them: a role chunk, reasoning chunks (``reasoning``, as vLLM's
            DeltaMessage), content chunks (or a tool call: its name, then its arguments in pieces), a finish chunk,
            with ``stream_options.include_usage`` a chunk of usage alone, [DONE]. Tokens come at the decode speed.
            ``broken-stream`` ends after the first pieces."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            words = [w + " " for w in text.split(" ")]
            words[-1] = words[-1][:-1]
            pieces: list[tuple[dict[str, object], object]] = []
            if chat:
                pieces.append(({"role": "assistant", "content": ""}, None))
            pieces += [({"reasoning": w + " "}, None) for w in reasoning]
            if call is not None:
                args = str(call["arguments"])
                pieces.append(
                    (
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": f"chatcmpl-tool-{rid[-8:]}",
                                    "type": "function",
                                    "function": {"name": call["name"], "arguments": ""},
                                }
                            ]
                        },
                        None,
                    )
                )
                pieces += [
                    ({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 8]}}]}, None)
                    for i in range(0, len(args), 8)
                ]
                pieces.append(({}, "tool_calls"))
            else:
                pieces += [({"content": w}, None) for w in words]
                pieces.append(({}, "stop"))
            if self.mode.broken_stream:
                # The connection ends mid-answer (a tool call: mid-arguments), without a finish chunk or [DONE].
                pieces = pieces[: 3 if call is not None else 2]
            first_at = time.monotonic()
            token = 0
            for delta, finish in pieces:
                if delta.get("reasoning") or delta.get("content") or delta.get("tool_calls"):
                    pace.wait_token(first_at, token)
                    token += 1
                if chat:
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": delta.get("content", ""), "logprobs": None, "finish_reason": finish}
                chunk = {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": health.model,
                    "choices": [choice],
                }
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            options = (body or {}).get("stream_options")
            if isinstance(options, dict) and options.get("include_usage") is True and not self.mode.broken_stream:
                usage = _usage(lookup, len(reasoning) + (0 if call is not None else len(text.split())))
                chunk = {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": health.model,
                    "choices": [],
                    "usage": usage,
                }
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if not self.mode.broken_stream:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode() if body else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # health polls every few hundred ms would drown the log

    class Server(http.server.ThreadingHTTPServer):
        # socketserver's default backlog of 5 resets the connections of a batch of 20 arriving at once; vLLM's
        # uvicorn listens with 2048.
        request_queue_size = 2048

    server = Server((host, port), Handler)
    server.daemon_threads = True
    return server


def _tier_metrics(engine: Engine, label: str) -> str:
    """The offload tier's counters under vLLM's names: the connector's prefix cache (vllm/v1/metrics/loggers.py) and
    the offloading connector's transfers by direction (its OffloadPromMetrics: vllm:kv_offload_total_bytes and
    vllm:kv_offload_total_time, label transfer_type). Called with ``engine.cond`` held."""
    lines = [
        "# HELP vllm:external_prefix_cache_queries External prefix cache queries from KV connector "
        "cross-instance cache sharing, in terms of number of queried tokens.",
        "# TYPE vllm:external_prefix_cache_queries counter",
        f"vllm:external_prefix_cache_queries_total{{{label}}} {float(engine.external_queries)}",
        "# HELP vllm:external_prefix_cache_hits External prefix cache hits from KV connector "
        "cross-instance cache sharing, in terms of number of cached tokens.",
        "# TYPE vllm:external_prefix_cache_hits counter",
        f"vllm:external_prefix_cache_hits_total{{{label}}} {float(engine.external_hits)}",
        "# HELP vllm:kv_offload_total_bytes Number of bytes offloaded by KV connector",
        "# TYPE vllm:kv_offload_total_bytes counter",
        *(
            f'vllm:kv_offload_total_bytes_total{{{label},transfer_type="{t}"}} {float(n)}'
            for t, n in sorted(engine.bytes.items())
        ),
        "# HELP vllm:kv_offload_total_time Total time measured by all KV offloading operations",
        "# TYPE vllm:kv_offload_total_time counter",
        *(
            f'vllm:kv_offload_total_time_total{{{label},transfer_type="{t}"}} {x}'
            for t, x in sorted(engine.seconds.items())
        ),
    ]
    return "\n".join(lines) + "\n"


def _spec_metrics(engine: Engine, label: str) -> str:
    """Speculative decoding's counters under vLLM's names (vllm/v1/spec_decode/metrics.py, SpecDecodingProm).
    Called with ``engine.cond`` held."""
    out = []
    for name, doc, value in (
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", engine.spec_drafts),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", engine.spec_draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", engine.spec_accepted),
    ):
        out += [f"# HELP {name} {doc}", f"# TYPE {name} counter", f"{name}_total{{{label}}} {float(value)}"]
    return "\n".join(out) + "\n"


def _error(message: str, code: int, kind: str = "BadRequestError") -> dict[str, object]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


def _usage(lookup: Lookup | None, completion_tokens: int) -> dict[str, object]:
    """vLLM's usage: prompt and completion tokens, and the prompt tokens served from the prefix cache (either tier)
    as ``prompt_tokens_details.cached_tokens``."""
    prompt_tokens = lookup.tokens if lookup is not None else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": lookup.cached if lookup is not None else 0},
    }


def _completion(
    rid: str,
    text: str,
    body: dict[str, object],
    *,
    model: str,
    chat: bool,
    call: dict[str, object] | None = None,
    lookup: Lookup | None = None,
) -> dict[str, object]:
    usage = _usage(lookup or Lookup(len(prompt_words(body))), len(text.split()))
    if chat and call is not None:
        calls = [{"id": f"chatcmpl-tool-{rid[-8:]}", "type": "function", "function": call}]
        choice: dict[str, object] = {
            "index": 0,
            "message": {"role": "assistant", "content": None, "tool_calls": calls},
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    elif chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "stop",
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


@dataclasses.dataclass
class Worker:
    rank: int
    pid: int
    ready_fd: int  # read end of the worker's pipe; -1 once it hit EOF
    mapped: bool = False
    exit_status: int | None = None  # as from os.waitpid, once reaped


def spawn_worker(*, rank: int, settings: Settings, server: http.server.ThreadingHTTPServer) -> Worker:
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            server.socket.close()  # the port belongs to the API process only
            # Die with the API process: a host-process test killing it must not leave workers mapping the file.
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)
            code = run_worker(rank=rank, settings=settings, ready_fd=write_fd)
        except BaseException:  # noqa: BLE001 - a forked worker ends in os._exit whatever happened
            # os._exit below would swallow the traceback; the log is all an operator has.
            os.write(sys.stdout.fileno(), traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    return Worker(rank=rank, pid=pid, ready_fd=read_fd)


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def stop_workers(workers: Sequence[Worker], *, grace_s: float) -> None:
    """SIGTERM every live worker, SIGKILL the ones still there after ``grace_s``, reap all."""
    for w in workers:
        if w.exit_status is None:
            os.kill(w.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for w in workers:
        while w.exit_status is None:
            pid, status = os.waitpid(w.pid, os.WNOHANG)
            if pid:
                w.exit_status = status
            elif time.monotonic() > deadline:
                os.kill(w.pid, signal.SIGKILL)
                w.exit_status = os.waitpid(w.pid, 0)[1]
            else:
                time.sleep(0.01)


def serve(settings: Settings) -> int:
    """The API-server process: spawn workers, flip /health when all mapped, handle stop and crash."""
    log("INFO", f"vLLM API server version {VERSION}")
    log(
        "INFO",
        f"args: model={settings.model!r} tensor_parallel_size={settings.tensor_parallel_size} "
        f"kv_offloading_size={settings.offload_bytes / GIB:g} GiB shm_dir={settings.shm_dir!r} "
        f"engine_id={settings.engine_id!r} mode={settings.mode}",
    )
    if settings.ignored_args:
        log("WARNING", f"ignoring options this stand-in does not model: {' '.join(settings.ignored_args)}")
    if settings.mode.fail_start:
        log("ERROR", f"Engine core initialization failed: fake failure at start ({MODE_ENV}=fail-start)")
        return 1
    if settings.offload_bytes and not os.path.isdir(settings.shm_dir):
        log(
            "ERROR",
            f"shm dir {settings.shm_dir!r} is not a directory: create it or pass --shm-dir "
            "(or $FAKE_VLLM_SHM_DIR); in a container, mount the host's shm dir there (--ipc=host or -v)",
        )
        return 1

    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    names = settings.served_names or (settings.model,)
    health = Health(model=names[0], names=names)
    if settings.enable_sleep_mode and not settings.dev_mode:
        log("WARNING", f"--enable-sleep-mode without {DEV_MODE_ENV}=1: the sleep endpoints are not served")
    sleep = Sleep()
    try:
        server = make_server(
            host=settings.host,
            port=settings.port,
            health=health,
            mode=settings.mode,
            engine=Engine(
                settings.max_num_seqs,
                gpu_cache_tokens=settings.gpu_cache_tokens,
                offload_cache_tokens=settings.offload_cache_tokens,
                spec_draft_tokens=settings.spec_draft_tokens,
                spec_acceptance=settings.spec_acceptance,
            ),
            settings=settings,
            sleep=sleep,
        )
    except OSError as exc:
        log("ERROR", f"cannot listen on {settings.host}:{settings.port}: {exc}; pick another --port")
        return 1
    workers = [spawn_worker(rank=r, settings=settings, server=server) for r in range(settings.tensor_parallel_size)]
    # Started only after the forks so no worker inherits a thread in the middle of a request.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    port = server.server_address[1]
    log("INFO", f"Uvicorn running on http://{settings.host}:{port} (Press CTRL+C to quit)")

    mapped_at: float | None = None
    try:
        while True:
            if stopping.is_set():
                return shutdown(settings, workers)
            open_fds = [w.ready_fd for w in workers if w.ready_fd >= 0]
            readable = select.select(open_fds, [], [], POLL_S)[0] if open_fds else []
            for w in workers:
                if w.ready_fd in readable:
                    data = os.read(w.ready_fd, 16)
                    if data:
                        w.mapped = True
                    else:
                        os.close(w.ready_fd)
                        w.ready_fd = -1
            for w in workers:
                if w.exit_status is None:
                    pid, status = os.waitpid(w.pid, os.WNOHANG)
                    if pid:
                        w.exit_status = status
                        if not stopping.is_set():
                            return worker_died(w, workers)
            if mapped_at is None and all(w.mapped for w in workers):
                mapped_at = time.monotonic()
                log(
                    "INFO",
                    f"All {len(workers)} workers ready"
                    + (f"; {settings.offload_path} mapped by each" if settings.offload_bytes else ""),
                )
                if settings.offload_bytes and settings.mode.unlink_mapped:
                    os.unlink(settings.offload_path)
                    log(
                        "INFO",
                        f"Unlinked {settings.offload_path} once every worker mapped it ({MODE_ENV}=unlink-mapped)",
                    )
                crash_after = settings.mode.crash_after_s
                if settings.mode.never_healthy:
                    log("WARNING", f"never becoming healthy ({MODE_ENV}=never-healthy)")
                elif crash_after is None or crash_after > 0:
                    if settings.cuda_mib:
                        sleep.cuda = Cuda(settings.cuda_mib, settings.cuda_residual_mib)
                        sleep.cuda.wake()
                        log("INFO", f"CUDA mode: {settings.cuda_mib} MiB held on the GPU (pid {os.getpid()})")
                    health.ready = True
                    log("INFO", "Application startup complete.")
            crash_after = settings.mode.crash_after_s
            if mapped_at is not None and crash_after is not None and time.monotonic() - mapped_at >= crash_after:
                crash(settings, workers)
    finally:
        server.server_close()


def shutdown(settings: Settings, workers: Sequence[Worker]) -> int:
    log("INFO", "Shutting down FastAPI HTTP server.")
    stop_workers(workers, grace_s=WORKER_STOP_GRACE_S)
    if settings.offload_bytes:
        try:
            os.unlink(settings.offload_path)
            log("INFO", f"Removed native KV offload buffer {settings.offload_path}")
        except FileNotFoundError:
            pass  # stopped before worker 0 created it
    log("INFO", "Application shutdown complete.")
    return 0


def worker_died(dead: Worker, workers: Sequence[Worker]) -> int:
    # The file stays: a failed start leaves its (partly prefaulted) buffer behind, as in the field report.
    log("ERROR", f"Worker TP{dead.rank} (pid {dead.pid}) died: {describe_status(dead.exit_status or 0)}")
    stop_workers(workers, grace_s=WORKER_STOP_GRACE_S)
    log(
        "ERROR",
        f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): TP{dead.rank}",
    )
    return 1


def crash(settings: Settings, workers: Sequence[Worker]) -> None:
    log(
        "ERROR",
        f"fake crash ({MODE_ENV}=crash-after={settings.mode.crash_after_s:g}): killing workers, "
        "exiting without cleanup" + (f"; {settings.offload_path} is left behind" if settings.offload_bytes else ""),
    )
    for w in workers:
        if w.exit_status is None:
            os.kill(w.pid, signal.SIGKILL)
    os._exit(CRASH_EXIT_CODE)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ)
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
