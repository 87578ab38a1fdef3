"""The machine-readable surface of a host, held by golden files (tests/data/golden/): the key paths of every
command's ``--json`` answer, the recipe hash and the spec hash of a fixed recipe (tests/data/golden/recipe-hash/; the
labels a lane gets, and what a running lane is compared with: a changed hash recreates every running lane), the set
of ``io.reconciler.*`` label keys,
and, on a real ``reconciler run``, the OpenAPI document its API serves, the metric and label names of its /metrics and
the MCP tools it offers with their schemas.

One root of the module's own (tests/e2e_helpers.py make_root, host ``e2e-golden-...``) on a tmpfs of its own, against
the real Docker engine, goes once through the states whose answers are held: an invalid manifest, a pending plan, an
enter (omni on slot A), a no-op, a recreate planned (never applied) of the lane as the fixed recipe, a blocked plan (a container the tool does not own on slot B), an owned and two
orphan offload files, a probe, a prune; then one loop on it serves the rest.

Key paths (``actions[].kind``: the objects of a list merged) leave values out; keys that are data (a recipe's name,
the host's name, the tmpfs's path) have this run's tag, host and path written TAG, HOST and SHM. A key added or
removed fails: ``GOLDEN_UPDATE=1 pytest tests/contract`` records a change made on purpose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from e2e_helpers import CliResult, LoopProcess, Root, free_port, http_get, make_root
from prometheus_client.parser import text_string_to_metric_families

from contract.golden import GOLDEN, check, check_json, check_lines, key_paths

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"
MIB = 1 << 20
TOKEN = "golden-token-" + "g" * 24
FIXED = GOLDEN / "recipe-hash" / "golden-fixed.toml"
# A real process that maps an offload file and keeps it mapped until its stdin closes.
HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
os.close(fd)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.read()
"""
# Lists whose objects come from the machine, not from the root: processes whose maps this machine's kernel does not
# let even root read (pid 1 of a microVM), and processes that ended during the scan. Their own key paths are held;
# the keys of their objects are not.
MACHINE_LISTS = ("uninspectable[]", "skipped[]")


@dataclass
class Host:
    root: Root
    answers: dict[str, CliResult] = field(default_factory=dict)
    fixed_hash: str = ""
    lane_labels: dict[str, str] = field(default_factory=dict)
    lane_hash: str = ""
    fixed_spec_hash: str = ""
    fixed_hash_planned: str = ""

    def run(self, name: str, *args: str, rc: int) -> CliResult:
        res = self.root.cli(*args, env={"RECONCILER_NO_LOOP": "1"})
        assert res.rc == rc, f"{name}: expected exit {rc}\n{res}"
        self.answers[name] = res
        return res

    def normal(self, text: str) -> str:
        return text.replace(str(self.root.shm), "SHM").replace(self.root.host, "HOST").replace(self.root.tag, "TAG")


def _require() -> bool:
    return os.environ.get("RECONCILER_REQUIRE_DOCKER") == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def tmpfs() -> Iterator[Path]:
    if os.geteuid() != 0:
        if _require():
            pytest.fail("tmpfs tests need root (mount -t tmpfs)")
        pytest.skip("tmpfs tests need root")
    d = Path(tempfile.mkdtemp(prefix="reconciler-golden-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, tmpfs: Path, docker_api: Any, image: str) -> Iterator[Host]:
    r = make_root(tmp_path_factory.mktemp("golden"), shm=tmpfs, api=docker_api, name="golden")
    h = Host(r)
    try:
        _go_through(h, image)
        yield h
    finally:
        r.cleanup()


def _go_through(h: Host, image: str) -> None:
    r = h.root
    omni = r.recipe("omni")

    # Invalid files: the answer that names each problem.
    r.manifest(("no-such-recipe", [A]))
    h.run("validate-invalid", "validate", "--json", rc=1)
    h.run("plan-invalid", "plan", "--json", rc=1)

    # The fixed recipe's hash, as validate shows an assignment's.
    (r.path / "configs" / "recipes" / FIXED.name).write_bytes(FIXED.read_bytes())
    r.manifest((omni, [A]), (FIXED.stem, [B]))
    v = h.run("validate-fixed", "validate", "--json", rc=0)
    h.fixed_hash = {a["recipe"]: a["recipe_hash"] for a in v.data["assignments"]}[FIXED.stem]
    (r.path / "configs" / "recipes" / FIXED.name).unlink()

    r.manifest((omni, [A]))
    h.run("validate", "validate", "--json", rc=0)
    h.lane_hash = {a["recipe"]: a["recipe_hash"] for a in h.answers["validate"].data["assignments"]}[omni]
    h.run("plan-pending", "plan", "--json", rc=2)
    h.run("apply-enter", "apply", "--yes", "--json", rc=0)
    [lane] = [c for c in r.containers() if c["State"] == "running"]
    h.lane_labels = lane["Labels"]
    h.run("apply-noop", "apply", "--yes", "--json", rc=0)
    h.run("plan-converged", "plan", "--json", rc=0)

    # The spec hash of the fixed recipe on a fixed GPU (index 42: make_root draws 64 and up), a plan's alone (nothing
    # is applied): the lane's recipe file becomes the fixed one and slot A's card index 42, and the plan's recreate
    # names the hash the new container would be labelled with.
    recipe_file, host_file = r.path / "configs" / "recipes" / f"{omni}.toml", r.path / "configs" / "host.yaml"
    saved_recipe, saved_host = recipe_file.read_bytes(), host_file.read_bytes()
    doc = yaml.safe_load(saved_host)
    doc["gpus"][A] = {"index": 42}
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    recipe_file.write_bytes(FIXED.read_bytes())
    p = h.run("plan-recreate", "plan", "--json", rc=2)
    [leave] = [a for a in p.data["actions"] if a["kind"] == "leave"]
    m = re.search(r"\(hash [0-9a-f]+ -> ([0-9a-f]{16})\): recreate", leave["reason"])
    assert m, leave
    h.fixed_spec_hash = m.group(1)
    [enter] = [a for a in p.data["actions"] if a["kind"] == "enter"]
    h.fixed_hash_planned = enter["recipe_hash"]
    recipe_file.write_bytes(saved_recipe)
    host_file.write_bytes(saved_host)
    h.run("plan-converged-again", "plan", "--json", rc=0)
    h.run("probe", "probe", omni, "--json", rc=0)

    # A container the tool does not own on slot B, which the manifest now gives a second recipe (omni on a port of
    # its own): blocked.
    other = f"other-{r.tag}"
    port = str(r.port_of(omni))
    data = json.loads(json.dumps(r.recipe_data(omni)).replace(port, str(free_port())))
    data["model"]["id"] = data["container"]["command"][2] = f"e2e/{other}"  # a name of its own (one lane per name)
    r.write_recipe(other, data)
    squatter = r.run_unmanaged(
        "squatter", "-e", f"NVIDIA_VISIBLE_DEVICES={r.slot_index[B]}", "-v", "/usr:/usr:ro", image, "sleep", "300"
    )
    r.manifest((omni, [A]), (other, [B]))
    h.run("plan-blocked", "plan", "--json", rc=3)
    h.run("apply-blocked", "apply", "--yes", "--json", rc=3)
    h.run("adopt-refused", "adopt", squatter, "--json", rc=1)
    r.manifest((omni, [A]))
    (r.path / "configs" / "recipes" / f"{other}.toml").unlink()
    r.api.remove_container(squatter, force=True)

    # Offload files: one a live process maps, two orphans.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(r.shm / "vllm_offload_live.mmap")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        orphans = [r.shm / "vllm_offload_dead1.mmap", r.shm / "vllm_offload_dead2.mmap"]
        for p in orphans:
            p.write_bytes(b"\xab" * (2 * MIB))
        h.run("status", "status", "--json", rc=0)
        h.run("shm-status", "shm", "status", "--json", rc=0)
        h.run("shm-reclaim-dry-run", "shm", "reclaim", "--json", rc=0)
        for p in orphans:  # unmapped and unopened: the test's own files
            p.unlink()
    finally:
        holder.kill()
        holder.wait(timeout=10)
    (r.shm / "vllm_offload_live.mmap").unlink()

    h.run("prune-dry-run", "prune", "--json", rc=0)
    h.run("audit", "audit", "--json", rc=0)


ANSWERS = [
    "validate-invalid",
    "plan-invalid",
    "validate",
    "plan-pending",
    "apply-enter",
    "apply-noop",
    "plan-converged",
    "plan-recreate",
    "probe",
    "plan-blocked",
    "apply-blocked",
    "adopt-refused",
    "status",
    "shm-status",
    "shm-reclaim-dry-run",
    "prune-dry-run",
    "audit",
]


def normal_paths(h: Host, data: Any) -> list[str]:
    paths = {h.normal(p) for p in key_paths(data)}
    return sorted(p for p in paths if not any(p.startswith(m + ".") for m in MACHINE_LISTS))


@pytest.mark.parametrize("name", ANSWERS)
def test_json_keys(host: Host, name: str) -> None:
    res = host.answers[name]
    lines = [f"# reconciler {host.normal(' '.join(res.args))} -> exit {res.rc}", *normal_paths(host, res.data)]
    check(f"json-keys/{name}.txt", "".join(f"{line}\n" for line in lines))


def test_recipe_hash_and_labels(host: Host) -> None:
    labels = host.lane_labels
    assert labels["io.reconciler.recipe-hash"] == host.lane_hash, "the label is the hash validate shows"
    assert host.fixed_hash_planned == host.fixed_hash, "a plan's enter carries the hash validate shows"
    check_json(
        "recipe-hash/golden-fixed.json",
        {
            "recipe": FIXED.name,
            "recipe_hash": host.fixed_hash,
            # On slot A as card 42, with the demo host file's docker settings: the io.reconciler.spec-hash label.
            "spec_hash_on_gpu_42": host.fixed_spec_hash,
        },
    )
    check_lines("labels/io.reconciler.txt", [k for k in labels if k.startswith("io.reconciler.")])


# ---------------------------------------------------------------- the loop


@pytest.fixture(scope="module")
def loop(host: Host, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopProcess]:
    tf = tmp_path_factory.mktemp("golden-token") / "token"
    tf.write_text(TOKEN + "\n")
    tf.chmod(0o600)
    lp = LoopProcess(host.root, "--api-token-file", str(tf)).started()
    try:
        yield lp
    finally:
        lp.stop()


def test_openapi_document(loop: LoopProcess) -> None:
    import urllib.request

    req = urllib.request.Request(f"http://{loop.addr}/v1/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        doc = json.loads(resp.read())
    doc["info"]["version"] = "VERSION"  # the release's version, which changes with every release
    check_json("openapi.json", doc)


def test_metric_and_label_names(loop: LoopProcess) -> None:
    # Names only: every value (and so every label value) changes from run to run. The process_* families are the
    # client library's process collector (Linux), and each counter's *_created gauge is the library's own; a
    # PROMETHEUS_DISABLE_CREATED_SERIES in the environment would drop those, as it would on a real host.
    status, body = http_get(f"http://{loop.addr}/metrics", timeout=10)
    assert status == 200
    lines = set()
    for fam in text_string_to_metric_families(body.decode()):
        lines.add(f"{fam.name} {fam.type}")
        for s in fam.samples:
            lines.add(f"{fam.name} {s.name}{{{','.join(sorted(s.labels))}}}")
    check_lines("metrics.txt", lines)


async def _tools_http(url: str) -> list[Any]:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return list((await session.list_tools()).tools)


async def _tools_stdio(root: Root) -> list[Any]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "reconciler", "--root", str(root.path), "mcp"],
        env={k: v for k, v in root.env.items() if k.startswith(("RECONCILER_", "NO_COLOR", "PYTHONPATH"))},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return list((await session.list_tools()).tools)


def _described(tools: list[Any]) -> dict[str, Any]:
    return {
        t.name: {
            "input_schema": t.input_schema,
            "output_schema": t.output_schema,
            "annotations": t.annotations.model_dump(mode="json", exclude_none=True) if t.annotations else None,
        }
        for t in tools
    }


def test_mcp_tools(host: Host, loop: LoopProcess) -> None:
    over_http = _described(anyio.run(_tools_http, f"http://{loop.addr}/mcp"))
    over_stdio = _described(anyio.run(_tools_stdio, host.root))
    assert over_http == over_stdio, "both transports offer the same tools"
    check_lines("mcp/TOOLS", over_http)
    check_json("mcp/tools.json", over_http)
