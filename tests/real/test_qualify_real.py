"""``reconciler qualify`` whole, on the real engine: the demo's offload lane (the TP=2 fake vLLM) set to 6,000 tok/s
prefill and 130 tok/s decode with 40 reasoning tokens before content and a GPU prefix cache small enough that the
reload proof evicts request zero from it; ``qualify --ladder 32000,64000,120000 --reload --json`` as a process, its
record's figures against those speeds, and ``evidence --report`` rendering exactly the record's figures
(docs/design.md, "Qualification")."""

from __future__ import annotations

import json
import re
from pathlib import Path

from e2e_helpers import Root

PREFILL, DECODE = 6000, 130
GPU_CACHE_TOKENS = 48000  # under two of the reload proof's 32000-token prompts: request zero leaves the GPU tier


def _tables(markdown: str) -> list[list[list[str]]]:
    tables, cur = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cur.append([c.strip() for c in line.strip("|").split("|")])
        elif cur:
            tables.append(cur)
            cur = []
    return tables + ([cur] if cur else [])


def _num(cell: str) -> float:
    return float(re.sub(r"[^\d.]", "", cell))


def _lane(root: Root) -> str:
    lane = root.recipe(
        "deepseek-256k-offload",
        offload_mib=24,
        start_timeout_s=30,
        args=[
            "--fake-prefill-tok-s",
            str(PREFILL),
            "--fake-decode-tok-s",
            str(DECODE),
            "--fake-reasoning-tokens",
            "40",
            "--fake-gpu-cache-tokens",
            str(GPU_CACHE_TOKENS),
            "--fake-offload-cache-tokens",
            "400000",
        ],
    )
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    res = root.apply()
    assert res.rc == 0 and res.data["result"] == "converged", str(res)
    return lane


def test_qualify_the_offload_lane_whole_and_report_it(root: Root) -> None:
    lane = _lane(root)
    res = root.cli("qualify", lane, "--ladder", "32000,64000,120000", "--reload", "--json", timeout=400)
    assert res.rc == 0, str(res)
    rec = res.data
    assert rec["recipe"] == lane and rec["status"] == "passed", json.dumps(rec)[:4000]
    assert rec["recipe_hash"] and rec["image"] and rec["image_digest"], rec
    (run,) = rec["runs"]
    assert run["preflight"]["ok"], run["preflight"]
    assert [x["target_tokens"] for x in run["ladder"]] == [32000, 64000, 120000]
    for rung in run["ladder"]:
        assert rung["error"] is None, rung
        assert abs(rung["prompt_tokens"] - rung["target_tokens"]) <= 0.1 * rung["target_tokens"], rung
        assert rung["cached_tokens"] == 0, rung  # cold: a fresh haystack each rung
        assert abs(rung["prefill_tok_s"] - PREFILL) <= 0.1 * PREFILL, rung
        assert abs(rung["decode_tok_s"] - DECODE) <= 0.1 * DECODE, rung
        assert 0 < rung["ttfo_s"] < rung["ttft_s"] < rung["e2e_s"], rung  # reasoning comes before content
    rel = run["reload"]
    assert rel["proven"], json.dumps(rel)[:4000]
    assert "past the GPU tier" in rel["evicted_because"], rel["evicted_because"]
    assert rel["external_hits_tokens"]["before"] == 0 < rel["external_hits_tokens"]["after"], rel
    assert rel["cpu_to_gpu_bytes"]["before"] == 0 < rel["cpu_to_gpu_bytes"]["after"], rel
    gpu = rel["gpu_prefix_hits_tokens"]
    assert gpu["before"] == gpu["after"], gpu
    assert Path(rec["file"]).is_file()

    md = root.cli("evidence", lane, "--report", "--gates", json.dumps({"reload": "proven"}))
    assert md.rc == 0, str(md)
    identity, ladder, reload = _tables(md.stdout)
    assert dict(identity[2:])["Recipe hash"] == rec["recipe_hash"]
    assert dict(identity[2:])["Image digest"] == rec["image_digest"]
    for row, fig in zip(ladder[2:], run["ladder"], strict=True):
        assert row[0] == f"{fig['target_tokens'] // 1000}K"
        assert [_num(c) for c in row[1:]] == [
            fig["prompt_tokens"],
            fig["cached_tokens"],
            round(fig["ttfo_s"], 2),
            round(fig["ttft_s"], 2),
            round(fig["prefill_tok_s"]),
            round(fig["decode_tok_s"], 1),
            round(fig["e2e_s"], 2),
        ]
    assert reload[2:] == [
        [name, f"{int(rel[key]['before']):,}", f"{int(rel[key]['after']):,}"]
        for name, key in (
            ("Prefix queries (tokens)", "prefix_queries_tokens"),
            ("GPU prefix hits (tokens)", "gpu_prefix_hits_tokens"),
            ("External hits (tokens)", "external_hits_tokens"),
            ("CPU-to-GPU bytes", "cpu_to_gpu_bytes"),
        )
    ]
    assert "Verdict: proven" in md.stdout and "passes every gate: promotion allowed" in md.stdout
