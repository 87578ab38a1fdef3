"""The handlers of ``reconciler shm status`` and ``reconciler shm reclaim [--confirm]`` (registered by
``reconciler.cli.shm``) and their human output: a table in a terminal and plain aligned text when piped; ``--json``
prints the shapes of docs/design.md, "JSON output" (keys are only ever added). Loaded when one of them runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from reconciler.base.redact import redact_cmdline, redact_json
from reconciler.base.terminal import shell_word
from reconciler.base.units import human_bytes
from reconciler.cli.commands.host import service
from reconciler.cli.common import console
from reconciler.cli.style import Style

if TYPE_CHECKING:
    from reconciler.plan.observed import ShmFile, ShmView


# ---------------------------------------------------------------- handlers


def cmd_shm_status(args: argparse.Namespace) -> int:
    con = console(args)
    res = service(args).shm_status()
    view = res.view
    if getattr(args, "json", False):
        _emit_json(res.to_json(), con.out)
    else:
        con.out.write(redact_cmdline(render_status(view, tty=con.out.isatty() and not con.no_color)))
    for s in (view.proc, view.docker):
        if not s.ok:
            print(redact_cmdline(f"error: {s.name} source unavailable: {s.detail}"), file=con.err)
    return res.exit_code


def cmd_shm_reclaim(args: argparse.Namespace) -> int:
    con = console(args)
    svc = service(args)
    if args.confirm and not getattr(args, "json", False) and con.err.isatty():
        host = svc.host()
        print(f"inspecting twice, {host.shm.confirm_interval_s:g} s apart ...", file=con.err)
        con.err.flush()
    res = svc.shm_reclaim(confirm=args.confirm, paths=args.paths)
    result = res.result
    if getattr(args, "json", False):
        _emit_json(res.to_json(), con.out)
    else:
        con.out.write(redact_cmdline(render_reclaim(result, tty=con.out.isatty() and not con.no_color)))
    if result.refused:
        print(redact_cmdline(f"error: reclaim refused: {result.refused}"), file=con.err)
    for e in result.errors:
        print(redact_cmdline(f"error: {e}"), file=con.err)
    return res.exit_code


# ---------------------------------------------------------------- JSON


def _emit_json(data: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    # One write (json.dump writes piece by piece), after a last redaction pass over every string; past the
    # terminal boundary as it is (JSON escapes control characters itself).
    getattr(out, "write_json", out.write)(redact_json(data, indent=2) + "\n")


# ---------------------------------------------------------------- human output


def _path(p: str) -> str:
    # A name with a newline or other control character would break the table: show it quoted.
    return repr(p) if any(ord(c) < 32 for c in p) else p


def _command(cmd: str, width: int = 60) -> str:
    cmd = " ".join(redact_cmdline(cmd).split()) or "?"  # masked before it is cut
    return cmd if len(cmd) <= width else cmd[: width - 3] + "..."


def _owners(f: ShmFile) -> str:
    """Owners grouped by container, each pid once with how it holds the file: "7566 map+fd, 7567 map (NAME)"."""
    groups: dict[str | None, dict[int, list[str]]] = {}
    for o in f.owners:
        vias = groups.setdefault(o.container, {}).setdefault(o.pid, [])
        if o.via not in vias:
            vias.append(o.via)
    parts = []
    for container, pids in groups.items():
        held = ", ".join(f"{pid} {'+'.join(vias)}" for pid, vias in pids.items())
        parts.append(f"{held} ({container})" if container else held)
    return "; ".join(parts) or "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, tty: bool) -> str:
    """Aligned columns; with ``tty`` (a terminal, and no NO_COLOR) the header bold and each file's state in its colour
    (``render.Style``: the one helper for colour). Widths are those of the plain text: colour never shifts a column."""
    if not rows:
        return ""

    s = Style(color=tty)
    paint = {"owned": s.green, "orphan": s.yellow, "blocked": s.red}
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str], style: Any) -> str:
        padded = [style(c)(c) + " " * (w - len(c)) for c, w in zip(cells, widths, strict=True)]
        return "  ".join(padded).rstrip()

    lines = [line(headers, lambda _c: s.bold)]
    lines += [line(r, lambda c: paint.get(c, str)) for r in rows]
    return "\n".join(lines) + "\n"


def render_status(view: ShmView, *, tty: bool = False) -> str:
    t = view.tmpfs
    out = [
        (
            f"{view.dir} ({view.pattern}): {human_bytes(t.free_bytes)} free of {human_bytes(t.size_bytes)}, "
            f"{human_bytes(t.used_bytes)} used"
        ),
        f"sources: proc {view.proc.render()}; docker {view.docker.render()}",
    ]
    if view.blocking_containers:
        out.append(
            "blocked: running native-offload container(s) "
            + ", ".join(view.blocking_containers)
            + " (no unowned file is reclaimed while one runs that could be making its file)"
        )
    counts = {s: len(view.by_state(s)) for s in ("owned", "orphan", "blocked")}
    out.append(
        f"{len(view.files)} offload file(s): "
        + ", ".join(
            f"{n} {s} ({human_bytes(sum(f.allocated_bytes for f in view.by_state(s)))})" for s, n in counts.items()
        )
    )
    text = "\n".join(out) + "\n"
    rows = [
        [f.state, human_bytes(f.size_bytes), human_bytes(f.allocated_bytes), _owners(f), _path(f.path)]
        for f in view.files
    ]
    text += _table(["STATE", "SIZE", "ALLOCATED", "OWNERS (pid via)", "PATH"], rows, tty=tty)
    extra = []
    if view.deleted_mapped:
        extra.append(
            f"unlinked but still held: {len(view.deleted_mapped)} file(s), {human_bytes(view.deleted_mapped_bytes)}"
        )
        extra += [f"  {_path(f.path)}: {_owners(f)}" for f in view.deleted_mapped]
    for p, why in view.skipped:
        extra.append(f"skipped {_path(p)}: {why}")
    for u in view.uninspectable:
        tag = "excused by shm.ignore_uninspectable_pids" if u.excused else "NOT excused: fails the scan closed"
        extra.append(f"uninspectable pid {u.pid} ({_command(u.command)}): {u.reason} [{tag}]")
    return text + ("\n".join(extra) + "\n" if extra else "")


def render_reclaim(result: Any, *, tty: bool = False) -> str:
    """Human text for a ``ReclaimResult``."""
    out = []
    if result.refused:
        out.append(f"refused: {result.refused}")
    elif not result.confirmed:
        if result.candidates:
            out.append(
                f"dry run: would remove {len(result.candidates)} orphan file(s), {human_bytes(result.candidate_bytes)}; "
                "run with --confirm to remove them"
            )
        else:
            out.append("dry run: no orphan offload file to remove")
    elif result.reclaimed:
        state = "verified absent" if result.verified else "NOT verified"
        out.append(f"removed {len(result.reclaimed)} file(s), {human_bytes(result.reclaimed_bytes)} freed ({state})")
    else:
        out.append("nothing removed")
    text = "\n".join(out) + "\n"
    listed = result.reclaimed if result.confirmed else result.candidates
    if not result.confirmed and not result.refused and result.candidates:
        # The exact command that removes these files and no other (a file orphaned since is left for the next look),
        # each name one word a shell reads back as it is, on this one line.
        paths = " ".join(f"--path {shell_word(f.path)}" for f in result.candidates)
        text += f"to remove exactly these: reconciler shm reclaim --confirm {paths}\n"
    text += _table(
        ["SIZE", "ALLOCATED", "PATH"],
        [[human_bytes(f.size_bytes), human_bytes(f.allocated_bytes), _path(f.path)] for f in listed],
        tty=tty,
    )
    if result.kept:
        text += "kept:\n" + "".join(f"  {_path(k.path)}: {k.reason}\n" for k in result.kept)
    if result.tmpfs_before and result.tmpfs_after and result.confirmed:
        text += f"tmpfs free: {human_bytes(result.tmpfs_before.free_bytes)} -> {human_bytes(result.tmpfs_after.free_bytes)}\n"
    return text
