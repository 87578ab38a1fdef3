"""Docker observation's pure parse, on engine answers as the engine writes them (list summary + inspect)."""

from __future__ import annotations

from reconciler.observe.docker_obs import gpu_devices_of, offload_configured, parse_container


def inspect(env=(), cmd=(), entrypoint=None, device_requests=None, labels=None, args=()):  # type: ignore[no-untyped-def]
    return {
        "Name": "/x",
        "Args": list(args),
        "Config": {
            "Env": list(env),
            "Cmd": list(cmd),
            "Entrypoint": entrypoint,
            "Labels": labels or {},
            "Image": "img",
        },
        "HostConfig": {"DeviceRequests": device_requests},
    }


def test_device_request_with_ids() -> None:
    dr = [{"Driver": "", "Count": 0, "DeviceIDs": ["0", "GPU-3f2a"], "Capabilities": [["gpu"]], "Options": {}}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ("0", "GPU-3f2a")


def test_device_request_all_gpus() -> None:
    dr = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ("all",)


def test_device_request_count_takes_the_first_n() -> None:
    dr = [{"Driver": "nvidia", "Count": 2, "DeviceIDs": None, "Capabilities": [["gpu", "utility"]]}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ("0", "1")


def test_non_gpu_device_request_ignored() -> None:
    dr = [{"Driver": "other", "Count": -1, "DeviceIDs": None, "Capabilities": [["fpga"]]}]
    assert gpu_devices_of(inspect(device_requests=dr)) == ()


def test_visible_devices_env_forms() -> None:
    assert gpu_devices_of(inspect(env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"])) == ("all",)
    assert gpu_devices_of(inspect(env=["NVIDIA_VISIBLE_DEVICES=1, GPU-abc"])) == ("1", "GPU-abc")
    for empty in ("none", "void", ""):
        assert gpu_devices_of(inspect(env=[f"NVIDIA_VISIBLE_DEVICES={empty}"])) == ()
    assert gpu_devices_of(inspect(env=["CUDA_VISIBLE_DEVICES=0"])) == ()


def test_request_and_env_are_merged_without_duplicates() -> None:
    dr = [{"Driver": "", "Count": 0, "DeviceIDs": ["1"], "Capabilities": [["gpu"]]}]
    assert gpu_devices_of(inspect(env=["NVIDIA_VISIBLE_DEVICES=1,0"], device_requests=dr)) == ("1", "0")


def test_offload_detection() -> None:
    assert offload_configured(inspect(cmd=["vllm", "serve", "m", "--kv-offloading-size", "8"]))
    assert offload_configured(inspect(cmd=["--kv-offloading-backend=native"]))
    assert offload_configured(inspect(entrypoint=["python", "-m", "vllm", "--kv-offloading-size", "1"]))
    assert offload_configured(inspect(args=["--kv-transfer-config", '{"kv_connector":"OffloadingConnector"}']))
    assert offload_configured(inspect(labels={"io.reconciler.offload": "true"}))
    assert offload_configured(inspect(env=["VLLM_KV_OFFLOAD_MMAP_PIN_MEMORY=0"]))
    assert not offload_configured(inspect(cmd=["vllm", "serve", "m", "--kv-offloading-sizes", "8"]))
    assert not offload_configured(inspect(labels={"io.reconciler.offload": "false"}, cmd=["vllm", "serve"]))


def test_parse_container_reads_state_exit_code_and_labels() -> None:
    summary = {
        "Id": "a" * 64,
        "Names": ["/reconciler-omni-dark-compute-b"],
        "Image": "reconciler/fake-vllm:latest",
        "State": "exited",
        "Status": "Exited (137) 3 seconds ago",
        "Labels": {
            "io.reconciler.managed": "true",
            "io.reconciler.slots": "dark-compute-b",
            "io.reconciler.recipe": "omni",
        },
    }
    c = parse_container(summary, inspect(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    assert c.name == "reconciler-omni-dark-compute-b" and c.state == "exited" and not c.active
    assert c.exit_code == 137 and c.managed and c.recipe == "omni" and c.slots == ("dark-compute-b",)
    assert c.gpu_devices == ("1",) and not c.preserved
