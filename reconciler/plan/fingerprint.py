"""What a plan was made from, as a fingerprint, and the plan itself as the contract of an approval.

The fingerprint covers every input of the planner, as values: the desired state as it was loaded, wherever from
(``reconciler.plan.inputs``: every field of it, each recipe and the host file whole, walked rather than listed, so a
field added later is covered without an edit here), the commit of the git source in use, the secrets the recipes take,
the containers, the GPUs (their processes and memory figures), the offload files and who holds each, the tmpfs, the
ownership record, the sources, and a running loop's view (held lanes, the last converged topology its fallback
serves); and, besides, the digests of the root's own files (an edit that changes no value, such as a comment, is
still one the operator did not see). Two fingerprints that differ say which of these changed, in words. Memory
figures enter rounded (``GPU_MEMORY_QUANTUM``, ``TMPFS_QUANTUM``): a figure that moves by a few pages does not make
every saved plan stale, and a move that changes a decision changes the plan, which is compared exactly.

``plan_differences`` compares an approved plan (saved or shown) with the plan made now: its actions with their
paths, container ids, hashes and the full specification of their recipe (``spec``: everything the recipe says of how
the lane is entered, probed, drained, slept and kept within its reserve, which its hash leaves out), its blockers,
held lanes, fallbacks, satisfied containers and unavailable sources. Any difference, like any change of the
fingerprint, makes the approval stale.

Used by ``reconciler plan --out FILE`` (saved with the plan), ``reconciler apply FILE`` (a stale plan is refused
with what changed) and the interactive ``apply`` (the host or the files changed between showing the plan and the
approval: stop and show the new one). ``observed_parts``, ``input_parts``, ``plan_lines`` and ``approval_json`` are
pure; ``file_digests`` and ``secret_parts`` read files. The plan's own JSON, both ways, is ``reconciler.plan.actions``'s
(``Plan.to_json``, ``plan_from_json``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.base.redact import redact_data
from reconciler.base.units import human_bytes
from reconciler.plan.actions import ActionKind, Plan
from reconciler.plan.inputs import canonical, desired_changes, desired_lines, jsonable, recipe_spec, source_lines
from reconciler.plan.observed import LABEL_PREFIX, Observed

if TYPE_CHECKING:
    from reconciler.model import DesiredState

PLAN_FORMAT = "reconciler-plan/1"
# The fingerprint's own version, saved beside its parts. 1 (no version saved): containers, GPU processes, offload
# files and sources only. 2: every planner input. A saved plan of an older version is refused as stale: what it
# did not record could have changed unseen. 3: the desired state as values and the commit in use (``desired``,
# ``source``), and each action's full specification (``spec``) in the plan. 4: every field of the observation, those
# without words of their own walked whole (``card_nodes``, ``lane_memory``).
FINGERPRINT_VERSION = 4
# The parts told in words by ``reconciler.plan.inputs.desired_changes``, not line by line.
_IN_WORDS = ("desired", "source")
GPU_MEMORY_QUANTUM = 256 * 1024 * 1024
TMPFS_QUANTUM = 64 * 1024 * 1024


def file_digests(root: str | Path) -> dict[str, str]:
    """sha256 of every file the desired state is loaded from, by its path relative to the root."""
    r = Path(root)
    paths = [r / "configs" / "host.yaml", *sorted((r / "configs" / "recipes").glob("*.toml"))]
    paths += sorted([*(r / "manifests").glob("*.yaml"), *(r / "manifests").glob("*.yml")])
    out: dict[str, str] = {}
    for p in paths:
        try:
            out[str(p.relative_to(r))] = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError as exc:
            out[str(p.relative_to(r))] = f"unreadable: {exc.strerror or exc}"
    return out


def observed_parts(observed: Observed) -> dict[str, list[str]]:
    """Pure: the facts of an observation that a plan depends on, as sorted lines per part. Every part is present
    also when it is empty, so "nothing was running" is a fact that a later start changes."""
    # Only containers a plan can depend on: any with GPUs or native offload (they hold slots or forbid reclaims)
    # and any carrying this tool's labels. A busy engine's unrelated containers do not make a saved plan stale.
    containers = sorted(
        f"{c.name} {c.id[:12]} {c.state} {c.image} "
        + hashlib.sha256(json.dumps(c.labels, sort_keys=True).encode()).hexdigest()[:12]
        + f" gpus={','.join(c.gpu_devices)} offload={c.offload}"
        # A sleeping lane's own answer (sleeping lanes): asleep or awake decides between a sleep, a wake and nothing.
        + (f" sleeping={observed.sleeping[c.id]}" if c.id in observed.sleeping else "")
        for c in observed.containers
        if c.gpu_devices or c.offload or any(k.startswith(LABEL_PREFIX) for k in c.labels)
    )
    gpus = sorted(
        f"{slot} {'missing' if v.missing else 'present'} "
        + ",".join(f"pid {p.pid} in {p.container_id[:12] if p.container_id else '-'}" for p in v.processes)
        for slot, v in observed.gpus.slots.items()
    )
    gpu_memory = sorted(
        f"{slot} total={_q(v.memory_total_bytes, GPU_MEMORY_QUANTUM)} used={_q(v.memory_used_bytes, GPU_MEMORY_QUANTUM)}"
        f" free={_q(v.free_bytes, GPU_MEMORY_QUANTUM)} "
        + ",".join(f"pid {p.pid}={_q(p.used_bytes, GPU_MEMORY_QUANTUM)}" for p in v.processes)
        for slot, v in observed.gpus.slots.items()
    )
    gpu_memory.append(f"process memory {observed.gpus.process_memory}")
    shm = sorted(f"{f.path} dev={f.dev} inode={f.inode} size={f.size_bytes} {f.state}" for f in observed.shm.files)
    holders = sorted(
        f"{f.path} held by " + (",".join(sorted(f"{o.pid}/{o.via}/{o.container or '-'}" for o in f.owners)) or "nobody")
        for f in observed.shm.files
    )
    holders += sorted(f"uninspectable pid {u.pid} excused={u.excused}" for u in observed.shm.uninspectable)
    t = observed.shm.tmpfs
    tmpfs = [f"{observed.shm.dir} size={_q(t.size_bytes, TMPFS_QUANTUM)} free={_q(t.free_bytes, TMPFS_QUANTUM)}"]
    own = observed.ownership
    ownership = [
        f"install {own.install_id or '-'}",
        *(f"adopted {c[:12]}" for c in sorted(own.adopted)),
        *(f"healthy {c[:12]}" for c in sorted(own.healthy)),
        "created " + ("(no record yet)" if own.created is None else ",".join(sorted(c[:12] for c in own.created))),
    ]
    # What decides whether an enter can start at all: images present, the engine's GPU runtime, who listens where.
    e = observed.enter
    enter = sorted(
        [f"image {name} {'present' if present else 'absent'}" for name, present in e.images]
        + [f"gpu runtime {e.gpu_runtime}", f"ports looked up {','.join(map(str, sorted(e.ports))) or '-'}"]
        + [f"listener {x.address}:{x.port} pid {x.pid} in {(x.container_id or '-')[:12]}" for x in e.listeners]
    )
    sources = sorted(f"{s.name} {'ok' if s.ok else 'unavailable'}" for s in observed.readings.values())
    return {
        "containers": containers,
        "gpus": gpus,
        "gpu_memory": gpu_memory,
        "shm": shm,
        "holders": holders,
        "tmpfs": tmpfs,
        "ownership": ownership,
        "enter": enter,
        "sources": sources,
        **_walked_parts(observed),
    }


# The fields of ``Observed`` the parts above tell in their own words (the host's name is the desired state's).
_TOLD = frozenset({"host", "containers", "sleeping", "gpus", "shm", "docker", "ownership", "enter"})


def _walked_parts(observed: Observed) -> dict[str, list[str]]:
    """Pure: every other fact of the observation, a part each by its field's name, walked whole (``jsonable``) as
    sorted lines of canonical JSON (a map by its keys, a dataclass by its fields, a list by its items): a fact added
    to ``Observed`` later is in the fingerprint without an edit here (the card nodes held open, the lanes' memory)."""
    parts: dict[str, list[str]] = {}
    for f in dataclasses.fields(observed):
        if f.name in _TOLD:
            continue
        value = redact_data(jsonable(getattr(observed, f.name)))  # a fact's words (a command line) keep no secret
        if isinstance(value, dict):
            lines = [f"{k} {canonical(v)}" for k, v in value.items()]
        elif isinstance(value, list):
            lines = [canonical(v) for v in value]
        else:
            lines = [canonical(value)]
        parts[f.name] = sorted(lines)
    return parts


def _q(value: int | None, quantum: int) -> str:
    """A memory figure in whole quanta (MiB shown), '?' where it is not known."""
    if value is None:
        return "?"
    return f"{round(value / quantum) * (quantum >> 20)}MiB"


def loop_parts(view: Mapping[str, Any] | None) -> list[str]:
    """Pure: the loop's view the plan was made with (``reconciler.service.loop_view``): which lanes it holds and the
    topology its fallback serves. The seconds to each next attempt are not part of it: they count down."""
    view = view or {}
    lines = [f"holds {k}" for k in sorted(view.get("hold") or {})]
    lines += [
        f"last converged {r}@{'+'.join(s)}" for r, s in sorted((r, tuple(s)) for r, s in view.get("last_good") or ())
    ]
    return lines or ["no loop view (nothing held)"]


def secret_parts(desired: DesiredState) -> list[str]:
    """The secrets the plan was made with, as digests only: one over the digests of the values the recipes take
    (from the file or the environment), and one of the secrets file itself. Never a value."""
    used = hashlib.sha256(json.dumps(dict(desired.secret_digests), sort_keys=True).encode()).hexdigest()
    lines = [f"values sha256:{used[:32]}"]
    env_file = desired.host.secrets.env_file
    if env_file:
        try:
            lines.append(f"file sha256:{hashlib.sha256(Path(env_file).read_bytes()).hexdigest()[:32]}")
        except OSError as exc:
            lines.append(f"file unreadable: {exc.strerror or exc}")
    return lines


def input_parts(desired: DesiredState, observed: Observed, view: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Every input of the planner, as sorted lines per part (the files' digests aside)."""
    return {
        **observed_parts(observed),
        "secrets": secret_parts(desired),
        "loop": loop_parts(view),
        "source": source_lines(desired),
        "desired": desired_lines(desired),
    }


@dataclass(frozen=True)
class Fingerprint:
    files: dict[str, str]
    parts: dict[str, list[str]]
    version: int = FINGERPRINT_VERSION

    @property
    def digest(self) -> str:
        blob = json.dumps({"files": self.files, "parts": self.parts}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "version": self.version, "files": self.files, "parts": self.parts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        files = data.get("files")
        parts = data.get("parts")
        if not isinstance(files, dict) or not isinstance(parts, dict):
            raise ValueError("fingerprint without 'files' and 'parts'")
        version = data.get("version", 1)
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"fingerprint version {version!r} is not a number")
        return cls(
            files={str(k): str(v) for k, v in files.items()},
            parts={str(k): [str(x) for x in v] for k, v in parts.items()},
            version=version,
        )

    def changes_since(self, before: Fingerprint) -> list[str]:
        """Pure: what differs from ``before``, one line each (empty when nothing does)."""
        out: list[str] = []
        for name in sorted(set(before.files) | set(self.files)):
            old, new = before.files.get(name), self.files.get(name)
            if old != new:
                out.append(f"{name} " + ("added" if old is None else "removed" if new is None else "edited"))
        out += desired_changes(before.parts, self.parts)
        for part in sorted((set(before.parts) | set(self.parts)) - set(_IN_WORDS)):
            old_lines, new_lines = set(before.parts.get(part, [])), set(self.parts.get(part, []))
            for line in sorted(old_lines - new_lines):
                out.append(f"{part}: no longer {line}")
            for line in sorted(new_lines - old_lines):
                out.append(f"{part}: now {line}")
        return out


def fingerprint(
    files: dict[str, str], desired: DesiredState, observed: Observed, view: Mapping[str, Any] | None
) -> Fingerprint:
    """The fingerprint of a plan made from ``files`` (read before loading them), ``desired``, ``observed`` and the
    loop's ``view``."""
    return Fingerprint(files=files, parts=input_parts(desired, observed, view))


# ---------------------------------------------------------------- the plan as the contract


def plan_lines(data: Mapping[str, Any]) -> list[str]:
    """Pure: a plan's JSON (``Plan.to_json``, as saved: redacted) as the lines an approval holds, in the plan's
    order. Reasons, and the seconds to a held lane's next attempt, are words and clocks around these facts: left
    out."""
    out = [_action_line(a) for a in data.get("actions") or ()]
    for b in data.get("blockers") or ():
        holder, cause = b.get("holder"), b.get("cause")
        out.append(
            f"blocked {b.get('recipe')}@{'+'.join(b.get('gpus') or ())}"
            + (f" by {holder}" if holder else "")
            + (f" ({cause})" if cause else "")
        )
    for h in data.get("held") or ():
        out.append(f"held {h.get('recipe')}@{'+'.join(h.get('gpus') or ())}")
    for f in data.get("fallbacks") or ():
        out.append(
            f"fallback {f.get('recipe')}@{'+'.join(f.get('gpus') or ())} for "
            f"{f.get('instead_of')}@{'+'.join(f.get('instead_gpus') or ())}"
        )
    out += [f"satisfied {n}" for n in data.get("satisfied") or ()]
    out += [f"kept serving {n}" for n in data.get("kept_serving") or ()]
    out += [f"unavailable {n}" for n in data.get("unavailable") or ()]
    return out


def _action_line(a: Mapping[str, Any]) -> str:
    """The facts of one step an approval holds (compared, never shown: ``plan_differences`` says them in words)."""
    return (
        f"{a.get('kind')} {a.get('recipe')}@{'+'.join(a.get('gpus') or ())} container={a.get('container')} "
        f"id={a.get('container_id')} hash={a.get('recipe_hash')} bytes={a.get('bytes')} "
        f"paths={','.join(a.get('paths') or ()) or '-'} spec={a.get('spec')}"
    )


def approval_json(p: Plan, desired: DesiredState) -> dict[str, Any]:
    """Pure: a plan's JSON as an approval holds it (saved, or compared): redacted, each action with ``spec``, the
    digest of its recipe whole as ``desired`` holds it (``reconciler.plan.inputs.recipe_spec``; None for an action
    of no recipe, or of one no longer in the files). The recipe hash says when a container is made again; the spec
    also how its lane is probed, drained, slept and kept within its reserve."""
    data = redact_data(p.to_json())
    for a in data.get("actions") or ():
        recipe = desired.recipes.get(a.get("recipe") or "")
        a["spec"] = recipe_spec(recipe) if recipe is not None else None
    return data


def plan_differences(approved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Pure: how the plan made now differs from the approved one (both as JSON, redacted alike), one line each, in
    words: a step of both that differs names what differs, a step of one only is named as the plan shows it; empty
    when they are the same plan (the facts of ``plan_lines``, compared)."""
    before, after = plan_lines(approved), plan_lines(now)
    if before == after:
        return []
    old_steps = _steps(approved)
    new_steps = _steps(now)
    out: list[str] = []
    for step, a in old_steps.items():
        b = new_steps.get(step)
        if b is None:
            out.append(f"plan: no longer {_step_words(a)}")
        elif _action_line(a) != _action_line(b):
            out.append(f"plan: {_step_words(b)}: " + "; ".join(_step_changes(a, b)))
    out += [f"plan: now {_step_words(b)}" for step, b in new_steps.items() if step not in old_steps]
    rest_before = before[len(approved.get("actions") or ()) :]
    rest_after = after[len(now.get("actions") or ()) :]
    out += [f"plan: no longer {line}" for line in rest_before if line not in rest_after]
    out += [f"plan: now {line}" for line in rest_after if line not in rest_before]
    return out or ["plan: the same steps in another order"]


def _steps(data: Mapping[str, Any]) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """A plan's actions by their step: kind, lane and container (a reclaim by its kind alone)."""
    out: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for a in data.get("actions") or ():
        lane = f"{a.get('recipe')}@{'+'.join(a.get('gpus') or ())}" if a.get("recipe") else ""
        out.setdefault((str(a.get("kind")), lane, str(a.get("container") or "")), a)
    return out


def _step_words(a: Mapping[str, Any]) -> str:
    """One step as a person reads it: "enter omni@dark-compute-b", "leave reconciler-omni-b (omni@dark-compute-b)",
    "reclaim 2 orphan offload file(s)"."""
    kind = a.get("kind")
    if kind == ActionKind.RECLAIM.value:
        return f"reclaim {len(a.get('paths') or ())} orphan offload file(s)"
    lane = f"{a.get('recipe') or 'no recipe'}@{'+'.join(a.get('gpus') or ()) or 'no slot'}"
    if kind == ActionKind.ENTER.value or not a.get("container"):
        return f"{kind} {lane}"
    return f"{kind} {a.get('container')} ({lane})"


def _step_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two versions of one step, in words."""
    out: list[str] = []
    if a.get("container_id") != b.get("container_id"):
        out.append(f"another container ({_short(b.get('container_id'))}, was {_short(a.get('container_id'))})")
    if a.get("recipe_hash") != b.get("recipe_hash"):
        out.append("its recipe was edited (it would make another container)")
    elif a.get("spec") != b.get("spec"):
        out.append("its recipe's probes, drain, sleep or reserve changed")
    if a.get("bytes") != b.get("bytes"):
        out.append(
            f"its offload file {human_bytes(int(b.get('bytes') or 0))}, was {human_bytes(int(a.get('bytes') or 0))}"
        )
    old, new = set(a.get("paths") or ()), set(b.get("paths") or ())
    if new - old:
        out.append("now also " + ", ".join(sorted(new - old)))
    if old - new:
        out.append("no longer " + ", ".join(sorted(old - new)))
    return out or ["changed"]


def _short(cid: Any) -> str:
    return str(cid)[:12] if cid else "none yet"
