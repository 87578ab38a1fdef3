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
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
import urllib.request
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
    fleet_prometheus,
    free_port,
    make_root,
    stop_process,
    wait_until,
)
from netns_hosts import isolated_hosts

from real.test_api import TOKEN, token_file

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


# What the demo's lanes ask of a host (its image's /usr from the host's, read-only; the host's network for their
# loopback health URL), allowed by the hosts of these tests: a commit's recipes ask no more than source.allow.
DEMO_ALLOW = {"mounts": ["/usr:ro"], "network_host": True}


def follow(root: Root, url: str, **source: Any) -> None:
    """Point the root's host file at ``url`` and take its own manifests and recipes away: only git's are read."""
    host_file = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(host_file.read_text())
    doc["source"] = {"git": url, "ref": "main", "path": "fleet", "interval_s": 5, "allow": DEMO_ALLOW, **source}
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


def test_a_sync_through_mcp_and_the_http_api_is_the_command_lines(
    plain_root: Root, tmp_path: Path, docker_api: Any
) -> None:
    """MCP ``host_manage`` action ``sync`` (a real MCP client over stdio) and ``POST /v1/sync`` on a running loop (a
    real HTTP client) take a new commit as ``reconciler sync`` does, each audited as its front-end; the loop then
    reads that commit at once."""
    import anyio

    from real.test_mcp import on_stdio, structured

    root = plain_root
    repo = Repo(tmp_path / "repo")
    repo.manifest(root.host)
    first = repo.commit("nothing on the host")
    follow(root, str(repo.path))

    async def check(session: Any) -> None:
        data = structured(await session.call_tool("host_manage", {"action": "sync"}))
        assert data["taken"] is True and data["source"]["commit"] == first, data
        refused = await session.call_tool("host_manage", {"action": "sync", "plan_id": "0" * 32})
        assert refused.is_error and "plan_id is for action 'apply'" in refused.content[0].text

    anyio.run(on_stdio, root, check)
    tf = token_file(tmp_path)
    lp = LoopProcess(root, "--api-token-file", str(tf))
    try:
        lp.wait("pass", result="converged", timeout=60)
        second = repo.commit("a second commit")
        mark = lp.mark()
        req = urllib.request.Request(
            f"http://{lp.addr}/v1/sync",
            data=b"",
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.loads(resp.read())
        assert data["taken"] is True and data["before"] == first and data["source"]["commit"] == second, data
        lp.wait("config-loaded", commit=second[:12], after=mark, timeout=30)  # woken at once, not at the timer
    finally:
        lp.stop()
    fronts = [
        (a["front"], a.get("commit"))
        for a in json.loads(cli(root, "--json", "audit").stdout)["records"]
        if a["action"] == "sync" and a["outcome"] == "ok"
    ]
    assert fronts == [("mcp", first), ("api", second)], fronts


def test_with_allowed_signers_only_a_commit_signed_by_one_of_their_keys_is_taken(
    plain_root: Root, tmp_path: Path
) -> None:
    """source.allowed_signers: an unsigned commit, and one signed by another SSH key, are refused with the commit in
    use kept; a commit signed by a key of the file is taken (git verify-commit, ssh-keygen's allowed signers)."""
    root = plain_root
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    for who in ("fleet", "stranger"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(keys / who)], check=True, timeout=30
        )
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'fleet@example.invalid namespaces="git" {(keys / "fleet.pub").read_text().strip()}\n')
    allowed.chmod(0o644)
    repo = Repo(tmp_path / "repo")
    (repo.path / "fleet" / "configs" / "recipes" / "omni.toml").write_text(
        (DEMO / "configs" / "recipes" / "omni.toml").read_text()
    )

    def signed(message: str, key: str | None) -> str:
        repo.git("add", "-A")
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={keys / key}", "commit", "-S"] if key else ["commit"]
        repo.git(*sign, "-q", "--allow-empty", "-m", message)
        return repo.git("rev-parse", "HEAD")

    repo.manifest(root.host)
    first = signed("signed by the fleet's key", "fleet")
    follow(root, str(repo.path), allowed_signers=str(allowed))
    r = cli(root, "--json", "sync")
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["commit"] == first, r

    repo.manifest(root.host, ("omni", [B]))
    unsigned = signed("unsigned", None)
    src = json.loads(cli(root, "--json", "sync").stdout)["source"]
    assert src["commit"] == first and src["refused"]["commit"] == unsigned, src
    assert src["refused"]["problems"] == [
        f"commit {unsigned[:12]} is not signed (source.allowed_signers asks for a signature by one of its keys)"
    ]
    stranger = signed("signed by a key the host does not trust", "stranger")
    r = cli(root, "--json", "sync")
    src = json.loads(r.stdout)["source"]
    assert r.returncode == 1 and src["commit"] == first and src["refused"]["commit"] == stranger, src
    assert f"commit {stranger[:12]} is not signed by a key of {allowed}" in src["refused"]["problems"][0]
    trusted = signed("signed by the fleet's key again", "fleet")
    r = cli(root, "--json", "sync")
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["commit"] == trusted, r
    # Whoever could write the allowed signers could add a key: a file others may write is refused.
    allowed.chmod(0o666)
    repo.manifest(root.host)
    later = signed("one more", "fleet")
    src = json.loads(cli(root, "--json", "sync").stdout)["source"]
    assert (
        src["commit"] == trusted
        and src["refused"]["commit"] == later
        and "allowed_signers" in src["refused"]["problems"][0]
    )


# Runs a command (its stdout into the file argv[1]) and prints the peak resident memory, in KiB, of it and of every
# process it waited for (wait4's rusage: git's children of `reconciler sync` included).
PEAK_RSS = """
import os, subprocess, sys
with open(sys.argv[1], "wb") as out:
    child = subprocess.Popen(sys.argv[2:], stdout=out)
    _, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def test_a_700_mb_file_in_a_commit_is_refused_before_it_is_read(plain_root: Root, tmp_path: Path) -> None:
    """A commit adds a 700 MB recipe: its size comes from git before any blob is read, so the commit is refused,
    naming COMMIT:PATH, the size and the limit, while `reconciler sync` and the git it runs stay under 200 MB of
    resident memory (reading the whole batch took 1.4 GiB: the loop died under the unit's MemoryMax=512M)."""
    root = plain_root
    repo = Repo(tmp_path / "repo")
    repo.manifest(root.host)
    first = repo.commit("an empty manifest")
    follow(root, str(repo.path))
    r = cli(root, "--json", "sync")
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["commit"] == first, r

    huge = repo.path / "fleet" / "configs" / "recipes" / "huge.toml"
    with open(huge, "wb") as f:
        f.truncate(700_000_000)  # sparse zeros: no disk here, and git stores them compressed to under 1 MB
    big = repo.commit("a large file")
    huge.unlink()
    out = tmp_path / "sync.json"
    measured = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, str(out), *root.cli_args("--json", "sync")],
        env=root.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rc, peak_kib = (int(v) for v in measured.stdout.split())
    assert peak_kib < 200 * 1024, f"peak resident memory {peak_kib >> 10} MiB"
    src = json.loads(out.read_text())["source"]
    assert rc == 1 and src["commit"] == first and src["refused"]["commit"] == big, (rc, src)
    assert src["refused"]["problems"] == [
        f"{big[:12]}:fleet/configs/recipes/huge.toml: 700000000 bytes (667.57 MiB), over the limit of 1.00 MiB for a "
        "manifest or recipe: refused before it was read"
    ], src["refused"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("--upload-pack=touch /tmp/pwned", "without spaces"),
        ("-oProxyCommand=x", "read it as an option"),
        ("ext::sh%20-c%20touch", "transports that run a program"),
        ("https://user:secret-pass@example.com/fleet.git", "no credentials in the URL"),
        ("ftp://example.com/fleet.git", "is not one of"),
        ("https://example.com/fleet.git?private_token=secret-pass", "no query or fragment"),
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


def _serve(repo_base: Path, ip: str) -> tuple[subprocess.Popen[bytes], str]:
    """``git daemon`` serving the repositories under ``repo_base`` on ``ip``; (it, the URL of ``repo``)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            f"--base-path={repo_base}",
            f"--listen={ip}",
            f"--port={port}",
            str(repo_base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _listening(ip, port), timeout=20, what="git daemon listening")
    return proc, f"git://{ip}:{port}/repo"


def _listening(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((ip, port)) == 0


def _status(lp: LoopProcess) -> dict[str, Any]:
    req = urllib.request.Request(f"http://{lp.addr}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())
    except OSError:  # still starting
        return None


def test_three_hosts_each_with_its_own_network_and_engine_follow_one_repository(tmp_path: Path, image: str) -> None:
    """Three hosts, each in its own network namespace with its own Docker engine, tmpfs, state directory and loop,
    follow one git repository served on the fleet's bridge: a commit that changes two hosts' manifests is converged
    by both (the canary first, the host behind it after) and ignored by the third; a broken commit is refused on
    every host with the last valid state kept; a commit that leaves the canary blocked never reaches the host behind
    it. A real Prometheus scrapes all three and fires ReconcilerBlocked for the blocked host alone, and
    `reconciler fleet status` shows the three side by side, and a fourth, gone, as unreachable."""
    mounts = [_mounted_tmpfs("reconciler-git-", "64m") for _ in range(3)]
    roots: list[Root] = []
    loops: list[LoopProcess] = []
    daemon = prom = None
    with isolated_hosts(3, Path(tempfile.mkdtemp(prefix="reconciler-fleet-", dir="/var/tmp")), image=image) as (
        outside,
        hosts,
    ):
        try:
            repo = Repo(tmp_path / "served" / "repo")
            daemon, url = _serve(tmp_path / "served", outside)
            for i, (m, h) in enumerate(zip(mounts, hosts, strict=True)):
                r = make_root(tmp_path / f"h{i}", shm=next(m), api=h.api, name=f"fleet-h{i}")
                host_file = r.path / "configs" / "host.yaml"
                doc = yaml.safe_load(host_file.read_text())
                doc["docker"]["url"] = h.url  # the host's own engine
                doc["api"] = {"insecure": True}  # plain HTTP on the fleet's bridge (TLS: tests/real/test_api_tls.py)
                host_file.write_text(yaml.safe_dump(doc, sort_keys=False))
                roots.append(r)
            canary, follower, other = roots
            tf = token_file(tmp_path)
            # Each host's lane is a recipe of the repository (its own name and port); the files go to git.
            names = [r.recipe("omni") for r in roots]
            for r, name in zip(roots, names, strict=True):
                shutil.copy(
                    r.path / "configs" / "recipes" / f"{name}.toml", repo.path / "fleet" / "configs" / "recipes"
                )
                repo.manifest(r.host)
            start = repo.commit("three hosts, nothing on them")
            fleet = tmp_path / "fleet.yaml"
            # git daemon's git:// is plaintext: these hosts take that risk on their own bridge, saying so.
            follow(canary, url, insecure_transport=True)
            follow(follower, url, after=[canary.host], fleet=str(fleet), insecure_transport=True)
            follow(other, url, insecure_transport=True)

            def loop(r: Root, h: Any) -> LoopProcess:
                return LoopProcess(r, "--api-token-file", str(tf), "--api-allow-remote", ip=h.ip, prefix=h.run_prefix)

            loops = [loop(canary, hosts[0])]
            as_fleet = [
                {"name": r.host, "url": f"http://{lp.addr}", "token_file": str(tf), "insecure": True}
                for r, lp in [(canary, loops[0])]
            ]
            fleet.write_text(yaml.safe_dump({"hosts": as_fleet, "timeout_s": 3}))
            # The host behind the canary may start before the canary serves: it waits for it to converge the first.
            loops += [loop(follower, hosts[1]), loop(other, hosts[2])]
            for lp in loops:
                lp.wait("pass", result="converged", timeout=90)
                assert _status(lp)["source"]["commit"] == start

            # A commit that changes two hosts' manifests: the canary converges it first, the host behind it after,
            # and the third host takes it and changes nothing.
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
            assert taken.at >= canary_done, "the host behind the canary took the commit before the canary converged it"
            loops[1].wait("action", kind="enter", result="ok", after=mark[1], timeout=90)
            loops[2].wait("source-sync", commit=both[:12], after=mark[2], timeout=30)
            assert loops[2].find("action", after=mark[2]) == []  # its manifest did not change: nothing done
            running = {r.host: set(r.running()) for r in roots}
            assert running[other.host] == set() and len(running[canary.host]) == len(running[follower.host]) == 1
            # Each lane runs in its own host's engine, and answers in its own host's network alone.
            for r, h in zip(roots, hosts, strict=True):
                assert {c["Names"][0].lstrip("/") for c in h.api.containers()} == running[r.host]

            # A broken commit: refused on every host, the lanes kept as they are.
            repo.write("configs/recipes/broken.toml", "this is = not [ toml\n")
            broken = repo.commit("broken recipe")
            for lp in loops:
                wait_until(
                    lambda lp=lp: _status(lp)["source"]["state"] == "refused", timeout=30, what="the commit refused"
                )
                src = _status(lp)["source"]
                assert src["commit"] == both and src["refused"]["commit"] == broken
                assert any(f"{broken[:12]}:fleet/configs/recipes/broken.toml" in p for p in src["refused"]["problems"])
            assert {r.host: set(r.running()) for r in roots} == running

            # A commit that leaves the canary blocked (its lane's image is on no engine of the fleet): it never
            # reaches the host behind it, which keeps the commit before and its lane; the third host takes it.
            (repo.path / "fleet" / "configs" / "recipes" / "broken.toml").unlink()
            recipe = repo.path / "fleet" / "configs" / "recipes" / f"{names[0]}.toml"
            data = tomllib.loads(recipe.read_text())
            data["container"]["image"] = "reconciler-e2e/absent:never"
            recipe.write_text(dump_recipe(data))
            bad = repo.commit("an image the canary does not have")
            mark = [lp.mark() for lp in loops]
            loops[0].wait("pass", result="blocked", after=mark[0], timeout=60)
            wait_until(
                lambda: _status(loops[1])["source"]["state"] == "stopped", timeout=30, what="the follower stopped"
            )
            src = _status(loops[1])["source"]
            assert src["commit"] == both and src["stopped"]["commit"] == bad and canary.host in src["stopped"]["why"]
            loops[2].wait("source-sync", commit=bad[:12], after=mark[2], timeout=30)
            assert {r.host: set(r.running()) for r in roots} == running
            audit = json.loads(cli(follower, "--json", "audit").stdout)["records"]
            assert any(a["action"] == "sync" and a["outcome"] == "stopped" and a.get("commit") == bad for a in audit)
            enters = [a for a in audit if a["action"] == "enter"]
            assert enters and all(a.get("commit") == both for a in enters), enters

            # One Prometheus over the three: the fleet's alert names the blocked host, and only it.
            prom, base = fleet_prometheus(
                tmp_path, [(lp.addr, r.host) for lp, r in zip(loops, roots, strict=True)], ip=outside
            )

            def firing() -> list[dict[str, Any]] | None:
                got = _get_json(f"{base}/api/v1/alerts")
                alerts = got["data"]["alerts"] if got else []
                return [
                    a for a in alerts if a["labels"]["alertname"] == "ReconcilerBlocked" and a["state"] == "firing"
                ] or None

            (alert,) = wait_until(firing, timeout=60, what="ReconcilerBlocked firing in Prometheus")
            assert alert["labels"]["instance"] == canary.host and canary.host in alert["annotations"]["summary"]

            def scraped() -> list[str] | None:
                got = _get_json(f"{base}/api/v1/query?query=up%20%3D%3D%201")
                names = sorted(r["metric"]["instance"] for r in (got or {}).get("data", {}).get("result", []))
                return names if names == sorted(r.host for r in roots) else None

            # Each target is scraped at its own offset in the interval: all three are up once each was scraped.
            wait_until(scraped, timeout=30, what="the three hosts up in Prometheus")
            # The fleet dashboard's every query runs on it.
            dashboard = json.loads(Path("examples/grafana-fleet.json").read_text())
            for expr in (t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])):
                q = urllib.parse.urlencode({"query": expr.replace("$instance", ".*")})
                answer = _get_json(f"{base}/api/v1/query?{q}")
                assert answer and answer["status"] == "success", (expr, answer)

            # The fleet's view: three hosts side by side, and a fourth that is gone, unreachable within its timeout.
            gone = {
                "name": "gone",
                "url": f"http://{outside.rsplit('.', 1)[0]}.99:9464",
                "token_file": str(tf),
                "insecure": True,
            }
            view = [
                {"name": r.host, "url": f"http://{lp.addr}", "token_file": str(tf), "insecure": True}
                for r, lp in zip(roots, loops, strict=True)
            ]
            (tmp_path / "fleet-all.yaml").write_text(yaml.safe_dump({"hosts": [*view, gone], "timeout_s": 2}))
            t0 = time.monotonic()
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "reconciler",
                    "fleet",
                    "status",
                    "--fleet",
                    str(tmp_path / "fleet-all.yaml"),
                    "--json",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert time.monotonic() - t0 < 15 and r.returncode == 1, r
            by = {h["name"]: h for h in json.loads(r.stdout)["hosts"]}
            assert by[canary.host]["verdict"] == "blocked" and by[canary.host]["commit"] == bad
            assert by[follower.host]["verdict"] == "converged" and by[follower.host]["commit"] == both
            assert by[other.host]["commit"] == bad and by["gone"]["verdict"] == "unreachable"
            assert TOKEN not in r.stdout + r.stderr + "".join(lp.log() for lp in loops)
        finally:
            if prom is not None:
                stop_process(prom)
            for lp in loops:
                lp.stop()
            if daemon is not None:
                stop_process(daemon)
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
