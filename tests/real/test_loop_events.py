"""The loop looks again for the engine events of containers a plan reads, and only for those (issue 14).

Ours (this host's label), any container claiming one of this host's GPUs ("all", a slot's index, any UUID) or
configured for native offload wake it; the start, die and destroy of anything else on a shared engine do not.
An event whose container cannot be looked at wakes it (unknown is never taken for "unrelated").
"""

from __future__ import annotations

import threading
import time
from typing import Any

from conftest import DOCKER_URL
from e2e_helpers import Root, docker_cli, wait_until

from reconciler.observe.containers import EngineObserver, EventFilter, container_matters

HOST = "h1"
SCOPE = (HOST, frozenset({"0", "1"}))


def inspect(
    *,
    env: list[str] = (),
    labels: dict[str, str] | None = None,
    cmd: list[str] = (),
    requests: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "Config": {"Env": list(env), "Labels": labels or {}, "Cmd": list(cmd), "Entrypoint": None},
        "Args": [],
        "HostConfig": {"DeviceRequests": requests},
    }


def test_which_containers_matter() -> None:
    def m(i: dict[str, Any], idx: frozenset[str] | None = SCOPE[1]) -> bool:
        return container_matters(i, host=HOST, indexes=idx)

    assert not m(inspect(cmd=["sleep", "60"]))
    assert m(inspect(labels={"io.reconciler.host": HOST}))
    assert not m(inspect(labels={"io.reconciler.host": "elsewhere"}))
    assert m(inspect(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    assert m(inspect(env=["NVIDIA_VISIBLE_DEVICES=all"]))
    assert m(inspect(env=["NVIDIA_VISIBLE_DEVICES=GPU-1234abcd"]))  # a UUID may be a slot's, as NVML names it
    assert not m(inspect(env=["NVIDIA_VISIBLE_DEVICES=7"]))  # another GPU of the machine
    assert m(inspect(env=["NVIDIA_VISIBLE_DEVICES=7"]), None)  # a slot known by UUID only: any index may be it
    assert m(inspect(requests=[{"Driver": "nvidia", "DeviceIDs": ["0"], "Capabilities": [["gpu"]]}]))
    assert m(inspect(requests=[{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]))
    assert m(inspect(cmd=["vllm", "serve", "m", "--kv-offloading-size", "8"]))
    assert m(inspect(env=["VLLM_KV_OFFLOAD_MMAP_PIN_MEMORY=0"]))


class FakeObserver:
    def __init__(self, configs: dict[str, dict[str, Any]], *, fail: bool = False):
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self.configs = configs
        self.fail = fail
        self.inspected: list[str] = []

    def _inspect(self, cid: str) -> dict[str, Any] | None:
        self.inspected.append(cid)
        if self.fail:
            raise ConnectionError("engine gone")
        found = self.configs.get(cid)
        if found is not None:
            self._cache[cid] = found
        return found


def ev(cid: str, action: str, **attrs: str) -> dict[str, Any]:
    return {
        "status": action,
        "id": cid,
        "Type": "container",
        "Action": action,
        "Actor": {"ID": cid, "Attributes": attrs},
    }


def test_events_of_unrelated_containers_are_dropped_and_each_container_is_inspected_once() -> None:
    obs = FakeObserver({"plain": inspect(cmd=["sleep", "9"]), "gpu": inspect(env=["NVIDIA_VISIBLE_DEVICES=0"])})
    f = EventFilter(obs, lambda: SCOPE)  # type: ignore[arg-type]
    assert [f.matters(ev("plain", a)) for a in ("start", "die", "destroy")] == [False, False, False]
    assert [f.matters(ev("gpu", a)) for a in ("start", "die", "destroy")] == [True, True, True]
    assert obs.inspected == ["plain", "gpu"]  # once each, on its first event; the verdict is kept until destroy
    assert f.matters(ev("x", "start", **{"io.reconciler.host": HOST}))  # our label, on the event itself
    assert f._verdicts == {}


def test_a_container_already_seen_by_a_pass_is_judged_from_the_cache() -> None:
    obs = FakeObserver({})
    obs._cache["seen"] = inspect(cmd=["vllm", "--kv-offloading-backend", "native"])
    assert EventFilter(obs, lambda: SCOPE).matters(ev("seen", "die"))  # type: ignore[arg-type]
    assert obs.inspected == []


def test_unknown_is_never_unrelated() -> None:
    obs = FakeObserver({}, fail=True)
    f = EventFilter(obs, lambda: SCOPE)  # type: ignore[arg-type]
    assert f.matters(ev("a", "start"))  # the engine did not answer the inspect
    assert f.matters(ev("b", "destroy"))  # gone before anything was known of it
    assert f.matters({"status": "start"})  # no id
    assert EventFilter(FakeObserver({"p": inspect()}), lambda: None).matters(ev("p", "start"))  # type: ignore[arg-type]


# ---------------------------------------------------------------- the real engine's events


def test_real_events_of_unrelated_containers_are_dropped_and_a_gpu_claim_is_kept(
    root: Root, image: str, docker_api: Any
) -> None:
    """The engine's own event stream, filtered as the loop filters it. (Counting the loop's passes instead would
    depend on what else runs on a shared engine: another test's offload container rightly wakes every loop.)"""
    observer = EngineObserver(DOCKER_URL)
    scope = (root.host, frozenset(str(i) for i in root.slot_index.values()))
    f = EventFilter(observer, lambda: scope)
    seen: dict[str, list[bool]] = {}
    mine: set[str] = set()
    stream = docker_api.events(decode=True, filters={"type": "container", "event": ["start", "die", "destroy"]})

    def follow() -> None:  # live, as the loop reads them: each event judged as it arrives
        for e in stream:
            name = (e.get("Actor") or {}).get("Attributes", {}).get("name", "")
            if name.startswith(("unrelated-", "claims-")) and name.endswith(root.tag):
                verdict = f.matters(e)
                seen.setdefault(name, []).append(verdict)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    names = []
    for i in range(3):
        names.append(root.run_unmanaged(f"unrelated-{i}", "-v", "/usr:/usr:ro", image, "/usr/bin/sleep", "30"))
        time.sleep(0.3)  # one that is gone before its first event is read is unknown, and wakes the loop
        docker_cli("rm", "-f", names[-1])
    slot = root.slot_index["dark-compute-b"]
    claim = root.run_unmanaged(
        "claims-b", "-e", f"NVIDIA_VISIBLE_DEVICES={slot}", "-v", "/usr:/usr:ro", image, "/usr/bin/sleep", "30"
    )
    other_gpu = root.run_unmanaged(
        "claims-other", "-e", "NVIDIA_VISIBLE_DEVICES=1023", "-v", "/usr:/usr:ro", image, "/usr/bin/sleep", "30"
    )
    mine = {*names, claim, other_gpu}
    wait_until(
        lambda: all(len(seen.get(n, ())) == 3 for n in names) and claim in seen and other_gpu in seen,
        timeout=10,
        what=f"the events of {sorted(mine)}",
    )
    stream.close()
    assert all(seen[n] == [False, False, False] for n in names), seen  # start, die, destroy: none wakes the loop
    assert seen[claim] == [True] and seen[other_gpu] == [False], seen
