"""Bad input gets a clear error naming file, line, field and fix, and nothing is acted on.

Each test writes a small root (configs/ + manifests/) and runs the real CLI entry point in-process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from reconciler.base.errors import ConfigError
from reconciler.base.units import human_bytes
from reconciler.cli import main
from reconciler.load.desired import load_desired
from reconciler.load.tmpfs import shm_dir_mount_problem, tmpfs_free, tmpfs_size

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo"


def point_shm_at(root: Path, shm: Path) -> None:
    """Make ``root`` (a copy of the demo's) use the tmpfs ``shm`` as its shm.dir, bind-mounted into the offload
    recipes so their files land there (the demo's own tmpfs is mounted only while the demo runs)."""
    host = root / "configs/host.yaml"
    doc = yaml.safe_load(host.read_text())
    doc["shm"]["dir"] = str(shm)
    host.write_text(yaml.safe_dump(doc, sort_keys=False))
    for recipe in (root / "configs/recipes").glob("*.toml"):
        if tomllib.loads(recipe.read_text()).get("offload", {}).get("enabled"):
            text = recipe.read_text()
            assert "volumes = [" in text
            recipe.write_text(text.replace("volumes = [", f'volumes = ["{shm}:{shm}", ', 1))


@pytest.fixture
def root(tmp_path: Path, shared_tmpfs: Path) -> Path:
    shutil.copytree(DEMO / "configs", tmp_path / "configs")
    shutil.copytree(DEMO / "manifests", tmp_path / "manifests")
    point_shm_at(tmp_path, shared_tmpfs)
    return tmp_path


def write_manifest(root: Path, text: str) -> None:
    (root / "manifests" / "demo.yaml").write_text(textwrap.dedent(text))


def errors_of(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["--root", str(root), "validate"])
    return code, capsys.readouterr().err


def test_demo_and_shipped_roots_are_valid(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's root (with its shm.dir on a tmpfs, as its script mounts one) and this repository's root."""
    assert main(["--root", str(root), "validate"]) == 0
    if shm_dir_mount_problem("/dev/shm") is not None:
        pytest.skip("/dev/shm is not a tmpfs here: the shipped root's shm.dir cannot be validated")
    assert main(["--root", str(REPO), "validate"]) == 0
    out = capsys.readouterr().out
    assert "valid: host demo" in out and "valid: host workstation" in out


def test_the_demo_as_shipped_needs_its_tmpfs(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's shm.dir is a tmpfs its script mounts: without it, validate says so (and with it, passes)."""
    shm = yaml.safe_load((DEMO / "configs/host.yaml").read_text())["shm"]["dir"]
    code, err = errors_of(DEMO, capsys)
    problem = shm_dir_mount_problem(shm)
    if problem is None:
        assert code == 0
    else:
        # Absent (the demo torn down), a plain directory, or a directory on another mount: validate names the file and
        # line, the problem as the mount check finds it, and the mount command that fixes it.
        assert code == 1 and "configs/host.yaml:" in err and problem in err
        assert "mount -t tmpfs" in err


def test_shipped_recipes_pin_the_field_report() -> None:
    d = load_desired(REPO)
    r8 = d.recipes["deepseek-v4-flash-0731-r16-b12x-dspark5-256k-offload8-wsl2-mmap-unpinned"]
    r16 = d.recipes["deepseek-v4-flash-0731-r16-b12x-dspark5-256k-offload16-wsl2-mmap-unpinned"]
    for r in (r8, r16):
        assert r.model.revision == "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
        assert r.container.image.endswith("331b79259b9532788b44f13696d484a0d1d576231c6ad397c0f0faf72b85cd86")
        assert r.tensor_parallel_size == 2 and r.container.env["VLLM_KV_OFFLOAD_MMAP_PIN_MEMORY"] == "0"
        assert "262144" in r.container.command
    assert (r8.offload.capacity_gib, r16.offload.capacity_gib) == (8, 16)
    assert "131072" in d.recipes["deepseek-v4-flash-0731-r16-b12x-dspark5-131k"].container.command
    assert "not named" in (REPO / "configs/recipes/omni.toml").read_text()
    assert [(a.recipe, a.slots) for a in d.assignments] == [("omni", ("dark-compute-b",))]


def test_yaml_syntax_error_names_file_and_line(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(root, "host: demo\nassignments:\n  - recipe: omni\n    gpus: [dark-compute-b\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert "manifests/demo.yaml:5: YAML syntax error" in err and "started at line 4" in err


def test_toml_syntax_error_names_file_and_line(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "configs/recipes/broken.toml").write_text('description = "x"\ntensor_parallel_size = = 2\n')
    code, err = errors_of(root, capsys)
    assert code == 1 and "configs/recipes/broken.toml:2: TOML syntax error" in err


def test_unknown_recipe(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(root, "host: demo\nassignments:\n  - recipe: omnii\n    gpus: [dark-compute-b]\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert "manifests/demo.yaml:3: assignments[0].recipe: unknown recipe 'omnii'" in err
    assert "known recipes: deepseek-256k-offload, omni" in err


def test_unknown_slot(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(root, "host: demo\nassignments:\n  - recipe: omni\n    gpus: [dark-compute-c]\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert "manifests/demo.yaml:4: assignments[0].gpus: unknown GPU slot 'dark-compute-c'" in err
    assert "dark-compute-a, dark-compute-b" in err


def test_slot_in_two_assignments(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(
        root,
        """\
        host: demo
        assignments:
          - recipe: omni
            gpus: [dark-compute-b]
          - recipe: deepseek-256k-offload
            gpus: [dark-compute-a, dark-compute-b]
        """,
    )
    code, err = errors_of(root, capsys)
    assert code == 1
    assert (
        "manifests/demo.yaml:6: assignments[1].gpus: GPU slot 'dark-compute-b' is already given to assignments[0]"
        in err
    )


def test_tp_mismatch(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(root, "host: demo\nassignments:\n  - recipe: deepseek-256k-offload\n    gpus: [dark-compute-a]\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert "tensor_parallel_size = 2 and needs exactly that many GPU slots, got 1" in err


def test_offload_over_tmpfs(root: Path, shared_tmpfs: Path) -> None:
    write_manifest(
        root,
        "host: demo\nassignments:\n  - recipe: deepseek-256k-offload\n    gpus: [dark-compute-a, dark-compute-b]\n",
    )
    host = root / "configs/host.yaml"
    host.write_text(re.sub(r"reserve_gib: .*", "reserve_gib: 0.25", host.read_text()))
    load_desired(root, shm_size=1024**3)  # fits: 64 MiB + 256 MiB reserve in 1 GiB
    with pytest.raises(ConfigError) as exc:
        load_desired(root, shm_size=256 * 1024**2, shm_free=200 * 1024**2)
    (msg,) = (str(p) for p in exc.value.problems)
    assert msg == (
        f"manifests/demo.yaml:2: assignments: the offload lanes need more room than the tmpfs at {shared_tmpfs} has: "
        "their capacities (deepseek-256k-offload (64.00 MiB)) add up to 64.00 MiB, and with shm.reserve_gib "
        "(256.00 MiB, kept free in configs/host.yaml) that is 320.00 MiB, but the tmpfs is 256.00 MiB, "
        "200.00 MiB of it free now. Assign fewer or smaller offload lanes (offload.capacity_gib in "
        "configs/recipes/deepseek-256k-offload.toml), lower shm.reserve_gib, or give the tmpfs more room"
    )


def test_offload_over_tmpfs_names_every_lane_and_reads_the_real_tmpfs(root: Path, shared_tmpfs: Path) -> None:
    """Two offload lanes in GiB against the real tmpfs: the sizes are the real ones, each in its own unit."""
    lane = (
        (root / "configs/recipes/deepseek-256k-offload.toml")
        .read_text()
        .replace("tensor_parallel_size = 2", "tensor_parallel_size = 1")
        .replace('"--tensor-parallel-size", "2"', '"--tensor-parallel-size", "1"')
    )
    (root / "configs/recipes/big.toml").write_text(re.sub(r"capacity_gib = .*", "capacity_gib = 1.5", lane))
    (root / "configs/recipes/small.toml").write_text(
        re.sub(r"capacity_gib = .*", "capacity_gib = 0.5", lane).replace("8000", "8002")  # a port of its own
    )
    write_manifest(
        root,
        "host: demo\nassignments:\n  - recipe: big\n    gpus: [dark-compute-a]\n  - recipe: small\n    gpus: [dark-compute-b]\n",
    )
    size, free = tmpfs_size(str(shared_tmpfs)), tmpfs_free(str(shared_tmpfs))
    if size is None or size >= 2 * 1024**3:
        pytest.skip(f"the tmpfs at {shared_tmpfs} holds both lanes")
    with pytest.raises(ConfigError) as exc:
        load_desired(root)
    msg = str(exc.value)
    assert "their capacities (big (1.50 GiB), small (512.00 MiB)) add up to 2.00 GiB" in msg
    assert f"but the tmpfs is {human_bytes(size)}, {human_bytes(free)} of it free now" in msg
    assert "configs/recipes/big.toml, configs/recipes/small.toml" in msg


def test_unknown_keys_everywhere(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = (
        (root / "configs/host.yaml")
        .read_text()
        .replace("gpu_telemetry: none", "gpu_telemetry: none\ngpu_telemtry: nvml")
    )
    (root / "configs/host.yaml").write_text(host)
    recipe = (root / "configs/recipes/omni.toml").read_text().replace("init = true", "init = true\nrestart = 'always'")
    (root / "configs/recipes/omni.toml").write_text(recipe)
    code, err = errors_of(root, capsys)
    assert code == 1
    assert "configs/host.yaml:" in err and "unknown key 'gpu_telemtry'" in err
    assert "configs/recipes/omni.toml:" in err and "container.restart: unknown key 'restart'" in err
    assert "allowed keys here: image, command" in err


def test_unknown_key_in_manifest_has_its_line(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(root, "host: demo\nassignments:\n  - recipe: omni\n    gpus: [dark-compute-b]\n    gpu: 1\n")
    code, err = errors_of(root, capsys)
    assert code == 1 and "manifests/demo.yaml:5: assignments[0].gpu: unknown key 'gpu'" in err


def test_manifest_for_another_host(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_manifest(root, "host: workstation\nassignments: []\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert (
        "manifests/demo.yaml:1: host: manifest is for host 'workstation' but configs/host.yaml names this host 'demo'"
        in err
    )


@pytest.mark.parametrize("missing", [True, False])
def test_empty_or_missing_manifests(root: Path, capsys: pytest.CaptureFixture[str], missing: bool) -> None:
    shutil.rmtree(root / "manifests")
    if not missing:
        (root / "manifests").mkdir()
    code, err = errors_of(root, capsys)
    assert code == 1 and "manifests: no manifest found" in err


def test_missing_host_file_points_at_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = errors_of(tmp_path, capsys)
    assert code == 1 and "configs/host.yaml: file not found: is --root" in err


def test_validate_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    write_manifest(root, "host: demo\nassignments:\n  - recipe: nope\n    gpus: [dark-compute-b]\n")
    assert main(["--root", str(root), "validate", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is False and data["errors"][0]["line"] == 3


def test_bad_manifest_makes_plan_exit_1_without_touching_docker(root: Path) -> None:
    """A broken manifest stops `plan` before any observation: an unreachable engine is never even asked."""
    write_manifest(root, "host: demo\nassignments:\n  - recipe: nope\n    gpus: [dark-compute-b]\n")
    host = root / "configs/host.yaml"
    host.write_text(host.read_text().replace("unix:///var/run/docker.sock", "unix:///nonexistent/docker.sock"))
    res = subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(root), "plan"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1
    assert "unknown recipe 'nope'" in res.stderr and "docker" not in res.stderr


def test_recipe_hash_ignores_description_only(root: Path) -> None:
    before = load_desired(root).recipes["omni"].content_hash()
    p = root / "configs/recipes/omni.toml"
    p.write_text(p.read_text().replace('description = "', 'description = "reworded '))
    assert load_desired(root).recipes["omni"].content_hash() == before
    p.write_text(p.read_text().replace('"--port", "8001"', '"--port", "8002"').replace(":8001/", ":8002/"))
    assert load_desired(root).recipes["omni"].content_hash() != before


# ---------------------------------------------------------------- files that are not text, and the tmpfs check


def test_a_recipe_that_is_a_fifo_or_a_device_is_refused_without_reading_it(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO would block the read forever and /dev/zero would fill memory: both are refused by fstat first."""
    os.mkfifo(root / "configs/recipes/pipe.toml")
    (root / "configs/recipes/zero.toml").symlink_to("/dev/zero")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert "configs/recipes/pipe.toml: a recipe is not a regular file" in err
    assert "configs/recipes/zero.toml: a recipe is not a regular file" in err


def test_an_unreadable_recipe_is_a_problem_not_a_traceback(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "configs/recipes/gone.toml").symlink_to(root / "nowhere")  # a dangling link: open fails
    code, err = errors_of(root, capsys)
    assert code == 1 and "configs/recipes/gone.toml: file not found" in err and "Traceback" not in err


def test_an_oversized_file_is_refused(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / "manifests/demo.yaml").write_text("host: demo\n" + "# padding\n" * 200_000)
    code, err = errors_of(root, capsys)
    assert code == 1 and "manifests/demo.yaml: a manifest is larger than 1.00 MiB" in err


def test_a_bom_is_not_an_error(root: Path) -> None:
    p = root / "configs/recipes/omni.toml"
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    assert "omni" in load_desired(root).recipes


def test_the_assignments_given_twice_is_refused_not_read_as_empty(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PyYAML alone keeps the last 'assignments:' (empty), so validate passed with 0 assignments and the loop
    would then stop every lane."""
    write_manifest(root, "host: demo\nassignments:\n  - recipe: omni\n    gpus: [dark-compute-b]\nassignments:\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    assert (
        "manifests/demo.yaml:5: duplicate key 'assignments': given at line 2 and again at line 5; "
        "YAML would silently keep only the last one. Remove one of them"
    ) in err


def test_a_yaml_merge_key_may_be_overridden(root: Path) -> None:
    """'<<: *base' followed by a key of the merged mapping is an override on purpose, not a duplicate."""
    write_manifest(
        root,
        "host: demo\nx-base: &b {recipe: omni, gpus: [dark-compute-a]}\nassignments:\n  - <<: *b\n    gpus: [dark-compute-b]\n",
    )
    with pytest.raises(ConfigError) as exc:  # x-base is an unknown key, but no duplicate is reported
        load_desired(root)
    assert "duplicate" not in str(exc.value) and "x-base: unknown key" in str(exc.value)


def test_a_merging_mapping_reused_through_an_alias_is_not_a_duplicate(root: Path) -> None:
    """A mapping that uses '<<' and is merged again elsewhere: PyYAML's own merge rewrote its node in place, so
    when its turn came it held the merged keys as its own and was refused as a "duplicate key" (line 5 and 5)."""
    host = root / "configs/host.yaml"
    shm = yaml.safe_load(host.read_text())["shm"]
    text = textwrap.dedent(f"""\
        name: demo
        gpus:
          dark-compute-a: &a
            <<: {{index: 0, free_gib: 3.0}}
            free_gib: 5.0
          dark-compute-b: {{index: 1}}
        gpu_telemetry: none
        docker: {{gpu_requests: false}}
        shm: {{dir: {shm["dir"]}, ignore_uninspectable_pids: [1], reserve_gib: 0.125}}
        """)
    host.write_text(text + "gpu_reserve:\n  <<: *a\n  policy: enforce\n")
    with pytest.raises(ConfigError) as exc:  # a slot's index is no key of gpu_reserve; that alone is said
        load_desired(root)
    assert [p.message.split(":", 1)[0] for p in exc.value.problems] == ["gpu_reserve.index"], str(exc.value)
    assert "duplicate" not in str(exc.value)
    host.write_text(text)
    desired = load_desired(root)
    assert desired.host.gpus["dark-compute-a"].index == 0 and desired.host.gpus["dark-compute-a"].free_gib == 5.0


def test_a_merge_keeps_the_overrides_of_the_mapping_it_merges() -> None:
    """PyYAML's merge loses a merged mapping's own override when that mapping uses '<<' too (z.b came out 0)."""
    from reconciler.load.yaml_source import _Loader

    text = "base: &base {a: 1, b: 0}\nholder:\n  inner: &x\n    <<: *base\n    b: 2\nz:\n  <<: *x\n  c: 3\n"
    loader = _Loader(text)
    try:
        data = loader.construct_document(loader.get_single_node())
    finally:
        loader.dispose()
    assert data == {"base": {"a": 1, "b": 0}, "holder": {"inner": {"a": 1, "b": 2}}, "z": {"a": 1, "b": 2, "c": 3}}
    assert loader.duplicates == []
    assert yaml.safe_load(text)["z"]["b"] in (0, 2)  # what PyYAML itself gives varies by release; ours does not
    many = _Loader("a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc: {<<: [*a, *b], z: 3}\n")
    assert many.get_single_data()["c"] == {"x": 1, "y": 2, "z": 3}  # the earlier mapping of a list wins


def test_toml_duplicate_names_both_lines(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = root / "configs/recipes/omni.toml"
    lines = p.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("init = "))
    lines.insert(at + 1, "init = false")
    p.write_text("\n".join(lines) + "\n")
    code, err = errors_of(root, capsys)
    assert code == 1
    # The key by its name, and both lines (issue 44, item 8: tomllib says only "Cannot overwrite a value").
    assert (
        f"configs/recipes/omni.toml:{at + 2}: duplicate key: key 'container.init' given at line {at + 1} and again at "
        f"line {at + 2}"
    ) in err, err


def test_shm_dir_inside_a_tmpfs_but_not_its_mount_point(shared_tmpfs: Path) -> None:
    sub = shared_tmpfs / "reconciler-test-sub"
    sub.mkdir(exist_ok=True)
    try:
        problem = shm_dir_mount_problem(str(sub))
        assert problem is not None
        assert (
            f"is inside the tmpfs mounted at {shared_tmpfs} (/proc/self/mountinfo) but is not its mount point"
            in problem
        )
    finally:
        sub.rmdir()
    assert shm_dir_mount_problem(str(shared_tmpfs)) is None


def test_shm_dir_through_a_symlink_names_the_real_path(tmp_path: Path, shared_tmpfs: Path) -> None:
    link = tmp_path / "shm"
    link.symlink_to(shared_tmpfs)
    problem = shm_dir_mount_problem(str(link))
    assert problem is not None and f"write dir: {shared_tmpfs}" in problem


def test_shm_dir_mount_check_reads_mountinfo_and_says_so(tmp_path: Path) -> None:
    d = tmp_path / "shm"
    d.mkdir()
    info = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"90 27 0:50 / {str(d).replace(' ', chr(92) + '040')} rw,relatime - tmpfs tmpfs rw,size=65536k\n"
    )
    assert shm_dir_mount_problem(str(d), mountinfo=info) is None
    shadowed = info + f"91 90 0:51 / {d} rw - ext4 /dev/vdb rw\n"  # a later mount on the same point wins
    problem = shm_dir_mount_problem(str(d), mountinfo=shadowed)
    assert problem is not None and f"/proc/self/mountinfo shows it on ext4 mounted at {d}" in problem


def test_shm_dir_mount_check_falls_back_to_statfs(
    tmp_path: Path, shared_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without /proc/self/mountinfo, statfs's f_type (TMPFS_MAGIC) and ismount decide, and the message says so."""
    import reconciler.base.mounts as mounts

    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "no-mountinfo"))
    assert shm_dir_mount_problem(str(shared_tmpfs)) is None
    problem = shm_dir_mount_problem(str(tmp_path))
    assert problem is not None and "statfs gives f_type 0x" in problem and "not TMPFS_MAGIC 0x01021994" in problem
