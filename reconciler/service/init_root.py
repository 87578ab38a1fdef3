"""``reconciler init``: a root written from what the machine says (``observe.machine``), as texts rendered by
``load.init_files``. It never overwrites: any of its files already there, or a host file of another name, and it
refuses and changes nothing. The texts are validated first, by the loader itself, in a scratch copy of the root;
only a root that validates is written, each file atomically and only where nothing is (``fsafe.write_atomic`` with
``replace=False``: two writers, one winner).
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.base.errors import ConfigError, ReconcilerError
from reconciler.base.fsafe import write_atomic
from reconciler.load.desired import load_desired
from reconciler.load.init_files import HOST_FILE, files, host_name
from reconciler.load.init_stand_in import STAND_IN_HOST, STAND_IN_IMAGE, STAND_IN_SLOTS, stand_in_files
from reconciler.observe.machine import Machine, read_machine


class InitRefused(ReconcilerError):
    """``init`` found a root already there: nothing was written."""

    code = "init_refused"


@dataclass
class InitResult:
    root: str
    host: str
    machine: Machine
    files: dict[str, str]
    written: list[str] = field(default_factory=list)
    dry_run: bool = False
    no_gpu: bool = False

    @property
    def exit_code(self) -> int:
        return 0

    def found(self) -> list[str]:
        """What init read of the machine and why it wrote what it did, one line each."""
        m = self.machine
        out = []
        if self.no_gpu:
            out.append(
                f"--no-gpu: stand-in slots {', '.join(STAND_IN_SLOTS)} -> gpu_telemetry: none, recipes of the "
                f"stand-in image {STAND_IN_IMAGE}"
            )
        elif m.cards:
            out += [
                f"GPU {c.index}: {c.name}, {c.memory_bytes >> 20} MiB, {c.uuid} (NVML, driver {m.driver})"
                for c in m.cards
            ]
        else:
            out.append(f"no NVIDIA GPU: {m.nvml or 'NVML listed none'} -> gpu_telemetry: none")
        out.append(f"WSL2: {m.wsl_why} -> page_cache.drop_after_leave" if m.wsl2 else "not WSL2")
        out += [f"engine: {e.name} {e.version} at {e.url} ({e.why})" for e in m.engines]
        if not m.engines:
            out.append("no container engine answered: " + ("; ".join(m.engines_tried) or "none to try"))
        size = f"{m.shm_bytes >> 20} MiB" if m.shm_bytes is not None else "size unknown"
        out.append(f"/dev/shm: {m.shm_fs or 'unknown filesystem'}, {size}")
        return out

    def to_json(self) -> dict[str, Any]:
        m = self.machine
        return {
            "root": self.root,
            "host": self.host,
            "dry_run": self.dry_run,
            "gpus": [
                {"index": c.index, "uuid": c.uuid, "name": c.name, "memory_bytes": c.memory_bytes} for c in m.cards
            ],
            "gpu_telemetry": "nvml" if m.cards and not self.no_gpu else "none",
            "no_gpu": self.no_gpu,
            "nvml": m.nvml or "ok",
            "wsl2": m.wsl2,
            "engines": [{"url": e.url, "name": e.name, "version": e.version} for e in m.engines],
            "shm": {"dir": m.shm_dir, "size_bytes": m.shm_bytes, "filesystem": m.shm_fs},
            "files": sorted(self.files),
            "written": self.written,
            "found": self.found(),
        }


def init_root(
    root: str | os.PathLike[str], *, dry_run: bool = False, machine: Machine | None = None, no_gpu: bool = False
) -> InitResult:
    """Read the machine and write a root at ``root`` that validates (``dry_run``: only say what it would write;
    ``no_gpu``: the stand-in root of ``load.init_stand_in``, whatever cards the machine has)."""
    r = Path(root)
    m = machine or read_machine()
    if no_gpu:
        name, texts = STAND_IN_HOST, stand_in_files(m)
    else:
        name = host_name(socket.gethostname())
        texts = files(m, name)
    there = [p for p in [*texts, HOST_FILE] if (r / p).exists() or (r / p).is_symlink()]
    if there:
        raise InitRefused(
            f"{r} already holds {', '.join(sorted(set(there)))}: init never overwrites a file; edit those, or run "
            "init with --root on an empty directory"
        )
    _validate(texts)
    result = InitResult(root=str(r), host=name, machine=m, files=texts, dry_run=dry_run, no_gpu=no_gpu)
    if dry_run:
        return result
    for rel, text in texts.items():
        path = r / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            write_atomic(path, text, mode=0o644, replace=False)
        except FileExistsError:
            raise InitRefused(
                f"{path} appeared while init wrote the root: left as it is; nothing more written"
            ) from None
        result.written.append(rel)
    return result


def _validate(texts: dict[str, str]) -> None:
    """The loader's verdict on the texts, in a scratch root: an init that would write a root that does not validate
    is a bug, said as such (never a half-written root)."""
    with tempfile.TemporaryDirectory(prefix="reconciler-init-") as scratch:
        os.chmod(scratch, 0o755)
        for rel, text in texts.items():
            path = Path(scratch, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        try:
            load_desired(scratch)
        except ConfigError as exc:
            raise ReconcilerError(f"init rendered a root that does not validate (nothing written): {exc}") from None
