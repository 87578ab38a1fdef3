"""What a lane's own server says of itself (reconciler/observe/lanes.py): vLLM's release from ``GET /version`` and its
gauges from ``/metrics``, parsed from captured text, read over real HTTP from the fake vLLM as a host process, shown
in ``status`` (text and ``--json``'s per-container ``vllm``) and re-exported by the loop as ``reconciler_lane_*``
with recipe and slot labels, on the real engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import Root, free_port, http_status, wait_until
from prometheus_client.parser import text_string_to_metric_families

from reconciler.loop.metrics import Metrics
from reconciler.observe.lanes import LaneReading, parse_lane_metrics, parse_version, read_lane

FAKE = Path(__file__).resolve().parents[2] / "examples" / "fake-vllm" / "fake_vllm.py"

# Two engines of one server (data parallel), as vLLM's exposition prints them: the gauges are summed.
CAPTURED = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:kv_offload_store_bytes Bytes stored.
# TYPE vllm:kv_offload_store_bytes counter
vllm:kv_offload_store_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 4096.0
# HELP vllm:kv_offload_load_bytes Bytes loaded.
# TYPE vllm:kv_offload_load_bytes counter
vllm:kv_offload_load_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 1024.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 1.0
"""


def test_the_gauges_are_parsed_from_vllms_exposition() -> None:
    assert parse_lane_metrics(CAPTURED) == {
        "requests_running": 5.0,
        "requests_waiting": 7.0,
        "kv_cache_usage_ratio": 0.25,
        "offload_store_bytes": 4096.0,
        "offload_load_bytes": 1024.0,
        "sleeping": 1.0,
    }
    awake = CAPTURED.replace('awake"} 0.0', 'awake"} 1.0').replace('offloaded"} 1.0', 'offloaded"} 0.0')
    assert parse_lane_metrics(awake)["sleeping"] == 0.0  # type: ignore[index]
    assert parse_lane_metrics("# an older vLLM\nvllm:num_requests_running 1\n") == {"requests_running": 1.0}
    assert parse_lane_metrics("<html>not an exposition</html>\n{") is None


LEGACY = """\
# HELP vllm:kv_offload_total_bytes Number of bytes transferred.
# TYPE vllm:kv_offload_total_bytes counter
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 8192.0
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 2048.0
"""


def test_an_older_vllms_offload_counter_by_transfer_type_is_read_and_never_counted_twice() -> None:
    """Releases before the flat store and load counters count both directions in one counter labelled by
    transfer_type; later ones keep it beside the flat ones, deprecated: the flat ones win, never a sum of both."""
    assert parse_lane_metrics(LEGACY) == {"offload_store_bytes": 8192.0, "offload_load_bytes": 2048.0}
    both = parse_lane_metrics(CAPTURED + LEGACY)
    assert both is not None
    assert (both["offload_store_bytes"], both["offload_load_bytes"]) == (4096.0, 1024.0)


@pytest.mark.parametrize(
    ("body", "version"),
    [
        (b'{"version": "0.11.2"}', "0.11.2"),
        (b'{"version": ""}', None),
        (b'{"version": 11}', None),
        (b"[]", None),
        (b"\xff\xfe", None),
        (b"not json", None),
    ],
)
def test_the_version_is_vllms_answer_or_none(body: bytes, version: str | None) -> None:
    assert parse_version(body) == version


@pytest.fixture
def fake_lane(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    log = open(tmp_path / "fake.log", "wb")  # noqa: SIM115 - the child's log, closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE),
            "serve",
            "fake/lane",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--kv-offloading-size",
            "0.001",
            "--shm-dir",
            str(tmp_path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "FAKE_VLLM_VERSION": "0.11.2"},
    )
    try:
        wait_until(lambda: http_status(f"http://127.0.0.1:{port}/health") == 200, timeout=10, what="health 200")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_a_running_servers_version_and_gauges_are_read_over_http(fake_lane: int) -> None:
    origin = f"http://127.0.0.1:{fake_lane}"
    r = read_lane(container="c", recipe="r", slots=("a", "b"), origin=origin, metrics_url=f"{origin}/metrics")
    assert r.error is None and r.version == "0.11.2"
    assert (
        r.to_json()["gauges"]
        == r.gauges
        == {
            "requests_running": 0.0,
            "requests_waiting": 0.0,
            "kv_cache_usage_ratio": 0.0,
            "offload_store_bytes": 0.0,
            "offload_load_bytes": 0.0,
            "sleeping": 0.0,
        }
    )


def test_a_lane_that_does_not_answer_says_why() -> None:
    origin = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    r = read_lane(container="c", recipe="r", slots=("a",), origin=origin, metrics_url=f"{origin}/metrics")
    assert time.monotonic() - t0 < 5
    assert r.version is None and r.gauges == {}
    assert (
        r.error is not None and f"{origin}/version did not answer" in r.error and "/metrics did not answer" in r.error
    )


def scrape(m: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_the_loop_re_exports_each_lanes_gauges_and_drops_a_lane_gone() -> None:
    m = Metrics(process_metrics=False)
    lane = {"recipe": "v4", "slot": "dark-compute-a,dark-compute-b"}
    m.observe_lanes(
        [
            LaneReading(
                "c1", "v4", ("dark-compute-a", "dark-compute-b"), "0.11.2", {"requests_running": 2.0, "sleeping": 0.0}
            )
        ]
    )
    got = scrape(m)
    assert got[("reconciler_lane_info", frozenset({**lane, "vllm_version": "0.11.2"}.items()))] == 1
    assert got[("reconciler_lane_up", frozenset(lane.items()))] == 1
    assert got[("reconciler_lane_requests_running", frozenset(lane.items()))] == 2
    # The sleep state is reconciler_lane_sleeping{recipe,slots}, from the lane's own GET /is_sleeping: not re-exported.
    assert ("reconciler_lane_sleeping", frozenset(lane.items())) not in got
    # A gauge the lane no longer shows is absent, never 0; a lane that does not answer is up 0.
    m.observe_lanes([LaneReading("c1", "v4", ("dark-compute-a", "dark-compute-b"), None, {}, "no answer")])
    got = scrape(m)
    assert ("reconciler_lane_requests_running", frozenset(lane.items())) not in got
    assert got[("reconciler_lane_up", frozenset(lane.items()))] == 0
    assert got[("reconciler_lane_info", frozenset({**lane, "vllm_version": ""}.items()))] == 1
    m.observe_lanes([])
    assert not [k for k in scrape(m) if k[0].startswith("reconciler_lane_")]


@pytest.mark.docker
@pytest.mark.root
def test_status_and_the_loops_metrics_show_the_lanes_version_and_gauges(root: Root, start_loop: Any) -> None:
    lane = root.recipe("deepseek-256k-offload", offload_mib=8, env={"FAKE_VLLM_VERSION": "0.11.2"})
    root.manifest((lane, ["dark-compute-a", "dark-compute-b"]))
    applied = root.apply()
    assert applied.rc == 0, applied
    name = root.cname(lane, "dark-compute-a", "dark-compute-b")
    status = root.status()
    [mine] = [c for c in status["containers"] if c["name"] == name]
    assert mine["vllm"]["version"] == "0.11.2" and mine["vllm"]["offload_file"] == "named"
    assert mine["vllm"]["error"] is None and mine["vllm"]["gauges"]["requests_running"] == 0
    text = root.cli("status")
    assert f"{name} (managed {lane}, running, vLLM 0.11.2)" in text.stdout, text.stdout

    loop = start_loop().started()
    slot = "dark-compute-a,dark-compute-b"
    wait_until(
        lambda: loop.metric("reconciler_lane_info", recipe=lane, slot=slot, vllm_version="0.11.2") == 1,
        timeout=20,
        what="reconciler_lane_info of the lane",
    )
    assert loop.metric("reconciler_lane_up", recipe=lane, slot=slot) == 1
    assert loop.metric("reconciler_lane_kv_cache_usage_ratio", recipe=lane, slot=slot) == 0
    # The enter's preflight probes sent prompts: the lane stored their blocks, and the loop shows its counter.
    stored = loop.metric("reconciler_lane_offload_store_bytes", recipe=lane, slot=slot)
    assert stored is not None and stored > 0
