"""The refusal reasons the loop counts in ``reconciler_refusals_total``: those of one pass (``pass_refusals``) and
those of one guarded reclaim (``reclaim_refusals``). Pure; called by the loop after each pass and for each reclaim,
its own or a front-end's.
"""

from __future__ import annotations

from typing import Any

from reconciler.apply.results import PassResult


def pass_refusals(result: PassResult) -> list[str]:
    """The refusal reasons of one pass, each counted once: a blocked plan or a source that was unavailable.

    Pure. A blocker's ``holder`` says what stands in the way: ``tmpfs`` (no room for the offload file), a
    container name or ``pid N`` (something not ours holds the GPU), or nothing (a source could not vouch for
    the slot or the offload files: GPU telemetry down, a GPU not found, /proc unreadable).
    """
    if result.result == "error" and result.final.unavailable:
        return ["source_unavailable"]
    if result.result != "blocked":
        return []
    found = set()
    for b in result.final.blockers:
        found.add("tmpfs_room" if b.holder == "tmpfs" else "gpu_held" if b.holder else "source_unavailable")
    return sorted(found)


def reclaim_refusals(res: Any) -> list[str]:
    """The refusal reasons of one guarded reclaim (a ``reconciler.apply.shm_guard.ReclaimResult``), each counted once.

    Pure, and read from data: the code of a whole reclaim refused (``refused_code``), and the code each kept file
    carries where keeping it was a refusal (the kernel refused the write lease, the two inspections disagreed, it
    gained an owner before its unlink, it is no plain file of shm.dir). Files owned all along, gone, or orphans the
    reclaim was not asked for carry none.
    """
    found = {res.refused_code} if res.refused_code else set()
    found.update(k.code for k in res.kept if k.code)
    return sorted(found)
