"""Secrets never leave the process (docs/design.md, safety rule 10).

The rules of ``reconciler.base.redact`` on plain strings, then the places they are applied: ``read_comm`` on a real
process, the GPU observer's processes and the planner's blocker reason built from them, the loop's log lines and
the JSON writer; and end to end, real ``reconciler`` processes (``shm status``, ``shm reclaim``, ``plan``,
``status``, ``apply``) against a real tmpfs, a real process and a real container that carry an API key and a
token on their command line and in their env: the secret appears nowhere in their output while the pid does.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.base.redact import (
    MASK,
    redact_argv,
    redact_cmdline,
    redact_data,
    redact_env,
    redact_env_list,
    redact_text,
)

SECRET = "SECRET123"
KEY = f"sk-live-{SECRET}"

# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    "flag",
    [
        "--api-key",
        "--hf-token",
        "--token",
        "--password",
        "--secret",
        "--passwd",
        "--aws-credential-file",
        "--db-password",
        "--ssl-keyfile",
        "--openai-api-key",
        "-token",
    ],
)
def test_secret_flag_values_are_masked_in_both_forms(flag: str) -> None:
    assert redact_argv(["vllm", "serve", flag, KEY, "--port", "8000"]) == [
        "vllm",
        "serve",
        flag,
        MASK,
        "--port",
        "8000",
    ]
    assert redact_argv(["vllm", f"{flag}={KEY}", "--port", "8000"]) == ["vllm", f"{flag}={MASK}", "--port", "8000"]
    assert redact_cmdline(f"vllm serve {flag} {KEY} --port 8000") == f"vllm serve {flag} {MASK} --port 8000"
    assert redact_cmdline(f"vllm serve {flag}={KEY} --port 8000") == f"vllm serve {flag}={MASK} --port 8000"


def test_flags_that_only_look_secret_stay_readable() -> None:
    argv = [
        "vllm",
        "serve",
        "org/m",
        "--tokenizer",
        "org/tok",
        "--max-num-batched-tokens",
        "8192",
        "--port",
        "8000",
        "--kv-offloading-size",
        "8",
        "--kv-offloading-backend",
        "native",
    ]
    assert redact_argv(argv) == argv
    assert redact_cmdline(" ".join(argv)) == " ".join(argv)


def test_a_secret_flag_used_as_a_switch_does_not_eat_the_next_flag() -> None:
    assert redact_argv(["x", "--api-key", "--port", "8000"]) == ["x", "--api-key", "--port", "8000"]
    assert redact_argv(["x", "--token"]) == ["x", "--token"]


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "APP_SECRET",
        "PASSWORD",
        "DB_PASSWORD",
        "SMTP_PASS",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "hf_token",
        "Db_Password",
    ],
)
def test_env_style_assignments_are_masked(name: str) -> None:
    assert redact_argv(["env", f"{name}={KEY}", "vllm"]) == ["env", f"{name}={MASK}", "vllm"]
    assert redact_cmdline(f"env {name}={KEY} vllm") == f"env {name}={MASK} vllm"
    assert redact_text(f"started with {name}={KEY}, then") == f"started with {name}={MASK}, then"
    assert redact_env({name: KEY, "PATH": "/usr/bin"}) == {name: MASK, "PATH": "/usr/bin"}
    assert redact_env_list([f"{name}={KEY}", "NVIDIA_VISIBLE_DEVICES=0"]) == [
        f"{name}={MASK}",
        "NVIDIA_VISIBLE_DEVICES=0",
    ]
    # A value with nothing secret-looking about it: the name alone decides.
    assert redact_cmdline(f"env {name}=plainvalue vllm") == f"env {name}={MASK} vllm"
    assert redact_data({"detail": f"started with {name}=plainvalue"}) == {"detail": f"started with {name}={MASK}"}


def test_env_that_is_not_secret_stays() -> None:
    env = {
        "VLLM_KV_OFFLOAD_MMAP_PIN_MEMORY": "0",
        "NVIDIA_VISIBLE_DEVICES": "0,1",
        "TOKENIZERS_PARALLELISM": "false",
        "KEYBOARD": "us",
        "PASSAGE": "x",
    }
    assert redact_env(env) == env
    assert redact_argv([f"{k}={v}" for k, v in env.items()]) == [f"{k}={v}" for k, v in env.items()]


def test_bearer_tokens_urls_with_passwords_and_quoted_secrets() -> None:
    assert redact_text("Authorization: Bearer abcdef0123456789") == f"Authorization: Bearer {MASK}"
    assert redact_text("curl -H 'authorization: bearer abcdef0123456789'") == f"curl -H 'authorization: bearer {MASK}'"
    assert redact_text("Authorization: Basic dXNlcjpwYXNzd29yZA==") == f"Authorization: Basic {MASK}"
    assert redact_text("postgres://app:hunter2@db:5432/x") == f"postgres://app:{MASK}@db:5432/x"
    assert redact_text("https://u:p@ss@host/p") == f"https://u:{MASK}@host/p", "an @ inside the password"
    assert redact_text("https://ghp_0123456789abcdefghij@github.com/o/r") == f"https://{MASK}@github.com/o/r"
    # vLLM logs its non-default args as a dict: the quoted value under a secret-bearing key goes.
    logged = "non-default args: {'model': 'org/m', 'api_key': 'sk-live-SECRET123', 'max_num_batched_tokens': 8192}"
    assert (
        redact_text(logged)
        == f"non-default args: {{'model': 'org/m', 'api_key': '{MASK}', 'max_num_batched_tokens': 8192}}"
    )
    assert (
        redact_text('{"hf_token": "hf_x", "tokenizer": "org/tok"}')
        == f'{{"hf_token": "{MASK}", "tokenizer": "org/tok"}}'
    )
    for token in (
        "hf_AbCdEfGhIjKlMnOpQrSt",
        "sk-proj-0123456789abcdefXYZ",
        "ghp_0123456789abcdefABCD",
        "github_pat_11ABCDEFG0123456789_abc",
        "xoxb-1234567890-abcdef",
        "glpat-0123456789abcdefABCD",
    ):
        assert redact_text(f"run {token} now") == f"run {MASK} now", token
    # What is not a secret: a health URL with a port, a plain login in an ssh URL, a prose "bearer".
    for keep in ("http://127.0.0.1:8000/health", "ssh://git@host/x", "the bearer of bad news"):
        assert redact_text(keep) == keep


def test_cmdline_text_keeps_its_spacing_and_punctuation_and_is_idempotent() -> None:
    text = f"pid 4242 (vllm serve --api-key {KEY}) in no container uses GPU slot dark-compute-a"
    once = redact_cmdline(text)
    assert once == f"pid 4242 (vllm serve --api-key {MASK}) in no container uses GPU slot dark-compute-a"
    assert redact_cmdline(once) == once
    table = f"owned  1.00 MiB  4242 fd  python3 -c x --api-key {KEY}\n  next line\t--token  abc\n"
    assert (
        redact_cmdline(table)
        == f"owned  1.00 MiB  4242 fd  python3 -c x --api-key {MASK}\n  next line\t--token  {MASK}\n"
    )


def test_an_argument_with_spaces_is_read_as_a_command_line() -> None:
    assert redact_argv(["sh", "-c", f"vllm serve --api-key {KEY} --port 1"]) == [
        "sh",
        "-c",
        f"vllm serve --api-key {MASK} --port 1",
    ]
    assert redact_argv([f"vllm: serve --hf-token {KEY}"]) == [f"vllm: serve --hf-token {MASK}"]


def test_redact_data_walks_json_like_values() -> None:
    class Obj:
        def __str__(self) -> str:
            return f"obj --api-key {KEY}"

    data = {"a": [f"--api-key {KEY}", ("t", 1, None, True, 2.5)], "b": {"c": f"HF_TOKEN={KEY}"}, "o": Obj(), "n": 7}
    out = redact_data(data)
    assert out == {
        "a": [f"--api-key {MASK}", ["t", 1, None, True, 2.5]],
        "b": {"c": f"HF_TOKEN={MASK}"},
        "o": f"obj --api-key {MASK}",
        "n": 7,
    }
    assert SECRET not in json.dumps(out)


# ---------------------------------------------------------------- at the sources: read_comm, the GPU observer


@pytest.fixture
def secret_process() -> Iterator[subprocess.Popen[bytes]]:
    """The report's leak, for real: a process whose command line carries an API key (and a long tail)."""
    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--api-key", KEY, "--port", "8000", "--model", "x" * 200]
    )
    try:
        deadline = time.monotonic() + 10
        while b"--api-key" not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the process did not exec"
            time.sleep(0.01)
        yield p
    finally:
        p.kill()
        p.wait(timeout=10)


def test_read_comm_masks_a_real_process_before_cutting_it(secret_process: subprocess.Popen[bytes]) -> None:
    from reconciler.observe.procfs import read_comm

    raw = Path(f"/proc/{secret_process.pid}/cmdline").read_bytes()
    assert SECRET.encode() in raw, "the kernel holds the secret: the redaction is what keeps it in"
    cmd = read_comm(secret_process.pid)
    assert SECRET not in cmd
    assert cmd.startswith(f"{sys.executable} -c import time; time.sleep(60) --api-key {MASK} --port 8000 --model xxx")
    assert len(cmd) == 200


def test_gpu_processes_and_the_blocker_built_from_them_carry_no_secret(secret_process: subprocess.Popen[bytes]) -> None:
    """The GPU observer with its default command source (read_comm) on a real pid, then the planner and the
    status renderer on its answer: the pid is named, the key is not."""
    from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Recipe
    from reconciler.observe.gpu import observe_gpus
    from reconciler.plan.observed import observation
    from reconciler.plan.planner import plan
    from reconciler.service.status import status_data

    pid = secret_process.pid
    host = HostConfig(name="w", gpus={"a": {"index": 0}}, gpu_telemetry="nvml")
    raw = {
        "error": None,
        "driver_version": "x",
        "device_count": 1,
        "devices": [
            {
                "index": 0,
                "name": "gpu",
                "uuid": "GPU-0",
                "memory_total": 1,
                "memory_used": 1,
                "processes": [{"pid": pid, "used_gpu_memory": 1}],
                "errors": {},
            }
        ],
    }
    gpus = observe_gpus(host, read=lambda h: raw, container_of=lambda p: None)  # command_of: the default read_comm
    [proc] = gpus.slots["a"].processes
    assert proc.pid == pid and SECRET not in proc.command and f"--api-key {MASK}" in proc.command

    recipe = Recipe.model_validate(
        {"tensor_parallel_size": 1, "model": {"id": "m"}, "container": {"image": "i", "command": ["vllm"]}}
    )
    desired = DesiredState(
        host=host, recipes={"r": recipe}, assignments=(DesiredAssignment("r", ("a",), recipe.content_hash(), 0),)
    )
    observed = observation("w", gpus=gpus)
    p = plan(desired, observed)
    assert p.blocked and any(f"pid {pid}" in b.reason for b in p.blockers)
    text = json.dumps([p.to_json(), status_data(desired, observed, p)])
    assert str(pid) in text and SECRET not in text


# ---------------------------------------------------------------- at the boundaries: the loop's log, emit_json


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_carry_no_secret(fmt: str) -> None:
    from reconciler.loop.log import Log

    out = io.StringIO()
    log = Log(fmt, stream=out)
    log(
        "action",
        kind="enter",
        detail=f"vllm exited: {{'api_key': '{KEY}'}}",
        reason=f"pid 7 (x --api-key {KEY})",
        api_token=KEY,
        nested={"cmd": ["vllm", f"--hf-token={KEY}"]},
        n=3,
    )
    line = out.getvalue()
    assert SECRET not in line and "pid 7" in line
    if fmt == "text":
        assert "kind=enter" in line and f"api_token={MASK}" in line
    else:
        rec = json.loads(line)
        assert rec["api_token"] == MASK and rec["n"] == 3 and rec["reason"] == f"pid 7 (x --api-key {MASK})"


def test_emit_json_masks_strings_on_the_way_out(capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler.base.terminal import emit_json

    emit_json({"blockers": [{"reason": f"pid 9 (vllm --api-key {KEY}) uses GPU slot a"}], "n": 1, "p": Path("/x")})
    data = json.loads(capsys.readouterr().out)
    assert data == {"blockers": [{"reason": f"pid 9 (vllm --api-key {MASK}) uses GPU slot a"}], "n": 1, "p": "/x"}


# ---------------------------------------------------------------- end to end: real reconciler processes


def _all_output(*results: Any) -> str:
    return "\n".join(f"{r.stdout}\n{r.stderr}" for r in results)


@pytest.fixture
def e2e_root(tmp_path: Path, tmpfs_dir: Path, docker_api: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    from e2e_helpers import make_root

    r = make_root(tmp_path, shm=tmpfs_dir, api=docker_api, name=request.node.name)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.mark.docker
@pytest.mark.root
def test_a_process_holding_an_offload_file_with_an_api_key_leaks_nowhere(e2e_root: Any) -> None:
    root = e2e_root
    path = root.shm / "vllm_offload_secret.mmap"
    path.write_bytes(b"\xab" * (1 << 20))
    # The brief's command of the leak (Python by its full path), holding the offload file open as its stdin.
    with open(path, "rb") as held:
        holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--api-key", KEY], stdin=held)
    try:
        shm_json = root.cli("shm", "status", "--json")
        shm_text = root.cli("shm", "status")
        reclaim = root.cli("shm", "reclaim", "--json")
        plan_json = root.cli("plan", "--json")
        plan_text = root.cli("plan")
        status_json = root.cli("status", "--json")
        status_text = root.cli("status")
    finally:
        holder.kill()
        holder.wait(timeout=10)
    for r in (shm_json, shm_text, reclaim, plan_json, plan_text, status_json, status_text):
        assert r.rc == 0, str(r)
        assert SECRET not in r.stdout + r.stderr, str(r)
    [f] = shm_json.data["files"]
    assert f["state"] == "owned" and [o["pid"] for o in f["owners"]] == [holder.pid]
    assert f["owners"][0]["command"] == f"{sys.executable} -c import time; time.sleep(60) --api-key {MASK}"
    assert f"{holder.pid} fd" in shm_text.stdout and "held open by pid" in json.dumps(reclaim.data)
    assert str(holder.pid) in json.dumps(reclaim.data)
    assert path.exists(), "a dry run removes nothing"


@pytest.mark.docker
@pytest.mark.root
def test_an_unmanaged_container_with_an_api_key_blocks_a_slot_and_leaks_nowhere(e2e_root: Any) -> None:
    from e2e_helpers import build_image, docker_cli, wait_until

    root = e2e_root
    image = build_image()
    path = root.shm / "vllm_offload_squatter.mmap"
    path.write_bytes(b"\xab" * (1 << 20))
    script = "import mmap,os,time; fd=os.open(os.environ['F'], os.O_RDWR); m=mmap.mmap(fd, 0); time.sleep(300)"
    name = root.run_unmanaged(
        "squatter",
        "-e",
        f"NVIDIA_VISIBLE_DEVICES={root.slot_index['dark-compute-a']}",
        "-e",
        f"HF_TOKEN=hf-{SECRET}",
        "-e",
        f"F={path}",
        "-v",
        "/usr:/usr:ro",
        "-v",
        f"{root.shm}:{root.shm}",
        image,
        "/usr/bin/python3",
        "-c",
        script,
        "--api-key",
        KEY,
        f"--hf-token={KEY}",
    )
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-a"]))
    inspect = json.loads(docker_cli("inspect", name).stdout)[0]
    assert KEY in inspect["Args"] and f"HF_TOKEN=hf-{SECRET}" in inspect["Config"]["Env"], "the engine holds it"

    def owned() -> Any:
        files = root.shm_status()["files"]
        return files and files[0]["state"] == "owned" and files[0]["owners"]

    owners = wait_until(owned, timeout=30, what="the container to map the offload file")
    before = root.snapshot()

    shm_json = root.cli("shm", "status", "--json")
    shm_text = root.cli("shm", "status")
    plan_json = root.cli("plan", "--json")
    plan_text = root.cli("plan")
    status_json = root.cli("status", "--json")
    status_text = root.cli("status")
    apply_json = root.cli("apply", "--yes", "--json")
    for r in (shm_json, shm_text, plan_json, plan_text, status_json, status_text, apply_json):
        assert SECRET not in r.stdout + r.stderr, str(r)
    assert plan_json.rc == 3 and apply_json.rc == 3, str(plan_json)
    assert any(name in b["reason"] and "not managed" in b["reason"] for b in plan_json.data["blockers"]), str(plan_json)
    assert root.snapshot() == before, "blocked: nothing touched"
    pid = owners[0]["pid"]
    assert owners[0]["container"] == name
    assert f"--api-key {MASK} --hf-token={MASK}" in owners[0]["command"]
    assert f"{pid} map+fd ({name})" in shm_text.stdout
    assert os.path.exists(path)


# ---------------------------------------------------------------- learned secret values


@pytest.fixture
def learned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The values this test teaches the redaction are forgotten afterwards (they are process-wide)."""
    import reconciler.base.redact as r

    for name in ("_NEEDLES", "_NAMES", "_NAME_MARKERS", "_NAMED"):
        monkeypatch.setattr(r, name, getattr(r, name))
    yield


def test_a_learned_value_is_masked_in_every_form(learned: None) -> None:
    from reconciler.base.redact import learn_secrets, redact_fields

    value, odd = "Zq7pW2mXk9vR", "plain-access-4711x"
    texts = [
        f"HF_TOKEN={value}",
        f"HF_TOKEN: {value}",
        f"token is {value} (bare)",
        f"x{value}y",
        f"access {odd} granted",
        f'{{"MODEL_ACCESS": "{odd}"}}',
    ]
    # Before: no rule knows these shapes.
    assert [redact_text(t) for t in texts][2:] == texts[2:]
    learn_secrets({"HF_TOKEN": value, "MODEL_ACCESS": odd})
    out = [redact_text(t) for t in texts]
    assert out == [
        "HF_TOKEN=***",
        "HF_TOKEN: ***",
        "token is *** (bare)",
        "x***y",
        "access *** granted",
        '{"MODEL_ACCESS": "***"}',
    ]
    # Every way out: a command line, a JSON value, a log line's fields.
    assert value not in redact_cmdline(f"vllm serve m --served-model-name {value}")
    assert redact_data({"logs": [f"printed {value}"]}) == {"logs": ["printed ***"]}
    assert redact_fields({"detail": f"ERROR {odd}"}) == {"detail": "ERROR ***"}


def test_a_value_with_a_space_or_a_quote_is_masked_whole(learned: None) -> None:
    from reconciler.base.redact import learn_secrets, redact_json

    learn_secrets({"A": "two words here", "B": 'quo"te-and\\slash'})
    assert redact_cmdline("serve --model x two words here --port 1") == "serve --model x *** --port 1"
    # A lane that logs JSON quotes the value escaped: that form is a needle too.
    assert redact_text('{"b": "quo\\"te-and\\\\slash"}') == '{"b": "***"}'
    assert json.loads(redact_json({"x": 'quo"te-and\\slash'})) == {"x": "***"}


def test_a_short_value_is_masked_under_its_name_only(learned: None) -> None:
    """A value under MIN_SECRET_CHARS would turn up by chance in ordinary output (a port, a pid): it is masked
    after its name, not wherever it appears."""
    from reconciler.base.redact import MIN_SECRET_CHARS, learn_secrets

    assert MIN_SECRET_CHARS == 6
    learn_secrets({"LANE_PIN": "8000"})
    assert redact_text("listening on port 8000, pid 18000") == "listening on port 8000, pid 18000"
    assert redact_text("LANE_PIN=8000 and LANE_PIN: 8000") == "LANE_PIN=*** and LANE_PIN: ***"


def test_secret_file_and_environment_values_are_learned_where_read(
    learned: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.load.secrets import resolve

    env_file = tmp_path / "secrets.env"
    env_file.write_text("FROM_FILE=file-value-0001\nUNUSED=unused-value-0002\n")
    env_file.chmod(0o600)
    resolve(str(env_file), ["FROM_FILE", "FROM_ENV"], environ={"FROM_ENV": "env-value-0003"})
    assert redact_text("file-value-0001 unused-value-0002 env-value-0003") == "*** *** ***"
