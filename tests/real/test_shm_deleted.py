"""A current vLLM's offload file (the fake vLLM's ``unlink-mapped`` switch: unlinked once every worker mapped it) on
the real engine and a real tmpfs: its bytes have no name while the lane runs, yet ``shm status`` and ``status`` show
them under the lane's container, the tmpfs admission counts them (an enter that would not fit because of them is
refused, and one that fits once their lane leaves enters in the same pass), and the guard never offers them for
reclaim."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import MIB, Root, set_flag

pytestmark = [pytest.mark.docker, pytest.mark.root]


def lane(root: Root, base_name: str, *, slot: str, offload_mib: int, port: int | None = None) -> str:
    """A TP=1 offload lane of the demo's offload recipe, its file unlinked once mapped; returns its recipe name."""
    name = root.recipe(
        "deepseek-256k-offload", offload_mib=offload_mib, port=port, env={"FAKE_VLLM_MODE": "unlink-mapped"}
    )
    data = root.recipe_data(name)
    data["tensor_parallel_size"] = 1
    data["container"]["command"] = set_flag(data["container"]["command"], "--tensor-parallel-size", "1")
    data["container"]["env"].pop("FAKE_VLLM_MODE_FILE", None)
    final = f"{base_name}-{root.tag}"
    # Two lanes of one recipe in one topology: each answers to a name of its own (validate refuses two lanes that
    # serve one name, since a request for it could go to either).
    data["container"]["command"] = set_flag(data["container"]["command"], "--served-model-name", final)
    data["model"]["id"] = final
    for probe in data.get("probes") or ():
        probe.pop("model", None)
    (root.path / "configs" / "recipes" / f"{name}.toml").unlink()
    root.recipes.pop("deepseek-256k-offload")
    root.write_recipe(final, data)
    return final


@pytest.fixture
def unlinked_holder(root: Root) -> Iterator[int]:
    """A host process (no container) that maps a 16 MiB pattern file of the tmpfs, prefaulted, then unlinks it."""
    path = root.shm / "vllm_offload_elsewhere.mmap"
    code = (
        "import mmap, os, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        f"os.ftruncate(fd, {16 * MIB})\n"
        "m = mmap.mmap(fd, 0)\nos.close(fd)\nm.write(b'x' * len(m))\n"
        f"os.unlink({str(path)!r})\nprint('ready', flush=True)\ntime.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def used(d: Path) -> int:
    v = os.statvfs(d)
    return (v.f_blocks - v.f_bfree) * v.f_frsize


def test_unlinked_offload_bytes_are_shown_counted_and_never_reclaimable(root: Root, unlinked_holder: int) -> None:
    a = lane(root, "fixed-a", slot="dark-compute-a", offload_mib=24)
    root.manifest((a, ["dark-compute-a"]))
    applied = root.apply()
    assert applied.rc == 0, applied
    name_a = root.cname(a, "dark-compute-a")
    assert list(root.running()) == [name_a]
    assert root.shm_files() == []  # no name: the lane unlinked it
    assert used(root.shm) >= 40 * MIB

    shm = root.shm_status()
    assert shm["files"] == []
    by_size = {d["allocated_bytes"]: d for d in shm["deleted_mapped"]}
    assert sorted(by_size) == [16 * MIB, 24 * MIB], shm["deleted_mapped"]
    assert {o["container"] for o in by_size[24 * MIB]["owners"]} == {name_a}
    assert {(o["pid"], o["container"]) for o in by_size[16 * MIB]["owners"]} == {(unlinked_holder, None)}
    human = root.cli("shm", "status")
    assert human.rc == 0 and f"({name_a})" in human.stdout, human.stdout

    status = root.status()
    [mine] = [c for c in status["containers"] if c["name"] == name_a]
    assert mine["shm_deleted_mapped_bytes"] == 24 * MIB
    assert mine["vllm"]["offload_file"] == "unlinked"
    assert status["shm"]["deleted_mapped_bytes"] == 40 * MIB

    # Never reclaimable: neither the dry run nor a confirmed reclaim offers them, and the bytes stay mapped.
    for args in (("shm", "reclaim", "--json"), ("shm", "reclaim", "--confirm", "--json")):
        done = root.cli(*args)
        assert done.data["reclaimed"] == [] and done.data["reclaimed_bytes"] == 0, done
        assert not any("deleted" in k["path"] for k in done.data.get("kept", [])), done
    assert used(root.shm) >= 40 * MIB and list(root.running()) == [name_a]

    # Admission: a 64 MiB tmpfs, 24 + 16 MiB held with no name, an 8 MiB reserve: a 32 MiB lane does not fit (the
    # manifest's own sum, 24 + 32 + 8, does: the loader accepts it).
    b = lane(root, "fixed-b", slot="dark-compute-b", offload_mib=32)
    root.manifest((a, ["dark-compute-a"]), (b, ["dark-compute-b"]))
    plan = root.cli("plan", "--json")
    assert plan.rc == 3, plan
    assert any("tmpfs" in blk["reason"] and b in blk["reason"] for blk in plan.data["blockers"]), plan.data

    # Once the lane holding 24 MiB of them leaves, those go with it: the leave and the enter are one plan.
    root.manifest((b, ["dark-compute-b"]))
    plan = root.cli("plan", "--json")
    assert plan.rc == 2, plan
    assert [x["kind"] for x in plan.data["actions"]] == ["leave", "enter"], plan.data
    applied = root.apply()
    causes = [(x.get("kind"), x.get("result"), x.get("detail")) for x in applied.data.get("actions", [])]
    assert applied.rc == 0, "\n".join(map(str, causes))
    assert list(root.running()) == [root.cname(b, "dark-compute-b")]
