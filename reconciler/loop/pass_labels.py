"""How an apply pass maps to the pass results the loop exports (``reconciler_reconcile_passes_total{result}``), without
the metrics client: a stand-alone command that imports the loop's package loads no prometheus_client.
"""

from __future__ import annotations

from reconciler.apply.results import PassResult, PassVerdict

# A pass's verdict as reconciler_passes_total{result} counts it (loop/metric_families.PASS_RESULTS). Every verdict
# has its label (tests/real/test_loop.py holds the two vocabularies together): "held" is blocked; an interrupted pass is
# an error; the verdict "changed" (the host changed after the plan was shown: exit 1) is failed. The label "changed"
# is another thing: a pass that converged after it changed something (``pass_label``).
PASS_LABEL: dict[PassVerdict, str] = {
    "converged": "converged",
    "held": "blocked",
    "blocked": "blocked",
    "failed": "failed",
    "changed": "failed",
    "error": "error",
    "interrupted": "error",
    # An enter abandoned for an edit that left its lane unwanted: the host changed as planned until then, and the
    # next pass (woken by the same edit) plans the new desired state. No failure.
    "superseded": "changed",
}


def pass_label(result: PassResult) -> str:
    label = PASS_LABEL[result.result]
    return "changed" if label == "converged" and result.outcomes else label
