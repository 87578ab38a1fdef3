"""Import contract: the model and planner are pure. They import no Docker, NVML, metrics or file-watching code,
directly or through anything they import."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("docker", "pynvml", "prometheus_client", "watchdog", "requests", "urllib3")


def test_model_and_planner_import_nothing_that_talks_to_the_world() -> None:
    code = (
        "import sys\n"
        "import reconciler.model, reconciler.planner, reconciler.observed\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"pure layers pulled in: {out}"
