"""A lane whose process prints its environment and its arguments, then exits: the failed enter's cause quotes the
container's last log lines, and the secret values it printed (taken from ``secrets.env_file`` and from the
reconciler's environment) must reach no output of the tool: not ``/healthz`` (answered without a token), the loop's
log, ``status`` and ``plan`` (text and JSON), the audit trail, the loop's state file and the host's records,
``GET /v1/status`` or ``/metrics``. Every form is printed: ``HF_TOKEN=value`` (``env``), ``HF_TOKEN: value``, the
value bare, as an argument's value, and the value of a name that does not look secret (``MODEL_ACCESS``).

A real ``reconciler run`` on the real engine, the container a real one of the fake vLLM image (its shell from the
host's /usr).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from e2e_helpers import LoopProcess, Root, http_get, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.root]

# Shapes no rule of the redaction knows: only the values themselves can find them.
FILE_SECRET = "Zq7pW2mXk9vR"  # HF_TOKEN, from secrets.env_file
ODD_SECRET = "plain-access-4711x"  # MODEL_ACCESS, from secrets.env_file: a name that does not read as secret
ENV_SECRET = "envonly.Qw8rT5yU"  # LANE_PASSPHRASE, from the reconciler's own environment
SECRETS = (FILE_SECRET, ODD_SECRET, ENV_SECRET)
TOKEN = "secret-values-token-" + "z" * 20
SCRIPT = (
    "env; "
    'echo "HF_TOKEN: $HF_TOKEN"; '
    'echo "token is $HF_TOKEN"; '
    'echo "access granted with $MODEL_ACCESS for the lane"; '
    'echo "starting vllm serve --served-model-name x $LANE_PASSPHRASE"; '
    'echo "$HF_TOKEN"; '
    'echo "ERROR: access granted with $MODEL_ACCESS, then refused: $HF_TOKEN / $LANE_PASSPHRASE"; '
    "exit 3"
)


def _printing_lane(root: Root, env_file: Path) -> str:
    env_file.write_text(f"HF_TOKEN={FILE_SECRET}\nMODEL_ACCESS={ODD_SECRET}\n")
    env_file.chmod(0o600)
    host = root.path / "configs" / "host.yaml"
    host.write_text(host.read_text() + f"secrets:\n  env_file: {env_file}\n")
    root.env["LANE_PASSPHRASE"] = ENV_SECRET
    name = root.recipe("omni", start_timeout_s=8)
    data = root.recipe_data(name)
    data["container"]["command"] = ["sh", "-c", SCRIPT]
    data["container"]["env"] = {
        **data["container"].get("env", {}),
        "HF_TOKEN": "${HF_TOKEN}",
        "MODEL_ACCESS": "${MODEL_ACCESS}",
        "LANE_PASSPHRASE": "${LANE_PASSPHRASE}",
    }
    root.write_recipe(name, data)
    return name


def _leaks(text: str) -> set[str]:
    return {s for s in SECRETS if s in text}


def test_a_lane_printing_its_secrets_leaks_them_nowhere(root: Root, start_loop, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    name = _printing_lane(root, tmp_path / "secrets.env")
    root.env["RECONCILER_API_TOKEN"] = TOKEN
    root.manifest((name, ["dark-compute-a"]))
    lp: LoopProcess = start_loop()
    try:
        failed = lp.wait("action", kind="enter", result="failed", timeout=90)[0]
        # The cause does quote the container's log (the secret values would be in it): the test can fail.
        assert "access granted with" in str(failed.data), repr(failed.data)
        outputs: dict[str, str] = {"log": lp.log() + "\n".join(lp.other)}
        # /healthz answers anyone: its verdict, never a cause (the failed pass's message quoted the container's log).
        health = [http_get(f"http://{lp.addr}/healthz")[1].decode() for _ in range(20)]
        for body in health:
            message = json.loads(body)["last_pass"].get("message")
            assert message in (None, "failed", "converged", "held", "blocked", "interrupted"), body
        outputs["/healthz"] = "\n".join(health)
        outputs["/metrics"] = lp.scrape()

        def api_status() -> str:
            req = urllib.request.Request(f"http://{lp.addr}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                text: str = r.read().decode()
            return text if "access granted with" in text else ""

        # Once the loop has published its backoff, status quotes the failure.
        outputs["GET /v1/status"] = wait_until(api_status, timeout=30, what="status quoting the failed enter")
        for args in (("status",), ("status", "--json"), ("plan",), ("plan", "--json"), ("audit",), ("audit", "--json")):
            for alone in ({}, {"RECONCILER_NO_LOOP": "1"}):
                r = root.cli(*args, env=alone)
                outputs[f"{' '.join(args)} {alone}"] = r.stdout + r.stderr
        for d in (root.lock_dir, Path(root.env["RECONCILER_STATE_DIR"])):
            for f in d.rglob("*"):
                if f.is_file():
                    outputs[str(f)] = f.read_text(errors="replace")
        outputs["log, at the end"] = lp.log() + "\n".join(lp.other)
    finally:
        lp.stop()
    assert any("state.json" in k for k in outputs), sorted(outputs)
    leaked = {where: _leaks(text) for where, text in outputs.items() if _leaks(text)}
    assert not leaked, "\n".join(f"{where}: {sorted(found)}" for where, found in leaked.items())
    # Masked, not dropped: the operator still sees that a value was there.
    assert "access granted with ***, then refused: *** / ***" in outputs["GET /v1/status"], outputs["GET /v1/status"]
