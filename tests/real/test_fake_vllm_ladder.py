"""What the qualification ladder reads of the vLLM stand-in (examples/fake-vllm/fake_vllm.py), as a plain host
process over real HTTP: its set prefill and decode speeds, reasoning before content, usage with cached tokens, a GPU
prefix cache of a set size that evicts the least recently used block into an offload tier and loads it back from
there, and the counters of both tiers and of speculative decoding under vLLM's own names."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.real.test_fake_vllm import HostRun, health, wait_until

MODEL = "fake/ladder"


def stream(port: int, text: str) -> dict[str, object]:
    """One streamed chat request: when the first delta of any kind, the first content delta and the last came
    (seconds after the request), and the usage chunk."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 256,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.monotonic()
    out: dict[str, object] = {"first": None, "content": None, "last": None, "usage": None, "kinds": []}
    with urllib.request.urlopen(req, timeout=60) as resp:
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                out["usage"] = chunk["usage"]
            for choice in chunk["choices"]:
                delta = choice["delta"]
                kind = "reasoning" if delta.get("reasoning") else "content" if delta.get("content") else None
                if kind is None:
                    continue
                now = time.monotonic() - t0
                out["first"] = out["first"] or now
                out["last"] = now
                if kind == "content" and out["content"] is None:
                    out["content"] = now
                kinds = out["kinds"]
                assert isinstance(kinds, list)
                if not kinds or kinds[-1] != kind:
                    kinds.append(kind)
    return out


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[..., int]]:
    """fake_vllm.py as a host process with these arguments; its port once /health answers 200."""
    runs: list[HostRun] = []

    def start(*args: str) -> int:
        run = HostRun(args=args, log_path=tmp_path / f"fake-{len(runs)}.log")
        runs.append(run)
        port = run.port()
        wait_until(lambda: health(port) == 200, timeout=10, what="health 200")
        return port

    yield start
    for run in runs:
        run.close()


def counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:") and "_total" in line:
            name, value = line.rsplit(" ", 1)
            key = name.split("{")[0]
            if "transfer_type" in name:
                key += "/" + name.split('transfer_type="')[1].split('"')[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


def words(seed: int, n: int) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(n))


def test_speeds_reasoning_usage_tiers_and_spec_counters(tmp_path: Path, start_fake: Callable[..., int]) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    port = start_fake(
        *("vllm", "serve", MODEL, "--kv-offloading-size", "0.001", "--shm-dir", str(shm)),
        *("--fake-prefill-tok-s", "6000", "--fake-decode-tok-s", "130", "--fake-reasoning-tokens", "40"),
        *("--fake-gpu-cache-tokens", "3000", "--fake-spec-acceptance", "0.5"),
    )
    zero = stream(port, words(0, 1200))
    assert zero["kinds"] == ["reasoning", "content"]  # reasoning deltas first, then the answer
    first, content, last = (float(zero[k]) for k in ("first", "content", "last"))  # type: ignore[arg-type]
    assert first < content < last
    usage = zero["usage"]
    assert isinstance(usage, dict)
    assert usage["prompt_tokens"] == 1200 and usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert 0.18 <= first <= 0.26  # 1200 tokens at 6,000 tok/s
    decode = (usage["completion_tokens"] - 1) / (last - first)
    assert 117 <= decode <= 143, decode  # 130 tok/s within 10 %
    before = counters(port)
    assert before["vllm:external_prefix_cache_hits_total"] == 0
    assert before["vllm:kv_offload_total_bytes_total/CPU_to_GPU"] == 0
    # Two more distinct prompts push request zero's blocks out of the 3,000-token GPU tier into the offload tier.
    stream(port, words(1, 1200))
    stream(port, words(2, 1200))
    mid = counters(port)
    assert mid["vllm:kv_offload_total_bytes_total/GPU_to_CPU"] > 0
    replay = stream(port, words(0, 1200))
    after = counters(port)
    usage = replay["usage"]
    assert isinstance(usage, dict)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 1200}
    assert float(replay["first"]) < 0.1  # type: ignore[arg-type] # loaded back, not prefilled again
    assert after["vllm:prefix_cache_hits_total"] == mid["vllm:prefix_cache_hits_total"]  # GPU hits stay
    assert after["vllm:external_prefix_cache_hits_total"] - mid["vllm:external_prefix_cache_hits_total"] == 1200
    assert after["vllm:kv_offload_total_bytes_total/CPU_to_GPU"] == 1200 * 1024
    assert after["vllm:kv_offload_total_time_total/CPU_to_GPU"] > 0
    drafts, accepted = (
        after["vllm:spec_decode_num_draft_tokens_total"],
        after["vllm:spec_decode_num_accepted_tokens_total"],
    )
    assert drafts > 0 and abs(accepted / drafts - 0.5) < 0.05


def test_defaults_keep_the_old_answers(start_fake: Callable[..., int]) -> None:
    """Without the new options: no reasoning, at once, and no tier or spec counters (a lane without offload)."""
    port = start_fake("vllm", "serve", MODEL)
    got = stream(port, "hello there")
    assert got["kinds"] == ["content"]
    assert float(got["first"]) < 0.5  # type: ignore[arg-type]
    names = counters(port)
    assert "vllm:external_prefix_cache_hits_total" not in names
    assert "vllm:spec_decode_num_draft_tokens_total" not in names
