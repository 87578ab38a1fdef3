"""Why a change cannot be made safely, in one word: ``BlockerCause``, each cause with the advice the front-ends show
for it and the refusal reason ``reconciler_refusals_total`` counts it as, beside it; and ``Problem``, one reason a
lane cannot enter or wake now as the planner's checks find it (its words, what holds the way, its cause).

Pure, standard library only. Made by the planner's checks (``reconciler.plan.slot_problems``, ``enter_checks``,
``sleeping``, ``enters``), carried by ``reconciler.plan.actions.Blocker`` and the plan's JSON (``cause``, its value);
read by the command line, the status page, the API and MCP (through the plan's JSON), and the loop's metrics. A
cause added here is shown, advised and counted everywhere; ``tests/unit/test_plan_json.py`` checks each has both.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class BlockerCause(StrEnum):
    """What kind of problem keeps a change from being made, in the order the advice for each is given: the value is
    the ``cause`` of a blocker in the plan's JSON (the external contract: never renamed)."""

    # A reading of the host (the engine, /proc and the offload dir, the GPUs) could not vouch for the slots or the
    # offload files: telemetry down, a GPU not found. Its JSON word is "source" since the first release (kept: the
    # contract); in the code "source" is the git source alone.
    UNSEEN = "source"
    ADOPT = "adopt"  # a container carries this host's labels but not this install's id
    HELD = "held"  # something not ours, or another assignment of ours, holds a slot
    MEMORY = "memory"  # the card has VRAM in use and lists no process (or not enough free to wake a lane)
    TMPFS = "tmpfs"  # no room on the offload tmpfs for the lane's file
    IMAGE = "image"  # a knowable failure of the enter itself: its image is not on the engine,
    RUNTIME = "runtime"  # the engine has no NVIDIA runtime for docker.gpu_requests,
    PORT = "port"  # its port is taken,
    RECIPE = "recipe"  # its command contradicts the recipe

    @property
    def advice(self) -> str:
        """What the operator can do about a blocker of this cause: the fix, never the cause again."""
        return _ADVICE[self]

    @property
    def refusal(self) -> str:
        """The reason ``reconciler_refusals_total`` counts a pass blocked by it as (a key of
        ``reconciler.loop.metric_families.REFUSAL_REASONS``)."""
        return _REFUSAL[self]


_ADVICE: dict[BlockerCause, str] = {
    BlockerCause.UNSEEN: "A reading of the host (the engine, /proc, the GPUs) could not vouch for the slots or the "
    "offload files, so nothing that needs it is changed: fix what the reading named above says.",
    BlockerCause.ADOPT: "A container with this host's labels but without this install's id is never stopped unasked: "
    "adopt it (`reconciler adopt NAME`, logged) if it is this host's lane, or remove it.",
    BlockerCause.HELD: "The reconciler never stops what it does not own: free the slot or change the manifest.",
    BlockerCause.MEMORY: "A card reports VRAM in use but NVML lists no process for it (on WSL2: Windows programs, or "
    "processes of another pid namespace): close what holds it, or raise gpu_reserve.idle_used_gib (or the slot's "
    "idle_used_gib) in configs/host.yaml if that is the card's idle use.",
    BlockerCause.TMPFS: "Make room on the offload tmpfs (`reconciler shm status` shows what holds it) or pick a smaller "
    "offload lane.",
    BlockerCause.IMAGE: "The tool never pulls: pull or build the image on this host (docker pull IMAGE), or name one it "
    "has; the lane it would replace keeps serving meanwhile.",
    BlockerCause.RUNTIME: "GPUs by DeviceRequest need NVIDIA's container toolkit on the engine's host; on a host without "
    "NVIDIA GPUs set docker.gpu_requests: false in configs/host.yaml.",
    BlockerCause.PORT: "Another process or lane listens on the recipe's port: stop it, or give the recipe a port of its "
    "own (its command and health.url); the lane it would replace keeps serving meanwhile.",
    BlockerCause.RECIPE: "The recipe contradicts itself: make its command agree with its keys.",
}

# An enter's own knowable failures that name no holder (image, runtime, recipe) are counted with the readings; one
# that names a holder (port) with the holders.
_REFUSAL: dict[BlockerCause, str] = {
    BlockerCause.UNSEEN: "source_unavailable",
    BlockerCause.ADOPT: "gpu_held",
    BlockerCause.HELD: "gpu_held",
    BlockerCause.MEMORY: "gpu_held",
    BlockerCause.TMPFS: "tmpfs_room",
    BlockerCause.PORT: "gpu_held",
    BlockerCause.IMAGE: "source_unavailable",
    BlockerCause.RUNTIME: "source_unavailable",
    BlockerCause.RECIPE: "source_unavailable",
}

UNKNOWN_ADVICE = "Run `reconciler plan` for what stands in the way."


def advice_for(cause: str) -> str:
    """The advice for a cause as the plan's JSON gives it (a value of ``BlockerCause``); a word this release does not
    know (a newer loop's) gets the general advice."""
    try:
        return BlockerCause(cause).advice
    except ValueError:
        return UNKNOWN_ADVICE


class Problem(NamedTuple):
    """One reason a lane cannot enter (or wake) now: the words that say it with its fix, what holds the way (a
    container's name, ``pid N``, ``tmpfs``; empty where nothing here does), and its cause. The planner makes a
    ``Blocker`` of each."""

    reason: str
    holder: str
    cause: BlockerCause


Problems = list[Problem]
