"""Hosts of a fleet on one machine: each in its own network namespace, with its own Docker engine.

``isolated_hosts(n, base)`` makes a bridge in this namespace (its address the fleet's "outside": a git server and
Prometheus listen there) and, per host, a network namespace joined to it by a veth pair, with a ``dockerd`` of its
own started inside it (``nsenter --net``, so /sys and the cgroup mounts stay this machine's), its data and sockets
under ``base``, no bridge or iptables of its own; the test image is loaded into each engine from this machine's.
A container on ``network = "host"`` in such an engine lives in its host's namespace, and so does the loop run there
(``Host.run_prefix``): its health checks, listeners and /proc/net/tcp are that host's alone.

Everything is removed afterwards: the engines stopped, the namespaces, links, bridge and the one iptables rule that
lets the bridge forward (Docker's FORWARD policy is DROP) deleted.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Host:
    name: str  # the network namespace's name
    ip: str  # its address on the fleet's bridge
    sock: Path  # its engine's socket
    dockerd: subprocess.Popen[bytes]
    api: Any  # docker.APIClient of its engine

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    @property
    def run_prefix(self) -> list[str]:
        """A command run inside this host's network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.name}", "--"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _engine(host: str, base: Path) -> tuple[subprocess.Popen[bytes], Path]:
    d = base / host
    for sub in ("data", "exec", "run"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    sock = d / "run" / "docker.sock"
    log = (d / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        [
            "nsenter",
            f"--net=/run/netns/{host}",
            "--",
            "dockerd",
            f"--data-root={d / 'data'}",
            f"--exec-root={d / 'exec'}",
            f"--pidfile={d / 'run' / 'docker.pid'}",
            f"--host=unix://{sock}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, sock


def _wait_engine(sock: Path, proc: subprocess.Popen[bytes], log: Path) -> Any:
    import docker

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dockerd exited ({proc.returncode}): {log.read_text()[-2000:]}")
        if sock.exists():
            api = docker.APIClient(base_url=f"unix://{sock}", timeout=60)
            with contextlib.suppress(Exception):
                api.version()
                return api
        time.sleep(0.2)
    raise AssertionError(f"dockerd on {sock} did not answer within 60 s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def isolated_hosts(n: int, base: Path, *, image: str) -> Iterator[tuple[str, list[Host]]]:
    """(the bridge's address, the hosts): ``n`` network namespaces with an engine each, ``image`` loaded in each."""
    tag = uuid.uuid4().hex[:5]
    net = f"10.{random.randrange(100, 250)}.{random.randrange(0, 255)}"
    bridge, outside = f"rfb{tag}", f"{net}.1"
    made_links: list[str] = []
    forward = ["-I", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    accepted = False
    spaces: list[str] = []
    hosts: list[Host] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made_links.append(bridge)
        _ip("addr", "add", f"{outside}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        # Docker's FORWARD policy is DROP, and bridged frames pass iptables here (br_netfilter): the fleet's hosts
        # may talk to each other across this bridge, and to nothing else through it.
        subprocess.run(["iptables", *forward], check=True, capture_output=True, timeout=30)
        accepted = True
        for i in range(n):
            ns, veth, peer = f"rf{tag}{i}", f"rfv{tag}{i}", f"rfp{tag}{i}"
            _ip("netns", "add", ns)
            spaces.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            made_links.append(veth)
            _ip("link", "set", peer, "netns", ns)
            _ip("link", "set", veth, "master", bridge)
            _ip("link", "set", veth, "up")
            ip = f"{net}.{10 + i}"
            for args in (
                ("addr", "add", f"{ip}/24", "dev", peer),
                ("link", "set", peer, "up"),
                ("link", "set", "lo", "up"),
                ("route", "add", "default", "via", outside),
            ):
                _ip("-n", ns, *args)
            proc, sock = _engine(ns, base)
            hosts.append(Host(ns, ip, sock, proc, None))
        save = subprocess.run(["docker", "save", image], capture_output=True, check=True, timeout=120).stdout
        for h in hosts:
            h.api = _wait_engine(h.sock, h.dockerd, base / h.name / "dockerd.log")
            subprocess.run(
                ["docker", "-H", h.url, "load", "-q"], input=save, capture_output=True, check=True, timeout=120
            )
        yield outside, hosts
    finally:
        for h in hosts:
            with contextlib.suppress(Exception):
                if h.api is not None:
                    for c in h.api.containers(all=True):
                        h.api.remove_container(c["Id"], force=True, v=True)
            if h.dockerd.poll() is None:
                h.dockerd.send_signal(signal.SIGTERM)
                try:
                    h.dockerd.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    h.dockerd.kill()
                    h.dockerd.wait(timeout=10)
        if accepted:
            subprocess.run(["iptables", "-D", *forward[1:]], capture_output=True, check=False)
        for ns in spaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        for link in made_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        _unmount_under(base)  # what the engines left mounted (their netns handle, overlays), deepest first
        shutil.rmtree(base, ignore_errors=True)


def _unmount_under(base: Path) -> None:
    prefix = str(base).rstrip("/") + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
