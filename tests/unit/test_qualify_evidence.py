"""The qualification's pure parts: a stream's figures (TTFO at the first delta of any kind, first-visible TTFT at the
first content delta), vLLM's counters parsed by their own names (one not exported is absent, never 0), the gate
evaluation (each failed gate named with its figure; evidence of another hash never counts), the report's tables
compared with the record they render, and the record against its published schema."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema

from reconciler.apply.ladder import read_stream
from reconciler.apply.lane_counters import parse_counters
from reconciler.plan.gates import evaluate
from reconciler.service.evidence import LADDER_HEAD, render_report

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "evidence.schema.json").read_text())
GIB = 1 << 30


def rung(target: int, prompt: int, cached: int, ttfo: float, ttft: float, decode: float, e2e: float) -> dict[str, Any]:
    return {
        "target_tokens": target,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": 100,
        "ttfo_s": ttfo,
        "ttft_s": ttft,
        "prefill_tok_s": round(prompt / ttfo, 1),
        "decode_tok_s": decode,
        "e2e_s": e2e,
        "error": None,
        "counters": {"values": {}, "not_exported": [], "error": None},
    }


def record(**over: Any) -> dict[str, Any]:
    """The report's 256K qualification as a record."""
    run = {
        "started": 1.0,
        "status": "passed",
        "why": None,
        "preflight": {
            "ok": True,
            "planned": 2,
            "probes": [{"name": "smoke", "ok": True}, {"name": "json", "ok": True}],
        },
        "ladder": [
            rung(125000, 92754, 0, 14.10, 18.52, 133.8, 18.60),
            rung(192000, 193064, 4096, 30.77, 31.90, 126.5, 32.14),
            rung(250000, 249573, 5632, 43.75, 45.58, 135.2, 45.85),
        ],
        "reload": {
            "proven": True,
            "tokens": 150000,
            "eviction_prompts": [{}] * 6,
            "evicted_because": "682,044 prompt tokens queried since request zero, past the GPU tier's 506,283",
            "replay": {
                "prompt_tokens": 113674,
                "cached_tokens": 113408,
                "ttfo_s": 0.825,
                "ttft_s": 1.974,
                "e2e_s": 2.192,
            },
            "external_hits_tokens": {"before": 0, "after": 113408},
            "cpu_to_gpu_bytes": {"before": 0, "after": 1001721600},
            "cpu_to_gpu_seconds": {"before": 0, "after": 0.344},
            "gpu_prefix_hits_tokens": {"before": 500, "after": 500},
            "prefix_queries_tokens": {"before": 568370, "after": 682044},
            "counters": {"values": {}, "not_exported": [], "error": None},
        },
        "spec": {"draft_tokens": 2320, "accepted_tokens": 1203, "acceptance": 0.5185},
        "vram": {
            "dark-compute-a": {
                "min_free_bytes": int(1.25 * GIB),
                "total_bytes": 96 * GIB,
                "reserve_bytes": 3 * GIB,
                "below_reserve": True,
                "during": "rung 250000",
                "at": 2.0,
                "samples": 9,
            },
            "dark-compute-b": {
                "min_free_bytes": 5 * GIB,
                "total_bytes": 96 * GIB,
                "reserve_bytes": 3 * GIB,
                "below_reserve": False,
                "during": "rung 192000",
                "at": 2.0,
                "samples": 9,
            },
        },
    }
    out = {
        "recipe": "dsv4-256k-offload16",
        "recipe_hash": "abc123",
        "image": "anvil-vllm@sha256:331b",
        "image_digest": "sha256:331b",
        "model": "deepseek-ai/DeepSeek-V4-Flash-0731",
        "revision": "9e165c30",
        "host": "workstation",
        "machine": "ws",
        "cards": [
            {"slot": "dark-compute-a", "index": 0, "uuid": None},
            {"slot": "dark-compute-b", "index": 1, "uuid": None},
        ],
        "date": "2026-08-02T00:00:00Z",
        "started": 1.0,
        "reconciler_version": "0",
        "status": "passed",
        "runs": [run],
        "caveats": ["single-request capacity evidence, not concurrency proof"],
        "file": "f1",
    }
    out.update(over)
    return out


def test_the_record_meets_its_published_schema() -> None:
    jsonschema.validate(record(), SCHEMA)
    broken = record()
    del broken["runs"][0]["ladder"][0]["ttfo_s"]
    try:
        jsonschema.validate(broken, SCHEMA)
    except jsonschema.ValidationError as exc:
        assert "ttfo_s" in str(exc.message)
    else:
        raise AssertionError("a rung without ttfo_s passed the schema")


def test_ttfo_is_the_first_delta_of_any_kind_and_ttft_the_first_content() -> None:
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},  # the role chunk is no output
        {"choices": [{"delta": {"reasoning": "Let "}}]},
        {"choices": [{"delta": {"reasoning_content": "me "}}]},
        {"choices": [{"delta": {"content": "123"}}]},
        {"choices": [{"delta": {"content": "456"}}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 600, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 16}},
        },
    ]
    times = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    lines = [b"data: " + json.dumps(c).encode() for c in chunks] + [b"data: [DONE]"]
    fig = read_stream(lines, 0.0, clock=lambda: next(times))
    assert (fig.ttfo_s, fig.ttft_s, fig.last_s, fig.e2e_s) == (2.0, 4.0, 5.0, 7.0)
    assert (fig.prompt_tokens, fig.cached_tokens, fig.answer) == (600, 16, "123456")
    assert fig.prefill_tok_s == 300.0 and fig.decode_tok_s == 1.0  # 600 / 2 s; 3 tokens after the first in 3 s
    no_usage = read_stream([b"data: " + json.dumps(chunks[3]).encode()], 0.0, clock=iter([1.0, 2.0]).__next__)
    assert no_usage.prompt_tokens is None and no_usage.prefill_tok_s is None  # not reported, never guessed


def test_counters_by_vllms_names_and_one_not_exported_is_absent() -> None:
    text = (
        '# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine="0",model_name="m"} 500.0\n'
        "# TYPE vllm:kv_offload_total_bytes counter\n"
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 1001721600.0\n'
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 7.0\n'
        '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",num_gpu_blocks="31642"} 1.0\n'
    )
    got = parse_counters(text)
    assert got == {
        "gpu_prefix_hits_tokens": 500.0,
        "cpu_to_gpu_bytes": 1001721600.0,
        "gpu_to_cpu_bytes": 7.0,
        "gpu_tier_tokens": 506272.0,
    }
    assert "external_hits_tokens" not in got  # not exported: absent, not 0


def test_each_failed_gate_is_named_with_its_figure() -> None:
    gates = {
        "reserve_free_gib": 3,
        "preflight": "pass",
        "reload": "proven",
        "min_decode_tok_s": 130,
        "max_ttft_s": {250000: 40},
        "min_spec_acceptance": 0.6,
        "ladder_tokens": 250000,
        "repeat": 2,
    }
    verdict = evaluate([record()], "abc123", gates)
    assert not verdict.passed
    assert verdict.failures == (
        "reserve_free_gib: dark-compute-a had 1.25 GiB free at its lowest, during the 250000 rung; the gate is 3",
        "min_decode_tok_s: run 1, the 192000 rung measured 126.5; the gate is 130",
        "max_ttft_s: run 1, the 250000 rung's TTFT was 45.58 s; the gate is 40 s",
        "min_spec_acceptance: run 1 accepted 51.9% of draft tokens; the gate is 60.0%",
        "ladder_tokens: run 1 reached 249,573 prompt tokens; the gate is 250,000",
        "repeat: 1 passing run(s) of this hash; the gate is 2",
    )
    assert evaluate([record()], "abc123", {"preflight": "pass", "reload": "proven", "reserve_free_gib": 1}).passed


def test_evidence_of_another_hash_never_counts_and_a_failed_run_fails() -> None:
    verdict = evaluate([record()], "edited999", {"preflight": "pass"})
    assert not verdict.passed and "abc123" in verdict.failures[0] and "qualify it again" in verdict.failures[0]
    failed = record()
    failed["runs"][0].update(status="failed", why="the 250000 rung: HTTP 500")
    assert evaluate([failed], "abc123", {}).failures == ("runs: 1 of 1 run(s) failed (the 250000 rung: HTTP 500)",)
    assert evaluate([record()], "abc123", {"speed": 1}).failures[0].startswith("speed: no such gate")


def _tables(markdown: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cur.append([c.strip() for c in line.strip("|").split("|")])
        elif cur:
            tables.append(cur)
            cur = []
    return tables + ([cur] if cur else [])


def test_the_reports_tables_are_the_records_figures() -> None:
    rec = record()
    md = render_report(rec, current_hash="abc123", gates={"reserve_free_gib": 3})
    identity, ladder, reload = _tables(md)
    assert dict(identity[2:]) == {
        "Recipe": rec["recipe"],
        "Recipe hash": "abc123",
        "Model": rec["model"],
        "Model revision": rec["revision"],
        "Image": rec["image"],
        "Image digest": rec["image_digest"],
        "reconciler": "0",
    }
    assert ladder[0] == list(LADDER_HEAD)
    for row, fig in zip(ladder[2:], rec["runs"][0]["ladder"], strict=True):
        assert row[0] == f"{fig['target_tokens'] // 1000}K"
        nums = [float(re.sub(r"[^\d.]", "", cell)) for cell in row[1:]]
        assert nums == [
            fig["prompt_tokens"],
            fig["cached_tokens"],
            fig["ttfo_s"],
            fig["ttft_s"],
            round(fig["prefill_tok_s"]),
            fig["decode_tok_s"],
            fig["e2e_s"],
        ]
    rel = rec["runs"][0]["reload"]
    assert reload[2:] == [
        ["Prefix queries (tokens)", "568,370", "682,044"],
        ["GPU prefix hits (tokens)", "500", "500"],
        ["External hits (tokens)", "0", f"{rel['external_hits_tokens']['after']:,}"],
        ["CPU-to-GPU bytes", "0", f"{rel['cpu_to_gpu_bytes']['after']:,}"],
    ]
    assert "in 0.344 s" in md and "Verdict: proven" in md
    assert "challenger, no promotion:" in md
    assert (
        "- reserve_free_gib: dark-compute-a had 1.25 GiB free at its lowest, during the 250000 rung; the gate is 3"
        in md
    )
    assert "accepted 1,203 of 2,320 draft tokens (51.9%)" in md
    assert "- single-request capacity evidence, not concurrency proof" in md
    assert "(not the recipe's current hash)" in render_report(copy.deepcopy(rec), current_hash="other", gates=None)


def test_every_gate_has_one_judge_in_the_gates_table() -> None:
    """The gates are judged by a table (``_GATES``), one judge per key of ``GATE_KEYS``: a key added to one and not
    the other would be refused as unknown or fail with a KeyError."""
    from reconciler.plan.gates import _GATES, GATE_KEYS

    assert tuple(_GATES) == GATE_KEYS
