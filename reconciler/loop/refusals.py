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

    Pure. A whole reclaim refused names its cause in ``refused``; a file kept out of the reclaim is a refusal
    when it was a candidate of the first inspection (it changed or gained an owner before its unlink), when it
    turned orphan only at the second inspection, when the kernel refused the write lease before its unlink, or
    when it is a pattern match that is no plain file. Files
    owned all along, and orphans the reclaim was not asked for, are not refusals.
    """
    found = set()
    refused = res.refused or ""
    if refused.startswith("running container(s) with native offload"):
        found.add("offload_container_running")
    elif refused.startswith("proc ") and "cannot be inspected" in refused:
        found.add("uninspectable_process")
    elif refused:
        found.add("source_unavailable")
    candidates = {f.path for f in res.candidates}
    removed = {f.path for f in res.reclaimed}
    for k in res.kept:
        if k.code == "lease_refused":
            found.add("lease_refused")  # the last gate said no: counted whatever the inspections said
        elif k.state == "skipped":
            found.add("invalid_entry")
        elif k.path in candidates and k.path not in removed and not refused:
            if k.state == "gone":
                continue  # removed by someone else meanwhile: nothing was refused
            if k.state in ("owned", "blocked") or "just before removal" in k.reason:
                found.add("file_owned")
            else:
                found.add("inspections_disagree")
        elif k.state == "orphan" and k.reason.startswith("appeared or became unowned"):
            found.add("inspections_disagree")
    return sorted(found)
