"""The probe kinds of the report's preflight and regression, over real HTTP against the fake vLLM as a host process:
each passes on a correct answer and fails, naming the probe and quoting what came back, on each wrong one the fake
is switched to (``POST /fake/mode``). Also the pieces they stand on: the seeded haystack, the JSON Schema checks
(jsonschema), vLLM's metrics read by prometheus-client's parser, and the VRAM sampler's verdict on scripted figures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.haystack import make_haystack
from reconciler.apply.probe_answers import schema_violations
from reconciler.apply.probes import run_probe
from reconciler.apply.vllm_metrics import parse_gauges, parse_samples
from reconciler.model import HostConfig, ProbeSpec, Recipe

FAKE = Path(__file__).resolve().parents[2] / "examples" / "fake-vllm" / "fake_vllm.py"
MODEL = "fake/kinds"

WEATHER = {
    "name": "get_weather",
    "description": "weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CLOCK = {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
}
ORDER = {
    "name": "lookup_order",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
}
ASK = "What is the weather in 'Paris'? Use get_weather."

PROBES: dict[str, dict[str, Any]] = {
    "tools": dict(kind="tools", prompt=ASK, tools=[WEATHER, CLOCK], function="get_weather", contains="Paris"),
    "streaming-tools": dict(kind="tools", prompt=ASK, tools=[WEATHER, CLOCK], function="get_weather", stream=True),
    "tool-result": dict(
        kind="tool-result",
        prompt="Weather in Paris?",
        tools=[WEATHER],
        arguments={"city": "Paris"},
        tool_result='{"temperature_c": 21, "sky": "clear"}',
        contains="21",
    ),
    "responses": dict(kind="responses", prompt="Reply with the single word: ready", matches="(?i)ready"),
    "responses-json": dict(
        kind="responses",
        prompt="2 + 2 as JSON",
        json_schema={
            "type": "object",
            "properties": {"answer": {"type": "integer", "minimum": 4, "maximum": 4}},
            "required": ["answer"],
        },
    ),
    "needle": dict(kind="needle", haystack_tokens=8192, depth=0.25, seed=3),
    "batch": dict(
        kind="batch",
        requests=20,
        prefix_tokens=2048,
        prompt="Look up the order 'ORD-{i}'.",
        tools=[ORDER],
        tool_choice="required",
        contains="ORD-{i}",
    ),
    "structured-json": dict(
        prompt="2 + 2 as JSON",
        json_schema={
            "type": "object",
            "properties": {"answer": {"type": "integer", "minimum": 4, "maximum": 4}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    ),
}


class Fake:
    def __init__(self, tmp: Path):
        self.log = tmp / "fake.log"
        with open(self.log, "wb") as log:  # the child has its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, str(FAKE), "serve", MODEL, "--host", "127.0.0.1", "--port", "0"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 15
        while not (m := re.search(r"Uvicorn running on http://[\d.]+:(\d+)", self.log.read_text())):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.log.read_text()
            time.sleep(0.02)
        self.port = int(m.group(1))
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.02)

    def mode(self, text: str) -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/fake/mode", method="POST", data=json.dumps({"mode": text}).encode()
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

    def recipe(self, **probes: dict[str, Any]) -> Recipe:
        return Recipe.model_validate(
            {
                "tensor_parallel_size": 1,
                "model": {"id": MODEL},
                "container": {"image": "x", "command": ["x"]},
                "health": {"url": f"http://127.0.0.1:{self.port}/health"},
                "probes": [{"name": name, **spec} for name, spec in probes.items()],
            }
        )


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fake]:
    f = Fake(tmp_path_factory.mktemp("fake"))
    yield f
    f.proc.kill()
    f.proc.wait(timeout=10)


def probe(fake: Fake, name: str, mode: str = "") -> Any:
    fake.mode(mode)
    try:
        r = fake.recipe(**{name: PROBES[name]})
        return run_probe(r.probes[0], r)
    finally:
        fake.mode("")


@pytest.mark.parametrize("name", sorted(PROBES))
def test_each_kind_passes_on_a_correct_answer(fake: Fake, name: str) -> None:
    res = probe(fake, name)
    assert res.ok, res.reason()
    assert res.to_json()["suite"] == "preflight"


# (probe, the fake's switch, what the reason must say) — the wrong answers of the report's checks.
WRONG = [
    ("tools", "wrong-tool", 'the answer calls \'get_time({"tz": "Paris"})\', not get_weather'),
    (
        "tools",
        "bad-tool-args",
        "the arguments of get_weather break its parameter schema ($: ['fake'] is not of type 'object'): '[\"fake\"]'",
    ),
    ("tools", "wrong-text,chat-error", 'HTTP 500, expected 200: \'{"object": "error"'),
    (
        "streaming-tools",
        "broken-stream",
        "the stream ended without closing its tool call (no finish_reason and no "
        "'data: [DONE]'); reassembled so far: 'get_weather({\"city\":",
    ),
    ("streaming-tools", "wrong-tool", "the answer calls 'get_time("),
    (
        "tool-result",
        "ignore-tool-result",
        "the answer does not use the tool's result (no '21' of "
        '\'{"temperature_c": 21, "sky": "clear"}\'): '
        "'I could not get that information.'",
    ),
    (
        "responses",
        "responses-empty",
        "the Responses answer has no output text (status 'completed', output items "
        "['reasoning']): '{\"id\": \"resp_fake",
    ),
    ("responses", "wrong-text", "the answer does not match /(?i)ready/: 'I cannot help with that.'"),
    ("needle", "needle-wrong", "the answer misses the needle"),
    ("batch", "fail-request='ORD-7'", "19/20 passed"),
    ("batch", "wrong-tool", "0/20 passed"),
    ("structured-json", "bad-json", "the answer is not JSON"),
]


@pytest.mark.parametrize(("name", "mode", "says"), WRONG, ids=[f"{n}-{m}" for n, m, _ in WRONG])
def test_each_kind_fails_on_a_wrong_answer_naming_the_probe_and_quoting_it(
    fake: Fake, name: str, mode: str, says: str
) -> None:
    res = probe(fake, name, mode)
    assert not res.ok, res
    reason = res.reason()
    assert reason.startswith(f"probe {name!r} ({PROBES[name].get('kind', 'chat')}) failed: "), reason
    assert says in reason, reason


def test_a_needle_failure_quotes_the_wrong_value_and_replays_from_its_seed(fake: Fake) -> None:
    hay = make_haystack(seed=3, tokens=8192, depth=0.25)
    res = probe(fake, "needle", "needle-wrong")
    wrong = "".join(str((int(c) + 1) % 10) for c in hay.answer)
    assert f"the answer misses the needle {hay.answer!r}" in res.detail and wrong in res.detail, res.detail
    assert "(a 8192-token haystack (seed 3, depth 0.25))" in res.detail, res.detail
    assert res.figures["seed"] == 3 and res.figures["words"] == hay.words


def test_a_batch_reports_n_of_n_latencies_and_the_prefix_cache(fake: Fake) -> None:
    res = probe(fake, "batch")
    f = res.figures
    assert f["requests"] == 20 and f["passed"] == 20 and 0 < f["p50_s"] <= f["p95_s"], f
    # Every request after the first finds the shared prefix cached (the fake counts as vLLM does, in blocks).
    assert f["prefix_cache"]["hits_tokens"] >= 19 * 2048 * 0.9, f
    assert re.search(
        r"^20/20 passed, p50 [\d.]+ s, p95 [\d.]+ s, prefix cache \d+ of \d+ prompt tokens hit", res.detail
    )
    failed = probe(fake, "batch", "fail-request='ORD-7'")
    assert "request 7 failed: HTTP 500" in failed.detail and "(and" not in failed.detail, failed.detail


# ---------------------------------------------------------------- the pieces


def test_the_haystack_is_made_from_its_seed_at_its_size_and_depth() -> None:
    a, b = make_haystack(seed=1, tokens=8192, depth=0.5), make_haystack(seed=1, tokens=8192, depth=0.5)
    assert a == b, "the same seed, the same haystack: a failure replays exactly"
    assert make_haystack(seed=2, tokens=8192, depth=0.5).text != a.text
    # About N tokens: a word or a period each, within one sentence of the size asked.
    assert 8192 - 16 <= a.words + a.text.count(".") <= 8192 + 16, a.words
    assert a.text.count(a.answer) == 1 and a.answer not in a.question
    for depth in (0.0, 0.5, 1.0):
        h = make_haystack(seed=1, tokens=4096, depth=depth)
        assert abs(h.needle_at / h.words - depth) < 0.02, (depth, h.needle_at, h.words)
    big = make_haystack(seed=128, tokens=128000, depth=0.5)
    assert 127900 <= big.words + big.text.count(".") <= 128100


def test_schema_violations_come_from_jsonschema_with_their_place() -> None:
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "maximum": 4},
            "items": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["answer"],
        "additionalProperties": False,
    }
    assert schema_violations({"answer": 4, "items": ["a"]}, schema) == []
    wrong = schema_violations({"answer": 5, "items": ["a", 3], "extra": 1}, schema)
    assert "$.answer: 5 is greater than the maximum of 4" in wrong
    assert "$.items[1]: 3 is not of type 'string'" in wrong
    assert any("'extra' was unexpected" in w for w in wrong), wrong


def test_a_recipes_schema_is_checked_by_the_meta_schema_and_misspelt_keywords_are_refused() -> None:
    ok = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}], "$defs": {"x": {"type": "string"}}}
    assert ProbeSpec(name="s", prompt="x", json_schema=ok).json_schema == ok
    for bad, says in (
        ({"type": "object", "properties": {"a": {"minimum": "4"}}}, "is not a valid JSON Schema"),
        ({"type": "object", "properties": {"a": {"maxium": 4}}}, "unknown JSON Schema keyword(s) maxium"),
        ({"type": "obj"}, "'obj' is not a JSON Schema type"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            ProbeSpec(name="s", prompt="x", json_schema=bad)


def test_a_recipes_schema_references_resolve_within_it_at_load() -> None:
    defs = {"$defs": {"n": {"type": "integer"}}}
    ok = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#"}}, **defs}
    assert ProbeSpec(name="s", prompt="x", json_schema=ok).json_schema == ok
    nested = {"$id": "https://example.com/outer", "properties": {"a": {"$ref": "outer#/$defs/n"}}, **defs}
    assert ProbeSpec(name="s", prompt="x", json_schema=nested).json_schema == nested
    for bad, at in (
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, **defs}, "properties.a.$ref"),
        ({"items": {"$ref": "https://example.com/elsewhere.json"}}, "items.$ref"),
        ({"allOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/nowhere"}], **defs}, "allOf[1].$ref"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"probes.json_schema.{at}") + ".*does not resolve within"):
            ProbeSpec(name="s", prompt="x", json_schema=bad)


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a}b"} 2.0
vllm:num_requests_running{engine="1",model_name="plain"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a}b"} 3.0
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="a}b"} 4096.0
vllm:prefix_cache_queries_created{engine="0",model_name="a}b"} 1.7e9
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="a}b"} 1024.0
"""


def test_vllm_metrics_are_read_with_prometheus_clients_parser_and_agree_with_it() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    # A label value holding '}' keeps its sample (a hand parser cut at the first '}' lost it).
    assert parse_gauges(VLLM_METRICS) == (3.0, 3.0)
    sums = parse_samples(VLLM_METRICS, ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"))
    assert sums == {"vllm:prefix_cache_queries": 4096.0, "vllm:prefix_cache_hits": 1024.0}
    expect: dict[str, float] = {}
    for fam in text_string_to_metric_families(VLLM_METRICS):
        for s in fam.samples:
            expect[s.name] = expect.get(s.name, 0.0) + s.value
    assert parse_gauges(VLLM_METRICS) == (expect["vllm:num_requests_running"], expect["vllm:num_requests_waiting"])
    assert parse_gauges("# nothing of vLLM here\nother_metric 1\n") is None
    assert parse_gauges("not { a metrics text") is None


# ---------------------------------------------------------------- free VRAM under load, on scripted figures


def test_the_sampler_keeps_each_cards_lowest_figure_with_the_probe_running_then() -> None:
    from reconciler.model import DesiredState
    from reconciler.plan.vram import VramSampler, load_reserve_verdict

    gib = 1 << 30
    host = HostConfig.model_validate(
        {
            "name": "h",
            "gpus": {"a": {"index": 0}, "b": {"index": 1}},
            "gpu_telemetry": "nvml",
            "gpu_reserve": {"free_gib": 3, "policy": "enforce"},
        }
    )
    figures = iter(
        [
            {"a": (100 * gib, 140 * gib), "b": (50 * gib, 140 * gib)},
            {"a": (2 * gib, 140 * gib), "b": (40 * gib, 140 * gib)},
            {"a": (9 * gib, 140 * gib), "b": (60 * gib, 140 * gib)},
        ]
    )
    clock = iter(range(100))
    sampler = VramSampler(lambda: next(figures), interval_s=3600, clock=lambda: float(next(clock)))
    with sampler:  # one sample as it starts...
        sampler.running("needle-128k")
        sampler.sample()
        sampler.running("tool-batch-20")
    # ...and one as it ends.
    desired = DesiredState(host=host, recipes={}, assignments=())
    v = load_reserve_verdict(desired, None, "regression", sampler, ("a", "b"))
    assert v.checked and v.failed and v.below == ("a",) and v.unknown == ()
    a = {s.slot: s for s in v.slots}["a"]
    assert (a.free_bytes, a.probe, a.samples) == (2 * gib, "needle-128k", 3)
    assert "a: 2.00 GiB free of 140.00 GiB at its lowest, during probe 'needle-128k'" in v.message()
    assert "below its 3.00 GiB reserve" in v.message()
    assert v.to_json()["slots"]["b"]["min_free_bytes"] == 40 * gib
    report = HostConfig.model_validate({**host.model_dump(), "gpu_reserve": {"free_gib": 3, "policy": "report"}})
    assert not load_reserve_verdict(
        DesiredState(host=report, recipes={}, assignments=()), None, "regression", sampler, ("a", "b")
    ).failed


def test_a_card_never_sampled_fails_under_enforce_and_without_telemetry_nothing_is_judged() -> None:
    from reconciler.model import DesiredState
    from reconciler.plan.vram import VramSampler, load_reserve_verdict

    host = HostConfig.model_validate(
        {"name": "h", "gpus": {"a": {"index": 0}}, "gpu_telemetry": "nvml", "gpu_reserve": {"policy": "enforce"}}
    )

    def broken() -> dict[str, tuple[int, int]]:
        raise RuntimeError("NVML: NVMLError_GpuIsLost: GPU is lost")

    with VramSampler(broken, interval_s=3600) as sampler:
        pass
    v = load_reserve_verdict(DesiredState(host=host, recipes={}, assignments=()), None, "preflight", sampler, ("a",))
    assert (
        v.failed
        and v.unknown == ("a",)
        and "a: free VRAM not sampled (RuntimeError: NVML: NVMLError_GpuIsLost" in v.message()
    )
    with VramSampler(None) as idle:
        pass
    v = load_reserve_verdict(DesiredState(host=host, recipes={}, assignments=()), None, "preflight", idle, ("a",))
    assert not v.checked and not v.failed
