"""A git source is root on every host that follows it: what the host file bounds (``source.allow``,
reconciler/load/admission.py) and how commits may reach it (``source.insecure_transport``), with the real git CLI
on real repositories and the command as a whole process.

A commit titled "routine bump" whose recipe bind-mounts ``/root`` and ``/etc`` (the review's), or asks for
``--privileged``, a mount that a symlink leads out of an allowed directory, a read-write mount of a read-only one,
the host's network or a secret the host did not name, is refused like a commit whose files do not validate: each
problem named ``COMMIT:PATH:LINE`` with the rule it broke, the commit in use kept, nothing created. A recipe within
the bound is taken. The same recipe in a local root (no source) is the operator's own and validates. A source over
``http://`` (a real dumb-HTTP server) or ``git://`` (``git daemon``) is refused by ``validate`` until
``insecure_transport: true`` says the host takes that risk, and then warned of; with it, a commit is fetched over
it."""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import DEMO, Root, dump_recipe, make_root, stop_process

from real.test_git_source import DEMO_ALLOW, Repo, _serve, cli, follow

B = "dark-compute-b"


@pytest.fixture
def plain_root(tmp_path: Path, tmpfs_dir: Path) -> Root:
    return make_root(tmp_path / "h", shm=tmpfs_dir, api=None, name="git-admission")


def _recipe(repo: Repo, name: str, **container: Any) -> str:
    """The demo's omni recipe as ``name`` in the repository, its [container] changed by ``container``; its text."""
    data = tomllib.loads((DEMO / "configs" / "recipes" / "omni.toml").read_text())
    data["container"].update(container)
    text = dump_recipe(data)
    repo.write(f"configs/recipes/{name}.toml", text)
    return text


def _line(text: str, key: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), start=1) if line.startswith(f'"{key}" ='))


def _sync(root: Root) -> tuple[int, dict[str, Any]]:
    r = cli(root, "--json", "sync")
    return r.returncode, json.loads(r.stdout)["source"]


def test_a_commit_whose_recipes_ask_past_the_hosts_bound_is_refused_naming_the_line_and_the_rule(
    plain_root: Root, tmp_path: Path
) -> None:
    root = plain_root
    models = tmp_path / "models"
    (models / "weights").mkdir(parents=True)
    (models / "escape").symlink_to("/etc")
    repo = Repo(tmp_path / "repo")
    _recipe(repo, "omni")
    repo.manifest(root.host, ("omni", [B]))
    first = repo.commit("omni on b")
    follow(
        root,
        str(repo.path),
        allow={**DEMO_ALLOW, "mounts": ["/usr:ro", str(models)], "env_from_secrets": ["HF_TOKEN"]},
    )
    code, src = _sync(root)
    assert code == 0 and src["commit"] == first, src

    # The review's commit: /root and /etc bind-mounted, under a harmless title.
    bump = _recipe(repo, "omni-next", volumes=["/usr:/usr:ro", "/root:/host-root", "/etc:/host-etc:ro"])
    repo.manifest(root.host, ("omni-next", [B]))
    hostile = repo.commit("routine bump")
    code, src = _sync(root)
    assert code == 1 and src["state"] == "refused" and src["commit"] == first, src
    where = f"{hostile[:12]}:fleet/configs/recipes/omni-next.toml:{_line(bump, 'volumes')}: container.volumes: "
    assert src["refused"]["problems"] == [
        f"{where}'/root:/host-root' mounts /root, outside the directories source.allow.mounts lists (/usr:ro, "
        f"{models}; shm.dir {root.shm} is always allowed): refused by source.allow.mounts of configs/host.yaml (a "
        "recipe from git may ask of this host only what its host file allows). Mount only what the host allows, or "
        "add the directory there if lanes of this host may have it",
        f"{where}'/etc:/host-etc:ro' mounts /etc, outside the directories source.allow.mounts lists (/usr:ro, "
        f"{models}; shm.dir {root.shm} is always allowed): refused by source.allow.mounts of configs/host.yaml (a "
        "recipe from git may ask of this host only what its host file allows). Mount only what the host allows, or "
        "add the directory there if lanes of this host may have it",
    ], src["refused"]["problems"]
    assert cli(root, "validate").returncode == 0  # the commit in use still stands

    # --privileged: a recipe has no such key; the commit is refused at its line all the same.
    priv = _recipe(repo, "omni-next", privileged=True)
    privileged = repo.commit("routine bump, again")
    code, src = _sync(root)
    (problem,) = src["refused"]["problems"]
    assert code == 1 and src["commit"] == first, src
    assert problem.startswith(f"{privileged[:12]}:fleet/configs/recipes/omni-next.toml:{_line(priv, 'privileged')}: ")
    assert "unknown key 'privileged'" in problem, problem

    # Past the bound in each other way: a symlink under an allowed directory leading out of it, a read-only
    # directory mounted read-write, a secret the host did not name, and (on a host that does not allow it) the
    # host's network.
    sneaky = _recipe(
        repo,
        "omni-next",
        volumes=["/usr:/usr", f"{models}/escape:/models"],
        env={"HF_TOKEN": "${HF_TOKEN}", "LEAK": "${RECONCILER_API_TOKEN}"},
    )
    several = repo.commit("tidy")
    code, src = _sync(root)
    problems = src["refused"]["problems"]
    assert code == 1 and src["commit"] == first and len(problems) == 3, problems
    at = f"{several[:12]}:fleet/configs/recipes/omni-next.toml"
    assert problems[0].startswith(f"{at}:{_line(sneaky, 'volumes')}: container.volumes: '/usr:/usr' mounts /usr ")
    assert "read-write, which source.allow.mounts allows read-only only" in problems[0]
    assert f"{models}/escape, which leads to /etc on this host" in problems[1]
    assert problems[2].startswith(f"{at}:{_line(sneaky, 'env')}: container.env.LEAK: takes the secret ")
    assert "refused by source.allow.env_from_secrets" in problems[2]

    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["source"]["allow"]["network_host"] = False
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, src = _sync(root)
    assert code == 1 and any(
        f":{_line(sneaky, 'network')}: container.network: network = 'host' shares the host's network namespace: "
        "refused by source.allow.network_host" in p
        for p in src["refused"]["problems"]
    ), src["refused"]["problems"]
    doc["source"]["allow"]["network_host"] = True
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))

    # Within the bound: the model cache read-only, a directory under it, the offload tmpfs, a secret named.
    _recipe(
        repo,
        "omni-next",
        volumes=["/usr:/usr:ro", f"{models}/weights:/models:ro", f"{root.shm}:{root.shm}"],
        env={"HF_TOKEN": "${HF_TOKEN}"},
    )
    fine = repo.commit("the model cache, read-only")
    r = subprocess.run(
        root.cli_args("--json", "sync"),
        env={**root.env, "HF_TOKEN": "hf_not_a_real_token"},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["commit"] == fine, r

    # The operator's own root is not judged: the review's recipe validates there.
    local = make_root(tmp_path / "local", shm=root.shm, api=None, name="git-admission-local")
    (local.path / "configs" / "recipes" / "omni-next.toml").write_text(bump)
    (local.path / "manifests" / "demo.yaml").write_text(
        yaml.safe_dump({"host": local.host, "assignments": [{"recipe": "omni-next", "gpus": [B]}]})
    )
    r = cli(local, "validate")
    assert r.returncode == 0, r


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def dumb_http(tmp_path: Path) -> Iterator[tuple[Repo, str]]:
    """A repository served over plain HTTP by a real HTTP server (git's dumb protocol: a bare clone's files)."""
    repo = Repo(tmp_path / "work")
    served = tmp_path / "served"
    served.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield repo, f"http://127.0.0.1:{server.server_address[1]}/fleet.git"
    finally:
        server.shutdown()
        server.server_close()


def _publish(repo: Repo, served: Path) -> None:
    bare = served / "fleet.git"
    if not bare.exists():
        subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, timeout=30)
    repo.git("push", "-q", "--force", str(bare), "main")
    subprocess.run(["git", "--git-dir", str(bare), "update-server-info"], check=True, timeout=30)


@pytest.mark.parametrize("transport", ["http", "git"])
def test_a_plaintext_transport_is_refused_unless_the_host_takes_the_risk_and_then_warned_of(
    plain_root: Root, tmp_path: Path, dumb_http: tuple[Repo, str], transport: str
) -> None:
    root = plain_root
    repo, url = dumb_http
    daemon = None
    repo.manifest(root.host)
    first = repo.commit("nothing on the host")
    _publish(repo, tmp_path / "served")
    if transport == "git":
        daemon, url = _serve(tmp_path / "served", "127.0.0.1")
        url = url.removesuffix("/repo") + "/fleet.git"
    try:
        follow(root, url)
        r = cli(root, "validate")
        assert r.returncode == 1, r
        assert "configs/host.yaml:" in r.stderr and f"{transport}:// neither authenticates the server" in r.stderr, r
        assert "source.insecure_transport: true" in r.stderr, r
        r = cli(root, "sync")
        assert r.returncode == 1 and "insecure_transport" in r.stderr, r  # nothing fetched

        follow(root, url, insecure_transport=True)
        code, src = _sync(root)
        assert code == 0 and src["commit"] == first, src
        r = cli(root, "validate")
        assert r.returncode == 0 and "warning: configs/host.yaml: source.insecure_transport is true" in r.stderr, r
        warnings = json.loads(cli(root, "--json", "validate").stdout)["warnings"]
        assert any("insecure_transport is true" in w for w in warnings), warnings
        assert any("allowed_signers is not set" in w for w in warnings), warnings
    finally:
        if daemon is not None:
            stop_process(daemon)
