"""``reconciler qualify RECIPE`` and ``reconciler evidence [RECIPE]``: the report's qualification as one command
(preflight, the context ladder, the offload reload proof, per-card VRAM throughout, kept as evidence per recipe
hash) and the evidence kept, listed or rendered as the report's Markdown.

Registered by ``reconciler.cli.build_parser``: their options here, their handlers in
``reconciler.cli.commands.qualify``, loaded when one of them runs (the start-up budget).
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.cli.common import Command


def add_commands(sub: Any, *, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "qualify",
        parents=parents,
        help="qualify a recipe's running lane: preflight, the context ladder, the reload proof, kept as evidence",
        description="Against the recipe's running, awake lane (refused otherwise, naming the switch that would run "
        "it): the preflight suite, one cold streamed request per ladder rung (TTFO, first-visible TTFT, prefill and "
        "decode speed, the lane's counters before and after), with --reload the offload reload proof, every card of "
        "the lane sampled throughout with NVML. Kept as evidence per recipe hash (a failed run too).",
    )
    p.add_argument("recipe", metavar="RECIPE", help="the recipe's name (its file stem under configs/recipes/)")
    p.add_argument(
        "--ladder", default="125000,192000,250000", help="target prompt tokens, one rung each (default: %(default)s)"
    )
    p.add_argument("--reload", action="store_true", help="also prove the offload tier: evict request zero, replay it")
    p.add_argument("--repeat", type=int, default=1, help="run the whole sequence N times, keeping each (default 1)")
    p.set_defaults(func=Command("qualify", "cmd_qualify"))
    p = sub.add_parser(
        "evidence",
        parents=parents,
        help="the kept qualification evidence, listed, or a recipe's newest as the report's Markdown (--report)",
    )
    p.add_argument("recipe", nargs="?", metavar="RECIPE", help="only this recipe's")
    p.add_argument("--report", action="store_true", help="render the recipe's newest record as Markdown")
    p.add_argument(
        "--gates", default=None, help='with --report: gates to decide against, as JSON ({"reserve_free_gib": 3})'
    )
    p.set_defaults(func=Command("qualify", "cmd_evidence"))
