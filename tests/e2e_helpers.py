"""Per-test reconciler roots for the end-to-end tests that drive the real command line against the real engine.

Used by tests/real/test_e2e_apply.py (``reconciler apply`` and the other one-shot commands), tests/real/test_loop.py
(``reconciler run``) and the benchmark tests/bench/bench_loop.py; tests/real/test_fake_vllm.py takes ``wait_until``.
``make_root`` copies the demo's configs (examples/demo/) into a directory of the test's
own and adjusts them so the test cannot disturb anything else on the machine, not even a second pytest run at
the same time:

- a host name of its own (every container the tool creates carries ``io.reconciler.host=<host>``, which is
  what ``Root.cleanup`` removes);
- GPU slot indexes drawn at random far from the demo's 0/1 (with ``gpu_telemetry: none`` a slot is only an id
  that containers claim through ``NVIDIA_VISIBLE_DEVICES``, so two roots must never share one);
- ``shm.dir`` on a tmpfs of its own, bind-mounted into the containers at the same path (``ipc = "host"``
  only shares /dev/shm) and passed to fake-vllm as ``--shm-dir``;
- free host ports for each recipe's health endpoint (``network = "host"``);
- recipe names with a per-root tag, since container names are engine-wide;
- a lock dir of its own through ``RECONCILER_LOCK_DIR`` in ``Root.env``.

Containers a test starts by hand (``Root.run_unmanaged``, not through the tool) carry ``TEST_LABEL`` instead of
the tool's labels, so that ``Root.cleanup`` removes them as well.

``LoopProcess`` runs ``reconciler run --log-format json`` on a root and reads its log line by line as it is
written (each line stamped with the time it was read), and scrapes its ``/metrics`` and ``/healthz``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "demo"
BUILD = REPO / "examples" / "fake-vllm" / "build.sh"
IMAGE = "reconciler/fake-vllm:latest"
# The tail of ``docker run`` for a container that only sleeps (no server, no GPU, no offload): the image's Python
# from the host's /usr. Flags that must come before the image go before it.
SLEEP = ("-v", "/usr:/usr:ro", IMAGE, "python3", "-c", "import time; time.sleep(300)")
LABEL_HOST = "io.reconciler.host"
# On the containers a test starts by hand (not through the tool), valued with the root's host, for the cleanup.
TEST_LABEL = "io.reconciler-e2e.test"


# ---------------------------------------------------------------- small helpers


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass (fails)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_prometheus(
    target: str, workdir: Path, *, rule_files: Sequence[Path] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Debian's Prometheus server scraping ``target`` (HOST:PORT) every second, storing under ``workdir``.

    Yields its base URL and process; stops it afterwards."""
    server = shutil.which("prometheus")
    assert server, "prometheus not found: install Debian's prometheus package (.ci/setup-host does)"
    port = free_port()
    cfg = workdir / "prometheus.yml"
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "reconciler", "static_configs": [{"targets": [target]}]}],
    }
    if rule_files:
        config["rule_files"] = [str(r) for r in rule_files]
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [
            server,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={workdir}/data",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_process(proc)


def fleet_prometheus(
    workdir: Path,
    targets: Sequence[tuple[str, str]],
    *,
    ip: str = "127.0.0.1",
    tls: tuple[Path, Path] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A real Prometheus on ``ip`` with examples/prometheus-fleet.yml's job over ``targets`` ((HOST:PORT, host name)
    each) and the shipped alert rules, their for: 5m shortened to 0s (expressions and summaries as shipped), storing
    under ``workdir``. ``tls``: (the CA's file, the read token's file) for the job's tls_config and authorization as
    shipped; without it the targets are scraped over plain HTTP (loopback, or api.insecure). (it, its base URL); the
    caller stops it (``stop_process``)."""
    rules = workdir / "alerts.yml"
    rules.write_text((REPO / "configs/prometheus/alerts.yml").read_text().replace("for: 5m", "for: 0s"))
    config = yaml.safe_load((REPO / "examples/prometheus-fleet.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(rules)]
    config["scrape_configs"][0]["scrape_timeout"] = "1s"
    config["scrape_configs"][0]["static_configs"] = [
        {"targets": [addr], "labels": {"host": host}} for addr, host in targets
    ]
    job = config["scrape_configs"][0]
    if tls is None:
        for key in ("scheme", "tls_config", "authorization"):
            job.pop(key)
    else:
        job["tls_config"]["ca_file"], job["authorization"]["credentials_file"] = (str(p) for p in tls)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = shutil.which("prometheus")
    assert server, "prometheus not found: .ci/setup-host installs Debian's prometheus"
    prom = subprocess.Popen(
        [
            server,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'prom-data'}",
            f"--web.listen-address={ip}:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return prom, f"http://{ip}:{port}"


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM a helper process the test started, and wait for it; killed if it does not end within ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


MIB = 1 << 20
OFFLOAD_PATTERN = "vllm_offload_*.mmap"


def make_file(path: Path, size: int = MIB, *, fill: bool = True) -> os.stat_result:
    """A file of ``size`` bytes; ``fill`` writes every byte (allocated on the tmpfs), else it stays sparse."""
    with open(path, "wb") as fh:
        if fill:
            chunk = b"\xab" * MIB
            left = size
            while left > 0:
                fh.write(chunk[: min(left, MIB)])
                left -= MIB
        else:
            fh.truncate(size)
    return os.stat(path)


def shm_config(d: Path, **kw: object) -> Any:
    """The shm guard's settings for a test's tmpfs ``d`` (``reconciler.model.ShmConfig``), ``kw`` over these.

    pid 1 is excused where it is unreadable even by root (e.g. a microVM init, as on the machines this project is
    built on; docs/design.md, safety rule 3), or the scans would fail closed. Where pid 1 is readable the excuse
    changes nothing: only a pid that could not be inspected is ever excused."""
    from reconciler.model import ShmConfig

    values: dict[str, object] = {
        "dir": str(d),
        "pattern": OFFLOAD_PATTERN,
        "confirm_interval_s": 0.2,
        "ignore_uninspectable_pids": [1],
    }
    values.update(kw)
    return ShmConfig(**values)  # type: ignore[arg-type]


def http_get(url: str, *, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def http_status(url: str, *, timeout: float = 1.0) -> int:
    """The status ``url`` answers with; 0 when nothing answered."""
    return http_get(url, timeout=timeout)[0]


def docker_cli(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``docker ARGS`` through the real CLI; with ``check``, a non-zero exit fails naming the command and its stderr."""
    proc = subprocess.run(["docker", *args], check=False, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def set_flag(cmd: list[str], flag: str, value: str) -> list[str]:
    """``cmd`` with ``flag``'s value replaced, or the flag appended when it is absent."""
    out = list(cmd)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {type(v).__name__}")


def dump_recipe(data: dict[str, Any]) -> str:
    """TOML for a recipe dict (top-level keys, then one table per section): the subset recipes use."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if isinstance(table, dict):
            lines.append(f"\n[{section}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def build_image() -> str:
    """Build fake-vllm's image if it is not up to date (a no-op in a second when it is); return its name."""
    proc = subprocess.run(["sh", str(BUILD)], capture_output=True, text=True, timeout=180, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{BUILD} failed: {proc.stdout}{proc.stderr}")
    return IMAGE


@dataclass
class CliResult:
    args: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    @property
    def data(self) -> Any:
        try:
            return json.loads(self.stdout)
        except ValueError as exc:
            raise AssertionError(f"{self} did not print JSON: {exc}") from None

    def __str__(self) -> str:
        return f"reconciler {' '.join(self.args)} -> {self.rc}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


# ---------------------------------------------------------------- the per-test root


@dataclass
class Root:
    """A reconciler root of one test, and what the test needs to drive and inspect it."""

    path: Path
    host: str
    tag: str
    shm: Path
    api: Any  # docker.APIClient
    env: dict[str, str]
    slot_index: dict[str, int]
    recipes: dict[str, str] = field(default_factory=dict)  # demo recipe name -> this root's recipe name

    @property
    def lock_dir(self) -> Path:
        return Path(self.env["RECONCILER_LOCK_DIR"])

    # -- configs

    def recipe(
        self,
        base: str,
        *,
        port: int | None = None,
        mode: str | None = None,
        offload_mib: int | None = None,
        start_timeout_s: float = 12,
        settle_s: float = 0.2,
        drain_timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> str:
        """Write the demo recipe ``base`` under this root's name for it, adjusted for this root; return the name.

        ``mode`` sets fake-vllm's FAKE_VLLM_MODE switches (fail-start, crash-after=S, start-delay=S, ...); ``env``
        more environment, ``args`` more fake-vllm options (``--max-num-seqs 1``), ``drain_timeout_s`` the recipe's
        drain.timeout_s. The model id is set to the served name, so the demo recipe's probes ask for it.
        Writing it again (same ``base``) replaces the file: the recipe's hash changes when its content does.
        """
        data = tomllib.loads((DEMO / "configs" / "recipes" / f"{base}.toml").read_text())
        name = self.recipes.get(base) or f"{base}-{self.tag}"
        self.recipes[base] = name
        port = port or free_port()
        c = data["container"]
        cmd = list(c["command"])
        cmd[2] = f"e2e/{name}"  # vllm serve MODEL
        data["model"]["id"] = cmd[2]  # the served model's name: what the recipe's probes ask for
        cmd = set_flag(cmd, "--port", str(port))
        cmd = set_flag(cmd, "--shm-dir", str(self.shm))
        if offload_mib is not None:
            cmd = set_flag(cmd, "--kv-offloading-size", repr(offload_mib / 1024))
            data["offload"]["capacity_gib"] = offload_mib / 1024
        c["command"] = cmd
        c["volumes"] = [*c.get("volumes", []), f"{self.shm}:{self.shm}"]
        cmd += list(args)
        c["command"] = cmd
        c.get("env", {}).pop("FAKE_VLLM_MODE_FILE", None)  # the demo's forced-failure switch is the demo's only
        if mode:
            c["env"] = {**c.get("env", {}), "FAKE_VLLM_MODE": mode}
        if env:
            c["env"] = {**c.get("env", {}), **env}
        if drain_timeout_s is not None:
            data.setdefault("drain", {})["timeout_s"] = drain_timeout_s
        data["health"].update(url=f"http://127.0.0.1:{port}/health", settle_s=settle_s, start_timeout_s=start_timeout_s)
        data["stop"]["timeout_s"] = 5
        self.write_recipe(name, data)
        return name

    def sleeping_recipe(
        self, label: str, *, tp: int = 1, level: int = 1, mode: str | None = None, start_timeout_s: float = 12
    ) -> str:
        """A copy of the demo's omni named ``label``-TAG on a port of its own, with ``tp`` workers and vLLM's sleep
        mode: --enable-sleep-mode, VLLM_SERVER_DEV_MODE=1 and ``[sleep] level``. Returns its name."""
        base = self.recipe(
            "omni",
            mode=mode,
            start_timeout_s=start_timeout_s,
            args=["--enable-sleep-mode"],
            env={"VLLM_SERVER_DEV_MODE": "1"},
        )
        data = self.recipe_data(base)
        (self.path / "configs" / "recipes" / f"{base}.toml").unlink()
        del self.recipes["omni"]
        name = f"{label}-{self.tag}"
        cmd = set_flag(data["container"]["command"], "--tensor-parallel-size", str(tp))
        cmd[2] = f"e2e/{name}"
        data["model"]["id"] = cmd[2]
        data["container"]["command"] = cmd
        data["tensor_parallel_size"] = tp
        data["sleep"] = {"level": level, "timeout_s": 20}
        self.write_recipe(name, data)
        return name

    def write_recipe(self, name: str, data: dict[str, Any]) -> None:
        """Write a recipe file atomically (a rename), as an editor's save would, so a watcher never reads half."""
        path = self.path / "configs" / "recipes" / f"{name}.toml"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(dump_recipe(data))
        tmp.replace(path)

    def recipe_data(self, name: str) -> dict[str, Any]:
        return tomllib.loads((self.path / "configs" / "recipes" / f"{name}.toml").read_text())

    def port_of(self, name: str) -> int:
        cmd = self.recipe_data(name)["container"]["command"]
        return int(cmd[cmd.index("--port") + 1])

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifests" / "demo.yaml"

    def manifest(self, *assignments: tuple[str, Sequence[str]]) -> None:
        """Write the manifest (atomically, by rename) with these (recipe, slots) assignments."""
        doc = {"host": self.host, "assignments": [{"recipe": r, "gpus": list(g)} for r, g in assignments]}
        self.write_manifest_text(yaml.safe_dump(doc, sort_keys=False))

    def write_manifest_text(self, text: str) -> None:
        tmp = self.manifest_path.with_name(".demo.yaml.tmp")
        tmp.write_text(text)
        tmp.replace(self.manifest_path)

    # -- the command line

    def cli_args(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "reconciler", "--root", str(self.path), *args]

    def on_a_terminal(
        self, *args: str, timeout: float = 60, on_prompt: Callable[[], bytes] | None = None
    ) -> tuple[int, str, bool]:
        """The command line on this root with its stdin and stdout on a real terminal (a pty), read until it ends
        or ``timeout``: (exit code, output, whether it asked ``[y/N]``). At the prompt ``on_prompt`` is called
        once, and what it returns is typed."""
        import pty

        argv = self.cli_args(*args)
        pid, fd = pty.fork()
        if pid == 0:  # the child: stdin/stdout on the terminal
            os.execvpe(argv[0], argv, self.env)
        out = b""
        deadline = time.monotonic() + timeout
        asked = False
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if on_prompt is not None and not asked and b"[y/N]" in out:
                asked = True
                os.write(fd, on_prompt())
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), out.decode(errors="replace"), asked

    def with_secret(self, env_file: Path, slot: str = "dark-compute-b") -> str:
        """omni on ``slot`` with HF_TOKEN in its environment, a secret read from ``env_file`` (host.yaml's
        secrets.env_file); returns the recipe's name."""
        omni = self.recipe("omni")
        data = self.recipe_data(omni)
        data["container"]["env"] = {**data["container"].get("env", {}), "HF_TOKEN": "${HF_TOKEN}"}
        self.write_recipe(omni, data)
        host_file = self.path / "configs" / "host.yaml"
        doc = yaml.safe_load(host_file.read_text())
        doc["secrets"] = {"env_file": str(env_file)}
        host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.manifest((omni, [slot]))
        return omni

    def cli(self, *args: str, timeout: float = 90, env: dict[str, str] | None = None) -> CliResult:
        """The command line on this root; ``env`` adds to the root's environment (``RECONCILER_NO_LOOP=1``: the
        command runs stand-alone even while a loop runs)."""
        proc = subprocess.run(
            self.cli_args(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, **(env or {})},
            check=False,
        )
        return CliResult(args, proc.returncode, proc.stdout, proc.stderr)

    def apply(self) -> CliResult:
        return self.cli("apply", "--yes", "--json")

    def status(self) -> dict[str, Any]:
        r = self.cli("status", "--json")
        if r.rc != 0:
            raise AssertionError(str(r))
        return r.data

    def shm_status(self) -> dict[str, Any]:
        r = self.cli("shm", "status", "--json")
        if r.rc != 0:
            raise AssertionError(str(r))
        return r.data

    # -- the engine

    def containers(self) -> list[dict[str, Any]]:
        """Every container of this root's host (managed by the tool), stopped and kept ones included."""
        return self.api.containers(all=True, filters={"label": f"{LABEL_HOST}={self.host}"})

    def unmanaged(self) -> list[dict[str, Any]]:
        """Every container the test started by hand (``run_unmanaged``), stopped ones included."""
        return self.api.containers(all=True, filters={"label": f"{TEST_LABEL}={self.host}"})

    def snapshot(self) -> dict[str, tuple[str, str]]:
        """id -> (name, state) of every container this root's host owns or the test started: to prove nothing was
        touched."""
        return {c["Id"]: (c["Names"][0].lstrip("/"), c["State"]) for c in self.containers() + self.unmanaged()}

    def running(self) -> dict[str, dict[str, Any]]:
        return {c["Names"][0].lstrip("/"): c for c in self.containers() if c["State"] == "running"}

    def cname(self, recipe: str, *slots: str) -> str:
        return f"reconciler-{recipe}-{'-'.join(slots)}"

    def shm_files(self) -> list[str]:
        return sorted(p.name for p in self.shm.iterdir())

    def install_id(self) -> str:
        """This root's install id (made now if the root has none yet), as its commands read it."""
        from reconciler.store import state

        before = os.environ.get("RECONCILER_STATE_DIR")
        os.environ["RECONCILER_STATE_DIR"] = self.env["RECONCILER_STATE_DIR"]
        try:
            return state.ensure_install_id(self.host)
        finally:
            if before is None:
                del os.environ["RECONCILER_STATE_DIR"]
            else:
                os.environ["RECONCILER_STATE_DIR"] = before

    def run_unmanaged(self, name: str, *args: str) -> str:
        """``docker run -d ARGS`` outside the tool as ``NAME-<tag>``, labelled for the cleanup only (no ownership
        label, so the tool sees it as unmanaged); return the container's name."""
        full = f"{name}-{self.tag}"
        docker_cli("run", "-d", "--name", full, "--label", f"{TEST_LABEL}={self.host}", *args)
        return full

    def cleanup(self) -> None:
        """Remove every container of this root's host, kept failed ones included, then every one the test started."""
        import docker.errors

        for c in self.containers():
            # Already gone (removed by the loop meanwhile) is fine; the next test must still get a clean engine.
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self.api.remove_container(c["Id"], force=True, v=True)
        for c in self.unmanaged():
            with contextlib.suppress(docker.errors.NotFound):  # removed by the test itself meanwhile
                self.api.remove_container(c["Id"], force=True, v=True)


def make_root(base_dir: Path, *, shm: Path, api: Any, name: str, confirm_interval_s: float = 0.2) -> Root:
    """A root under ``base_dir`` (``base_dir/root``, lock dir ``base_dir/lock``) for the test called ``name``.

    Recipes are not copied: the test writes the ones it uses with ``Root.recipe``.
    """
    tag = uuid.uuid4().hex[:6]
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:24]
    host = f"e2e-{slug}-{tag}"
    path = base_dir / "root"
    shutil.copytree(DEMO, path)
    for f in (path / "configs" / "recipes").glob("*.toml"):
        f.unlink()
    (path / "manifests" / "demo.yaml").write_text(yaml.safe_dump({"host": host, "assignments": []}))
    # Even indexes drawn at random: another root (this run's or a parallel one's) is unlikely to draw the same, and
    # none that a running container of this tool claims (an earlier root's lane whose loop outlived its cleanup
    # would rightly block this root's enter on the same GPU).
    claimed: set[str] = set()
    with contextlib.suppress(Exception):
        for c in api.containers():
            claimed.update(((c.get("Labels") or {}).get("io.reconciler.gpus") or "").split(","))
    base = 64 + 2 * random.randrange(480)  # within the host file's bound on a GPU index (0..1023)
    while str(base) in claimed or str(base + 1) in claimed:
        base = 64 + 2 * random.randrange(480)
    doc = yaml.safe_load((DEMO / "configs" / "host.yaml").read_text())
    doc["name"] = host
    doc["gpus"] = {"dark-compute-a": {"index": base}, "dark-compute-b": {"index": base + 1}}
    doc["shm"].update(dir=str(shm), confirm_interval_s=confirm_interval_s, reserve_gib=0.0078125)  # 8 MiB
    (path / "configs" / "host.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        **os.environ,
        "RECONCILER_LOCK_DIR": str(base_dir / "lock"),
        "RECONCILER_STATE_DIR": str(base_dir / "state"),
        "NO_COLOR": "1",
    }
    env.pop("RECONCILER_ROOT", None)
    return Root(
        path=path,
        host=host,
        tag=tag,
        shm=shm,
        api=api,
        env=env,
        slot_index={"dark-compute-a": base, "dark-compute-b": base + 1},
    )


# ---------------------------------------------------------------- the loop as a process


@dataclass(frozen=True)
class Event:
    at: float  # time.time() when the line was read: a bound on when the loop wrote it
    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


class LoopProcess:
    """``reconciler run`` in a subprocess, its JSON log parsed line by line as it comes."""

    def __init__(self, root: Root, *extra: str, ip: str = "127.0.0.1", prefix: Sequence[str] = ()):
        """``ip``: where its listener is; ``prefix``: what runs it (``nsenter --net=...`` for a host of its own)."""
        self.root = root
        self.port = free_port()
        self.addr = f"{ip}:{self.port}"
        run = root.cli_args("run", "--metrics-addr", self.addr, "--resync", "60", "--log-format", "json", *extra)
        self.args = [*prefix, *run]
        self.events: list[Event] = []
        self.other: list[str] = []  # lines that are not JSON (a traceback would land here)
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            self.args, env=root.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            at = time.time()
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            with self._cond:
                if isinstance(data, dict) and "event" in data:
                    self.events.append(Event(at, data))
                else:
                    self.other.append(line.rstrip("\n"))
                self._cond.notify_all()

    # -- the log

    def mark(self) -> int:
        """Index of the next event: pass it as ``after`` to wait for what happens from now on."""
        with self._cond:
            return len(self.events)

    def find(self, event: str, *, after: int = 0, **match: Any) -> list[Event]:
        with self._cond:
            found = self.events[after:]
        return [e for e in found if e["event"] == event and all(_matches(e.get(k), v) for k, v in match.items())]

    def wait(self, event: str, *, timeout: float, after: int = 0, count: int = 1, **match: Any) -> list[Event]:
        """The first ``count`` events named ``event`` at index >= ``after`` whose fields match (a value or a test)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find(event, after=after, **match)
            if len(found) >= count:
                return found[:count]
            if self.proc.poll() is not None:
                time.sleep(0.1)  # let the readers drain the last lines
                raise AssertionError(f"the loop exited ({self.proc.returncode}) before {event} {match}\n{self.log()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for {count}x {event} {match}\n{self.log()}")
            with self._cond:
                self._cond.wait(min(left, 0.1))

    def log(self) -> str:
        with self._cond:
            return "\n".join([json.dumps(e.data) for e in self.events[-60:]] + self.other[-40:])

    def started(self, timeout: float = 20) -> LoopProcess:
        """Wait for the first pass (the one the start triggers is always logged)."""
        self.wait("pass", trigger=lambda t: "start" in t.split(","), timeout=timeout)
        return self

    # -- HTTP

    def scrape(self) -> str:
        status, body = http_get(f"http://{self.addr}/metrics")
        assert status == 200, f"/metrics answered {status}"
        return body.decode()

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for fam in text_string_to_metric_families(self.scrape()):
            for s in fam.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, frozenset(labels.items())))

    def healthz(self) -> tuple[int, dict[str, Any]]:
        status, body = http_get(f"http://{self.addr}/healthz")
        return status, json.loads(body) if body else {}

    # -- lifecycle

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait; a loop that does not exit in time is killed and the test fails on it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the loop did not exit within {timeout} s of SIGTERM\n{self.log()}") from None


def _matches(value: Any, want: Any) -> bool:
    if callable(want):
        return value is not None and bool(want(value))
    return value == want
