"""Ownership you can prove, against the real engine: a container is ours only with this host's name and this
install's id; labels inherited from an image or written by hand prove nothing; a container from before install
ids is adopted only by the explicit, logged `reconciler adopt`; the recreate hash covers the rendered container,
so moving a slot to another GPU recreates it and says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from e2e_helpers import SLEEP, Root, docker_cli

from reconciler.observe.containers import inherited_labels

pytestmark = [pytest.mark.docker, pytest.mark.root]


def _labels(root: Root, recipe: str, slot: str, **extra: str) -> list[str]:
    from reconciler.load.desired import load_desired

    desired = load_desired(root.path)
    labels = {
        "io.reconciler.managed": "true",
        "io.reconciler.host": root.host,
        "io.reconciler.recipe": recipe,
        "io.reconciler.recipe-hash": desired.recipes[recipe].content_hash(),
        "io.reconciler.slots": slot,
        **extra,
    }
    return [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]


def _run_like(root: Root, recipe: str, slot: str, name: str, *labels: str) -> str:
    """Start ``recipe`` by hand, the way an earlier version of the tool did (same name, env, binds, command)."""
    spec = root.recipe_data(recipe)["container"]
    vols = [a for v in spec["volumes"] for a in ("-v", v)]
    gpu = str(root.slot_index[slot])
    docker_cli(
        "run",
        "-d",
        "--name",
        name,
        "--init",
        "--ipc",
        "host",
        "--network",
        "host",
        *vols,
        *labels,
        "-e",
        f"NVIDIA_VISIBLE_DEVICES={gpu}",
        spec["image"],
        *spec["command"],
    )
    return name


def test_legacy_container_is_adopted_only_by_the_explicit_command(root: Root) -> None:
    omni = root.recipe("omni")
    name = _run_like(
        root, omni, "dark-compute-b", root.cname(omni, "dark-compute-b"), *_labels(root, omni, "dark-compute-b")
    )
    # Not in the manifest, but not proven ours either: nothing is stopped.
    assert root.cli("plan", "--json").data["actions"] == []
    # Wanted: the plan is blocked and names the command that adopts it.
    root.manifest((omni, ["dark-compute-b"]))
    p = root.cli("plan")
    assert p.rc == 3, p
    assert f"reconciler adopt {name}" in p.stdout and "adopt it" in p.stdout
    st = root.cli("status", "--json").data
    assert [c["owner"] for c in st["slots"]["dark-compute-b"]["containers"]] == ["legacy"]

    a = root.cli("adopt", name)
    assert a.rc == 0 and f"adopted {name}" in a.stdout, a
    log = Path(root.env["RECONCILER_STATE_DIR"]) / root.host / "ownership.log"
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["event"] == "adopt" and entry["container"] == name and entry["install_id"] == root.install_id()
    # Its recipe hash and GPU ids match: it is the lane, nothing to do.
    assert root.cli("plan").rc == 0
    # And now it is ours to stop.
    root.manifest()
    res = root.apply()
    assert res.rc == 0 and [(x["kind"], x["result"]) for x in res.data["actions"]] == [("leave", "ok")], res
    assert root.running() == {}


def test_adopt_refuses_what_this_tool_did_not_make_for_this_host(root: Root) -> None:
    other = root.run_unmanaged("plain", *SLEEP)
    r = root.cli("adopt", other)
    assert r.rc == 1 and "cannot be adopted" in r.stderr and "Traceback" not in r.stderr, r
    r = root.cli("adopt", "no-such-container-here")
    assert r.rc == 1 and "no container of that name or id" in r.stderr, r
    assert not (Path(root.env["RECONCILER_STATE_DIR"]) / root.host / "ownership.log").exists()


def test_labels_inherited_from_an_image_prove_nothing(root: Root, tmp_path: Path) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    assert root.apply().rc == 0
    ours = root.cname(omni, "dark-compute-b")
    install = root.running()[ours]["Labels"]["io.reconciler.install"]
    assert install == root.install_id()
    # Someone commits our running container to an image: the image now carries every one of our labels, and so
    # does every container made from it -- this install's id included.
    tag = f"reconciler/e2e-copied:{root.tag}"
    docker_cli("commit", ours, tag)
    try:
        copy = root.run_unmanaged(
            "copy",
            "-v",
            "/usr:/usr:ro",
            "-e",
            f"NVIDIA_VISIBLE_DEVICES={root.slot_index['dark-compute-a']}",
            tag,
            "python3",
            "-c",
            "import time; time.sleep(300)",
        )
        got = root.api.inspect_container(copy)["Config"]["Labels"]
        assert got["io.reconciler.install"] == install and got["io.reconciler.host"] == root.host
        st = root.cli("status", "--json").data
        owners = {c["name"]: c["owner"] for c in st["slots"]["dark-compute-a"]["containers"]}
        assert owners == {copy: "foreign"}, st["slots"]
        # An empty manifest stops ours, never the copy.
        root.manifest()
        res = root.apply()
        assert res.rc == 0, res
        assert [x["container"] for x in res.data["actions"]] == [ours]
        assert copy in root.running()
    finally:
        docker_cli("rm", "-f", *[c["Names"][0].lstrip("/") for c in root.unmanaged()], check=False)
        docker_cli("rmi", tag, check=False)


def test_a_copy_made_from_a_lanes_labels_is_not_ours(root: Root) -> None:
    """A container recreated from a lane's `docker inspect` with every label copied (this install's id and create
    token included) is not this install's: its id is not in the record made at create. It is never stopped or
    removed, it blocks the enter on its slot, naming why, and it is ours only once adopted."""
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    assert root.apply().rc == 0
    ours = root.cname(omni, "dark-compute-b")
    info = root.api.inspect_container(ours)
    labels = dict(info["Config"]["Labels"])
    assert labels["io.reconciler.install"] == root.install_id()
    env = [e for e in info["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    # runlike's way: the same labels and GPU, another name (the lane's name is taken); it sleeps instead of serving
    # (the lane's port is taken too).
    copy = root.run_unmanaged(
        "copy",
        *[a for k, v in labels.items() for a in ("--label", f"{k}={v}")],
        *[a for e in env for a in ("-e", e)],
        *SLEEP,
    )
    try:
        st = root.cli("status", "--json").data
        owners = {c["name"]: c["owner"] for c in st["slots"]["dark-compute-b"]["containers"]}
        assert owners == {ours: "ours", copy: "copied"}, st["slots"]
        # An empty manifest stops and removes ours, never the copy (which still holds the slot by its labels: the
        # leave's check that its slot is free says so).
        root.manifest()
        res = root.apply()
        assert [(a["kind"], a["container"]) for a in res.data["actions"]] == [("leave", ours)], res
        assert res.rc == 1 and f"still held by {copy}" in res.data["actions"][0]["detail"], res
        assert copy in root.running() and ours not in root.running()
        # The lane wanted again: blocked by the copy, which is named with the reason and the fix; nothing runs.
        root.manifest((omni, ["dark-compute-b"]))
        p = root.cli("plan", "--json")
        assert p.rc == 3, p
        (blocker,) = p.data["blockers"]
        assert blocker["holder"] == copy and blocker["cause"] == "adopt", blocker
        assert "carries this install's labels but was not created by it" in blocker["reason"]
        assert f"reconciler adopt {copy}" in blocker["reason"]
        res = root.apply()
        assert res.rc == 3 and res.data["actions"] == [], res
        assert set(root.running()) == {copy}
        # The operator says it is the lane: adopted, logged, and from then on this install's.
        a = root.cli("adopt", copy)
        assert a.rc == 0 and f"adopted {copy}" in a.stdout, a
        assert root.cli("status", "--json").data["slots"]["dark-compute-b"]["containers"][0]["owner"] == "ours"
    finally:
        docker_cli("rm", "-f", copy, check=False)


def test_an_install_from_before_the_record_keeps_its_lane_and_records_it_once(root: Root) -> None:
    """An upgrade: the install's lane runs, but its state predates the record of created ids. Its first apply records
    the containers that carry its labels then (logged), changes nothing else, and from then on a copy is refused."""
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    assert root.apply().rc == 0
    ours = root.cname(omni, "dark-compute-b")
    lane = root.running()[ours]["Id"]
    host_dir = Path(root.env["RECONCILER_STATE_DIR"]) / root.host
    for name, drop in (("install.json", "records_created"), ("containers.json", "created")):
        path = host_dir / name
        data = json.loads(path.read_text())
        del data[drop]
        path.write_text(json.dumps(data))
    assert root.cli("plan").rc == 0  # the labels decide until the first apply: its lane is its own
    res = root.apply()
    assert res.rc == 0 and res.data["actions"] == [], res
    assert root.running()[ours]["Id"] == lane
    assert json.loads((host_dir / "containers.json").read_text())["created"] == [lane]
    log = [json.loads(line) for line in (host_dir / "ownership.log").read_text().splitlines()]
    assert [(e["event"], e["ids"]) for e in log] == [("record-created", [lane])]
    labels = root.api.inspect_container(lane)["Config"]["Labels"]
    copy = root.run_unmanaged("copy", *[a for k, v in labels.items() for a in ("--label", f"{k}={v}")], *SLEEP)
    try:
        owners = {c["name"]: c["owner"] for c in root.cli("status", "--json").data["containers"]}
        assert owners == {ours: "ours", copy: "copied"}, owners
    finally:
        docker_cli("rm", "-f", copy, check=False)


def test_moving_a_slot_to_another_gpu_recreates_the_container_and_says_why(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    assert root.apply().rc == 0
    before = root.running()[root.cname(omni, "dark-compute-b")]["Id"]
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    # Below 64: no root's slots are drawn there; from 2: the demo host's lanes (GPUs 0 and 1) may still run beside
    # the tests, and one of them on the moved-to GPU would rightly block the enter.
    moved = 2 + root.slot_index["dark-compute-a"] % 60
    doc["gpus"]["dark-compute-b"]["index"] = moved
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    p = root.cli("plan", "--json")
    assert p.rc == 2, p
    assert [a["kind"] for a in p.data["actions"]] == ["leave", "enter"]
    assert "its GPU ids (gpus: or docker.gpu_requests in configs/host.yaml) changed" in p.data["actions"][0]["reason"]
    assert root.apply().rc == 0
    after = root.running()[root.cname(omni, "dark-compute-b")]
    assert after["Id"] != before
    env = root.api.inspect_container(after["Id"])["Config"]["Env"]
    assert f"NVIDIA_VISIBLE_DEVICES={moved}" in env
    assert root.cli("plan").rc == 0


def test_inherited_labels_are_those_with_the_image_value() -> None:
    labels = {"io.reconciler.managed": "true", "io.reconciler.host": "h", "other": "x"}
    assert inherited_labels(labels, {"io.reconciler.managed": "true", "io.reconciler.host": "g", "other": "x"}) == {
        "io.reconciler.managed"
    }
    assert inherited_labels(labels, {}) == frozenset()
