"""Reading /proc: each source is a read (I/O) and a parse (pure, tested on captured text).

Called by the shm observer (maps, fds) and the GPU observer (pid -> container through cgroup).
"""

from __future__ import annotations

import re

# A 64-hex container id inside a cgroup path, in every form Docker and containerd write:
#   v2 systemd:  0::/system.slice/docker-<id>.scope
#   v2 cgroupfs: 0::/docker/<id>
#   v1:          12:memory:/docker/<id>   or  /kubepods/.../<id>
#   containerd:  0::/system.slice/containerd.service/... or cri-containerd-<id>.scope
_CGROUP_ID = re.compile(r"(?:^|[/-])(?:docker-|cri-containerd-|crio-|libpod-)?([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def parse_cgroup_container_id(text: str) -> str | None:
    """The container id a process runs in, from the text of /proc/PID/cgroup; None for a host process."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        m = _CGROUP_ID.search(parts[2])
        if m:
            return m.group(1)
    return None


def read_cgroup(pid: int, proc_root: str = "/proc") -> str | None:
    """The raw /proc/PID/cgroup text, or None when the process is gone or unreadable."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def container_of_pid(pid: int, proc_root: str = "/proc") -> str | None:
    text = read_cgroup(pid, proc_root)
    return parse_cgroup_container_id(text) if text else None


def read_comm(pid: int, proc_root: str = "/proc") -> str:
    """A short human name for a pid: its cmdline, else its comm; '' when gone."""
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as fh:
            raw = fh.read(4096)
        if raw:
            return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")[:200]
        with open(f"{proc_root}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return f"[{fh.read().strip()}]"
    except OSError:
        return ""
