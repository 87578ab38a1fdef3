"""A stand-in for a Docker engine, for the GPU proof on a machine that has an NVIDIA GPU but no Docker.

It is not Docker and not a fake of the reconciler: it answers only the read-only calls the Docker observer
makes (``GET /_ping``, ``GET /version``, ``GET /containers/json``, the last with an empty list, and the inspect
of the proof recipe's image, which a host that could enter it would have), on a unix socket, so ``reconciler status`` and ``plan`` can run where no engine is installed. Everything about the
GPU in the proof comes from real NVML and real /proc. Started by ``examples/gpu-proof/run.sh``.
"""

from __future__ import annotations

import json
import os
import socketserver
import sys
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote

VERSION = {
    "Version": "stand-in (no Docker on this machine)",
    "ApiVersion": "1.41",
    "MinAPIVersion": "1.12",
    "Os": "linux",
    "Arch": "amd64",
    "Components": [],
}


IMAGE = "gpu-proof:never-started"  # root/configs/recipes/proof.toml's container.image
IMAGE_ID = "sha256:" + "0" * 64


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # the name http.server dispatches to
        path = self.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if parts and parts[0].startswith("v1."):
            parts = parts[1:]  # versioned API path: /v1.41/containers/json
        route = unquote("/" + "/".join(parts))
        if route == "/_ping":
            self._send(200, b"OK", "text/plain")
        elif route == "/version":
            self._send(200, json.dumps(VERSION).encode(), "application/json")
        elif route == "/containers/json":
            self._send(200, b"[]", "application/json")
        elif route == f"/images/{IMAGE}/json":
            # the proof's recipe names this image: a host that can enter it has it, so the plan's image check
            # passes and the verdict is the GPU's alone
            self._send(200, json.dumps({"Id": IMAGE_ID, "RepoTags": [IMAGE]}).encode(), "application/json")
        else:
            body = json.dumps({"message": f"the stand-in engine answers no {route}"}).encode()
            self._send(404, body, "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Api-Version", VERSION["ApiVersion"])
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"  # a unix socket peer has no address

    def log_message(self, format: str, *args: object) -> None:  # http.server's signature
        sys.stderr.write(f"stand-in engine: {format % args}\n")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> int:
    path = sys.argv[1]
    if os.path.exists(path):
        os.unlink(path)
    with Server(path, Handler) as server:
        print(f"stand-in engine listening on unix://{path}", flush=True)
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
