"""The desired state from a git repository (``source:`` of the host file; reconciler/load/git_source.py,
reconciler/load/source_sync.py): the real git CLI on real repositories, the command as a whole process, and three
real loops on the real engine following one repository served on loopback by ``git daemon``.

What a host learns from git goes through the validation a local file meets: a commit whose files do not validate is
refused with the commit and the file named and the commit in use kept; nothing in the repository can make the host
read outside its folder (a symlink is refused, never followed); a value that would reach git's command line as an
option or a program is refused by validate. With ``after:`` a host takes a commit only once its canary reports it
converged, and a commit that leaves the canary blocked never reaches it."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import _mounted_tmpfs
from e2e_helpers import (
    DEMO,
    LoopProcess,
    Root,
    dump_recipe,
    free_port,
    make_root,
    stop_process,
    wait_until,
)
from test_api import TOKEN, token_file

B = "dark-compute-b"
GIT_ID = ["-c", "user.name=fleet", "-c", "user.email=fleet@example.invalid"]


class Repo:
    """A git repository of manifests and recipes under ``fleet/``, committed with the git CLI."""

    def __init__(self, path: Path):
        self.path = path
        (path / "fleet" / "manifests").mkdir(parents=True)
        (path / "fleet" / "configs" / "recipes").mkdir(parents=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", *GIT_ID, *args], cwd=self.path, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    def write(self, rel: str, text: str) -> None:
        p = self.path / "fleet" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def manifest(self, host: str, *assignments: tuple[str, list[str]]) -> None:
        doc = {"host": host, "assignments": [{"recipe": r, "gpus": g} for r, g in assignments]}
        self.write(f"manifests/{host}.yaml", yaml.safe_dump(doc, sort_keys=False))

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")


def follow(root: Root, url: str, **source: Any) -> None:
    """Point the root's host file at ``url`` and take its own manifests and recipes away: only git's are read."""
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["source"] = {"git": url, "ref": "main", "path": "fleet", "interval_s": 5, **source}
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    for f in [*(root.path / "manifests").iterdir(), *(root.path / "configs" / "recipes").iterdir()]:
        f.unlink()


def cli(root: Root, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(root.cli_args(*args), env=root.env, capture_output=True, text=True, timeout=90, check=False)


@pytest.fixture
def plain_root(tmp_path: Path, tmpfs_dir: Path) -> Root:
    """A root whose commands here need no engine (validate, sync)."""
    return make_root(tmp_path / "h", shm=tmpfs_dir, api=None, name="git-source")


def test_a_commit_is_taken_only_once_it_validates_and_a_broken_one_keeps_the_last(
    plain_root: Root, tmp_path: Path
) -> None:
    root = plain_root
    repo = Repo(tmp_path / "repo")
    (repo.path / "fleet" / "configs" / "recipes" / "omni.toml").write_text(
        (DEMO / "configs" / "recipes" / "omni.toml").read_text()
    )
    repo.manifest(root.host, ("omni", [B]))
    first = repo.commit("omni on b")
    follow(root, str(repo.path))

    # Before any fetch there is nothing to plan from, and it says so (never the root's own files).
    r = cli(root, "validate")
    assert r.returncode == 1 and "source: no commit of" in r.stderr and "reconciler sync" in r.stderr, r

    r = cli(root, "--json", "sync")
    assert r.returncode == 0, r
    data = json.loads(r.stdout)
    assert data["taken"] is True and data["source"]["commit"] == first and data["source"]["state"] == "following"
    r = cli(root, "validate")
    assert r.returncode == 0, r

    # A broken commit: refused, named by commit and file, the commit in use kept.
    repo.write(
        f"manifests/{root.host}.yaml",
        f"host: {root.host}\nassignments:\n  - recipe: omni\n    gpus: [{B}]\n    colour: red\n",
    )
    broken = repo.commit("a typo")
    r = cli(root, "--json", "sync")
    assert r.returncode == 1, r
    src = json.loads(r.stdout)["source"]
    assert src["state"] == "refused" and src["commit"] == first and src["fetched"] == broken
    (problem,) = src["refused"]["problems"]
    assert problem.startswith(f"{broken[:12]}:fleet/manifests/{root.host}.yaml:5: ") and "colour" in problem, problem
    assert cli(root, "validate").returncode == 0  # the commit in use still validates: nothing changed

    # A symlink where a recipe would be is refused, never followed.
    (repo.path / "fleet" / "manifests" / f"{root.host}.yaml").write_text(f"host: {root.host}\nassignments: []\n")
    (repo.path / "fleet" / "configs" / "recipes" / "evil.toml").symlink_to("/etc/passwd")
    sneaky = repo.commit("a link")
    r = cli(root, "--json", "sync")
    src = json.loads(r.stdout)["source"]
    assert r.returncode == 1 and src["commit"] == first, r
    assert src["refused"]["problems"] == [
        f"{sneaky[:12]}:fleet/configs/recipes/evil.toml: a symlink in the source: only regular files are read; "
        "commit the file itself"
    ]

    # Fixed: taken, and every sync is in the audit trail with its commit.
    (repo.path / "fleet" / "configs" / "recipes" / "evil.toml").unlink()
    fixed = repo.commit("no link")
    r = cli(root, "--json", "sync")
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["commit"] == fixed, r
    audit = json.loads(cli(root, "--json", "audit").stdout)
    syncs = [(a["outcome"], a.get("commit")) for a in audit["records"] if a["action"] == "sync"]
    assert syncs == [("ok", first), ("refused", broken), ("refused", sneaky), ("ok", fixed)], syncs
    # The switch edits a local manifest: with a git source it is refused, and says where to switch.
    r = cli(root, "switch", "other")
    assert r.returncode == 1 and "comes from the git source" in r.stderr, r


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("--upload-pack=touch /tmp/pwned", "without spaces"),
        ("-oProxyCommand=x", "read it as an option"),
        ("ext::sh%20-c%20touch", "transports that run a program"),
        ("https://user:secret-pass@example.com/fleet.git", "no credentials in the URL"),
        ("ftp://example.com/fleet.git", "is not one of"),
    ],
)
def test_a_git_url_that_git_would_run_or_print_is_refused(plain_root: Root, url: str, says: str) -> None:
    host_file = plain_root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["source"] = {"git": url}
    host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cli(plain_root, "validate")
    assert r.returncode == 1 and "configs/host.yaml:" in r.stderr and says in r.stderr, r
    assert "secret-pass" not in r.stdout + r.stderr
    assert not Path("/tmp/pwned").exists()


@pytest.fixture
def git_daemon(tmp_path: Path) -> Iterator[tuple[Repo, str]]:
    """A repository served on loopback by ``git daemon`` (git://127.0.0.1:PORT/repo)."""
    base = tmp_path / "served"
    base.mkdir()
    repo = Repo(base / "repo")
    port = free_port()
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            f"--base-path={base}",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield repo, f"git://127.0.0.1:{port}/repo"
    finally:
        stop_process(proc)


def _status(lp: LoopProcess) -> dict[str, Any]:
    req = urllib.request.Request(f"http://{lp.addr}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_three_hosts_follow_one_repository_with_a_canary(
    tmp_path: Path, docker_api: Any, image: str, git_daemon: tuple[Repo, str]
) -> None:
    repo, url = git_daemon
    mounts = [_mounted_tmpfs("reconciler-git-", "64m") for _ in range(3)]
    roots: list[Root] = []
    loops: list[LoopProcess] = []
    try:
        for i, m in enumerate(mounts):
            roots.append(make_root(tmp_path / f"h{i}", shm=next(m), api=docker_api, name=f"git-h{i}"))
        canary, follower, other = roots
        tf = token_file(tmp_path)
        # Each host's lane is a recipe of the repository (its own name and port); the files go to git, not the root.
        names = [r.recipe("omni") for r in roots]
        for r, name in zip(roots, names, strict=True):
            shutil.copy(r.path / "configs" / "recipes" / f"{name}.toml", repo.path / "fleet" / "configs" / "recipes")
            repo.manifest(r.host)
        start = repo.commit("three hosts, nothing on them")
        fleet = tmp_path / "fleet.yaml"
        follow(canary, url)
        follow(follower, url, after=[canary.host], fleet=str(fleet))
        follow(other, url)
        loops = [LoopProcess(canary, "--api-token-file", str(tf))]
        hosts = [{"name": canary.host, "url": f"http://{loops[0].addr}", "token_file": str(tf)}]
        fleet.write_text(yaml.safe_dump({"hosts": hosts, "timeout_s": 3}))
        # The follower may start before its canary serves: it waits for the canary to converge the first commit.
        loops += [LoopProcess(r, "--api-token-file", str(tf)) for r in (follower, other)]
        for lp in loops:
            lp.wait("pass", result="converged", timeout=60)
            assert _status(lp)["source"]["commit"] == start

        # A commit that changes two hosts' manifests: the canary converges it first, the follower after it, and the
        # third host takes it and changes nothing.
        repo.manifest(canary.host, (names[0], [B]))
        repo.manifest(follower.host, (names[1], [B]))
        both = repo.commit("a lane on the canary and the follower")
        mark = [lp.mark() for lp in loops]
        entered = loops[0].wait("action", kind="enter", result="ok", after=mark[0], timeout=90)[0]
        canary_done = wait_until(
            lambda: [e.at for e in loops[0].find("pass", result="converged", after=mark[0]) if e.at >= entered.at],
            timeout=30,
            what="the canary's pass converged after its enter",
        )[0]
        taken = loops[1].wait("source-sync", commit=both[:12], after=mark[1], timeout=60)[0]
        assert taken.at >= canary_done, "the follower took the commit before its canary converged it"
        loops[1].wait("action", kind="enter", result="ok", after=mark[1], timeout=90)
        loops[2].wait("source-sync", commit=both[:12], after=mark[2], timeout=30)
        assert loops[2].find("action", after=mark[2]) == []  # its manifest did not change: nothing done
        running = {r.host: set(r.running()) for r in roots}
        assert running[other.host] == set() and len(running[canary.host]) == len(running[follower.host]) == 1

        # A broken commit: refused on every host, the lanes kept as they are.
        repo.write("configs/recipes/broken.toml", "this is = not [ toml\n")
        broken = repo.commit("broken recipe")
        for lp in loops:
            wait_until(
                lambda lp=lp: _status(lp)["source"]["state"] == "refused", timeout=30, what="the broken commit refused"
            )
            src = _status(lp)["source"]
            assert src["commit"] == both and src["refused"]["commit"] == broken
            assert any(f"{broken[:12]}:fleet/configs/recipes/broken.toml" in p for p in src["refused"]["problems"])
        assert {r.host: set(r.running()) for r in roots} == running

        # A commit that leaves the canary blocked (its lane's image is not on this host): it never reaches the
        # follower, which stays on the commit before, its lane untouched; the host not behind the canary takes it.
        (repo.path / "fleet" / "configs" / "recipes" / "broken.toml").unlink()
        recipe = repo.path / "fleet" / "configs" / "recipes" / f"{names[0]}.toml"
        data = tomllib.loads(recipe.read_text())
        data["container"]["image"] = "reconciler-e2e/absent:never"
        recipe.write_text(dump_recipe(data))
        bad = repo.commit("an image this host does not have")
        mark = [lp.mark() for lp in loops]
        loops[0].wait("pass", result="blocked", after=mark[0], timeout=60)
        wait_until(lambda: _status(loops[1])["source"]["state"] == "stopped", timeout=30, what="the follower stopped")
        src = _status(loops[1])["source"]
        assert src["commit"] == both and src["stopped"]["commit"] == bad and canary.host in src["stopped"]["why"]
        loops[2].wait("source-sync", commit=bad[:12], after=mark[2], timeout=30)
        assert {r.host: set(r.running()) for r in roots} == running
        audit = json.loads(cli(follower, "--json", "audit").stdout)["records"]
        assert any(a["action"] == "sync" and a["outcome"] == "stopped" and a.get("commit") == bad for a in audit)
        # Every action the follower's loop took names the commit it came from.
        enters = [a for a in audit if a["action"] == "enter"]
        assert enters and all(a.get("commit") == both for a in enters), enters
        assert TOKEN not in "".join(lp.log() for lp in loops)
    finally:
        for lp in loops:
            lp.stop()
        for r in roots:
            r.cleanup()
        for m in mounts:
            with pytest.raises(StopIteration):
                next(m)


def test_the_page_header_names_the_commit_in_use() -> None:
    from reconciler.api.page.view import header

    commit = "5d1c0a9e33b2" + "0" * 28
    source = {"url": "ssh://git@git.example.com/fleet.git", "ref": "main", "commit": commit, "state": "waiting"}
    html = str(header({"host": "gpu-box-2", "sources": {}, "source": source}, None, version="1"))
    assert 'id="git-source"' in html and 'data-state="waiting"' in html
    assert "commit 5d1c0a9e33b2 (waiting)" in html and "ssh://git@git.example.com/fleet.git main" in html
    assert 'id="git-source"' not in str(header({"host": "h", "sources": {}}, None, version="1"))
