"""The demo's client of the front door: it keeps asking one model (an alias of the manifest's ``aliases:``) through
``reconciler door`` while the demo switches topologies, and says at the end how many requests it made, how many
failed and across how many switches.

    python examples/demo/door-client.py --base-url http://127.0.0.1:9466/v1 --model chat --until FILE

Each request is an OpenAI chat completion, streamed (what a chat client does); it counts as an error unless the door
answers 200 and the stream ends with ``data: [DONE]`` and no error event (a connection cut, a 503, a stream that
stops short). Beside the requests, a second thread reads ``GET /v1/models`` every 0.1 s and counts the switches its
model lived through: each time the model's lane stops serving (its topology leaves) and each time it serves again.
It stops once FILE exists (after the request in flight), and exits 1 when any request failed, when none was made, or
when it saw fewer switches than ``--min-switches``. It needs httpx alone (the tool's own dependency).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import httpx


def ask(client: httpx.Client, base: str, model: str, n: int) -> str:
    """One streamed chat completion; '' when it was answered whole, else why not."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"request {n}"}],
        "stream": True,
        "max_tokens": 8,
        "stream_options": {"include_usage": True},
    }
    try:
        with client.stream("POST", f"{base}/chat/completions", json=body) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:200]}"
            done = False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                elif "error" in json.loads(data):
                    return f"an error event: {data[:200]}"
            return "" if done else "the stream ended without [DONE]"
    except (httpx.HTTPError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


class Watcher(threading.Thread):
    """Counts the switches the model lives through, as the door's ``GET /v1/models`` shows its lane's state."""

    def __init__(self, base: str, model: str):
        super().__init__(daemon=True)
        self.base, self.model = base, model
        self.switches = 0
        self.stop = threading.Event()

    def state(self, client: httpx.Client) -> str | None:
        try:
            models = client.get(f"{self.base}/models").json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return next((m.get("reconciler", {}).get("state") for m in models if m.get("id") == self.model), None)

    def run(self) -> None:
        serving: bool | None = None
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set():
                state = self.state(client)
                if state is not None:
                    now = state == "serving"
                    if serving is not None and now != serving:
                        self.switches += 1
                    serving = now
                time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="the door's OpenAI base URL, http://HOST:PORT/v1")
    p.add_argument("--model", required=True, help="the model or alias to ask for")
    p.add_argument("--until", required=True, type=Path, help="stop once this file exists")
    p.add_argument("--min-switches", type=int, default=0, help="exit 1 when fewer switches were seen")
    args = p.parse_args()
    base = args.base_url.rstrip("/")
    watcher = Watcher(base, args.model)
    watcher.start()
    requests, errors, longest = 0, 0, 0.0
    # No retries: what the door answers is what is counted. A held request may wait up to the door's hold_s.
    with httpx.Client(timeout=httpx.Timeout(300, connect=5)) as client:
        while not args.until.exists():
            requests += 1
            started = time.monotonic()
            why = ask(client, base, args.model, requests)
            longest = max(longest, time.monotonic() - started)
            if why:
                errors += 1
                print(f"door client: request {requests} failed: {why}", flush=True)
                time.sleep(0.2)
    watcher.stop.set()
    watcher.join()
    print(
        f"door client: {requests} requests, {errors} errors across {watcher.switches} switches "
        f"(model {args.model}; the longest request {longest:.1f} s)",
        flush=True,
    )
    if requests == 0 or errors:
        return 1
    if watcher.switches < args.min_switches:
        print(f"door client: expected at least {args.min_switches} switches", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
