"""``reconciler init`` (reconciler/service/init_root.py, observe/machine.py, load/init_files.py): a root written
from what the machine says, which `reconciler validate` accepts; never over a file that is there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.observe.machine import Card, Engine, Machine, parse_wsl, read_cards, read_machine
from reconciler.service.init_root import InitRefused, init_root

H200 = Card(0, "GPU-c0b62778-fa04-78c1-0cfd-cea75364fc73", "NVIDIA H200", 150754820096, 612 << 20)
ENGINE = Engine("unix:///var/run/docker.sock", "Docker Engine", "27.0.1", "the default socket")


def validate(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--root", str(root), "validate"], capture_output=True, text=True
    )


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    return root


def test_on_this_machine_it_writes_a_root_that_validates(tmp_path: Path, docker_api: object) -> None:
    """The engine the tests run against answers at DOCKER_HOST; the cards are NVML's (an H200 machine writes each
    card's UUID), or, where NVML has none, gpu_telemetry none and the reason."""
    root = _root(tmp_path)
    url = os.environ.get("RECONCILER_TEST_DOCKER_URL", "unix:///var/run/docker.sock")
    machine = read_machine({"DOCKER_HOST": url})
    result = init_root(root, machine=machine)
    host = (root / "configs/host.yaml").read_text()
    assert validate(root).returncode == 0, validate(root).stderr
    assert machine.engines and machine.engines[0].url == url and machine.engines[0].why == "$DOCKER_HOST"
    assert f"url: {url}" in host and "found at" in host
    cards, why, _driver = read_cards()
    if cards:
        assert [f'uuid: "{c.uuid}"' in host for c in cards] == [True] * len(cards), host
        assert "gpu_telemetry: nvml" in host
    else:
        assert "gpu_telemetry: none" in host and why in host
    assert sorted(result.written) == sorted(result.files)


def test_cards_by_uuid_with_their_memory_and_wsl2_settings(tmp_path: Path) -> None:
    root = _root(tmp_path)
    machine = Machine(
        cards=(H200,),
        driver="570.86",
        wsl2=True,
        wsl_why="the kernel release is '6.6-microsoft-standard-WSL2'",
        engines=(ENGINE,),
        shm_bytes=64 << 30,
        shm_fs="tmpfs",
    )
    init_root(root, machine=machine)
    host = (root / "configs/host.yaml").read_text()
    assert 'gpu0: {uuid: "GPU-c0b62778-fa04-78c1-0cfd-cea75364fc73", idle_used_gib: 2}' in host
    assert "# index 0: NVIDIA H200, 140.40 GiB" in host and "NVIDIA driver 570.86" in host
    assert "drop_after_leave: true" in host and "gpu_requests: true" in host
    assert validate(root).returncode == 0, validate(root).stderr


def test_an_existing_root_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "configs").mkdir()
    (root / "configs/host.yaml").write_text("name: mine\n")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    with pytest.raises(InitRefused, match="never overwrites"):
        init_root(root, machine=Machine(engines=(ENGINE,)))
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()} == before
    assert not (root / "manifests").exists()


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = _root(tmp_path)
    result = init_root(root, dry_run=True, machine=Machine())
    assert list(root.iterdir()) == [] and result.written == [] and "configs/host.yaml" in result.files
    assert "No container engine answered" in result.files["configs/host.yaml"]


@pytest.mark.parametrize(
    ("release", "env", "wsl"),
    [
        ("5.15.153.1-microsoft-standard-WSL2\n", {}, True),
        ("4.4.0-19041-Microsoft\n", {"WSL_DISTRO_NAME": "Ubuntu"}, True),  # WSL1 names itself so too: only with it
        ("4.4.0-19041-Microsoft\n", {}, False),
        ("6.1.0-18-amd64\n", {"WSL_DISTRO_NAME": "x"}, False),
    ],
)
def test_wsl2_is_read_from_the_kernel_release(release: str, env: dict[str, str], wsl: bool) -> None:
    assert parse_wsl(release, env)[0] is wsl


def test_the_command_writes_then_refuses_without_a_traceback(tmp_path: Path) -> None:
    root = _root(tmp_path) / "new"

    def init(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "reconciler", "--root", str(root), "init", *extra], capture_output=True, text=True
        )

    dry = init("--dry-run")
    assert dry.returncode == 0 and "would write" in dry.stdout and not root.exists()
    first = init()
    assert first.returncode == 0, first.stderr
    assert "found:" in first.stdout and "configs/host.yaml" in first.stdout
    assert validate(root).returncode == 0
    written = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    again = init("--json")
    assert again.returncode == 1 and "never overwrites" in again.stdout + again.stderr
    assert "Traceback" not in again.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == written


def test_the_host_file_recommends_signed_commits_and_a_bound_for_a_git_source() -> None:
    """The commented ``source:`` of the host file init writes names allowed_signers and an allow, and is a source
    the model takes once uncommented."""
    import yaml

    from reconciler.load.init_files import host_yaml
    from reconciler.model.source import SourceConfig

    text = host_yaml(Machine(cards=(H200,), engines=(ENGINE,)), "gpu-box-1")
    assert "Whoever can push to it chooses what" in text and "allowed_signers" in text
    block = text[text.index("# source:") :]
    doc = yaml.safe_load("\n".join(line.removeprefix("# ") for line in block.splitlines()))
    src = SourceConfig.model_validate(doc["source"], strict=False)
    assert src.allowed_signers == "/etc/reconciler/allowed_signers" and src.allow.mounts == ["/var/cache/huggingface"]
    assert src.allow.network_host and src.allow.env_from_secrets == ["HF_TOKEN"] and not src.insecure_transport
