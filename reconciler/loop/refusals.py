"""The refusal reasons the loop counts in ``reconciler_refusals_total``: those of one pass (``pass_refusals``) and
those of one guarded reclaim (``reclaim_refusals``). Pure; called by the loop after each pass and for each reclaim,
its own or a front-end's.
"""

from __future__ import annotations

from typing import Any

from reconciler.apply.results import PassResult


def pass_refusals(result: PassResult) -> list[str]:
    """The refusal reasons of one pass, each counted once: a blocked plan or a source that was unavailable.

    Pure. A blocker's cause says the reason it is counted as (``BlockerCause.refusal``): ``tmpfs_room`` (no room for
    the offload file), ``gpu_held`` (something not ours holds the GPU) or ``source_unavailable`` (a source could not
    vouch for the slot or the offload files: GPU telemetry down, a GPU not found, /proc unreadable).
    """
    if result.result == "error" and result.final.unavailable:
        return ["source_unavailable"]
    if result.result != "blocked":
        return []
    return sorted({b.cause.refusal for b in result.final.blockers})


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
