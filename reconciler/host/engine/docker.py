"""Docker's engine (``protocol.Engine``): the Engine API that Docker serves, and that Podman's Docker-compatible service
serves too for everything but a create with GPUs (``reconciler.host.engine.podman``).

The reads go through the small standard-library client (``reconciler.host.engine.http``) where it speaks the URL's
scheme, else through the Docker SDK; the writes and the event stream go through the SDK, imported on first use
(about 80 ms: ``reconciler plan`` and a converged ``apply`` never pay for it). Every SDK error is turned into the
protocol's at this boundary (``sdk_errors``): no caller imports ``docker.errors``.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Collection, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from reconciler.host.engine.http import EngineClient
from reconciler.host.engine.protocol import (
    DEFAULT_TIMEOUT_S,
    DOCKER,
    Doc,
    EngineDown,
    EngineError,
    EngineSlow,
    NotFound,
    slow_text,
)


def _label_filter(labels: Mapping[str, str] | None) -> dict[str, list[str]] | None:
    return {"label": [f"{k}={v}" for k, v in labels.items()]} if labels else None


def proxy_refusal(exc: BaseException) -> str | None:
    """What a socket proxy's refusal of an SDK call says, naming the call; None for any other error.

    The engine answers its errors in JSON; a 401/403/405 whose body is not JSON came from a proxy's allow-list."""
    response = getattr(exc, "response", None)
    status = getattr(exc, "status_code", None)
    if response is None or status not in (401, 403, 405) or "json" in response.headers.get("Content-Type", ""):
        return None
    request = response.request
    path = re.sub(r"^/v[0-9.]+/", "/", urlsplit(request.url or "").path)
    return (
        f"the proxy in front of the engine refused {request.method} {path} ({status}); allow it "
        "there, or point docker.url at an engine that allows it (docs/reference/engines.md)"
    )


def translate(exc: BaseException, timeout: float) -> BaseException:
    """The protocol's error for an exception of the SDK or its transport (requests); any other as it is."""
    errors = sys.modules.get("docker.errors")
    requests_exc = sys.modules.get("requests.exceptions")
    text = str(exc).strip()
    if errors is not None and isinstance(exc, errors.APIError):
        status = int(exc.status_code or 0)
        cls = NotFound if isinstance(exc, errors.NotFound) else EngineError
        return cls(status, text, text=text, proxy=proxy_refusal(exc))
    if requests_exc is not None and isinstance(exc, requests_exc.Timeout):
        return EngineSlow(f"{slow_text(timeout)}: {text}", timeout)
    slow_words = "timed out" in text.lower()  # urllib3 wraps a read timeout into a ConnectionError on some versions
    if requests_exc is not None and isinstance(exc, requests_exc.ConnectionError):
        return EngineSlow(f"{slow_text(timeout)}: {text}", timeout) if slow_words else EngineDown(text)
    if errors is not None and isinstance(exc, errors.DockerException):
        # The SDK's "Error while fetching server API version: ...", with the cause in its text.
        return EngineSlow(f"{slow_text(timeout)}: {text}", timeout) if slow_words else EngineDown(text)
    return exc


class DockerEngine:
    """The engine at ``url`` through Docker's Engine API. ``sdk``: a docker.APIClient already made (else made on the
    first write, asking the engine its version as it is made); ``reader``: the standard-library client to read
    through (else made for ``url`` where it speaks its scheme)."""

    kind = DOCKER

    def __init__(
        self, url: str, *, timeout: float = DEFAULT_TIMEOUT_S, sdk: Any = None, reader: EngineClient | None = None
    ):
        self.url = url
        self.timeout = timeout
        self._sdk = sdk
        self._reader = reader if reader is not None else EngineClient.for_url(url, timeout=timeout)

    @contextlib.contextmanager
    def sdk_errors(self) -> Iterator[None]:
        """Every SDK error raised inside as the protocol's (the SDK's own as its cause)."""
        try:
            yield
        except Exception as exc:
            mapped = translate(exc, self.timeout)
            if mapped is exc:
                raise
            raise mapped from exc

    @property
    def sdk(self) -> Any:
        """The Docker SDK's client, made on first use; an engine that does not answer then is ``EngineDown`` or
        ``EngineSlow``."""
        if self._sdk is None:
            # The Docker SDK (about 80 ms, requests and urllib3 with it): the writes only (start-up budget).
            import docker

            with self.sdk_errors():
                self._sdk = docker.APIClient(base_url=self.url, version="auto", timeout=self.timeout)
        return self._sdk

    @property
    def reader(self) -> EngineClient | None:
        """The standard-library client the reads go through; None where it does not speak the URL's scheme."""
        return self._reader

    def _sdk_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        sdk = self.sdk
        with self.sdk_errors():
            return getattr(sdk, name)(*args, **kwargs)

    # ------------------------------------------------------------ reads

    def ping(self) -> None:
        if self._reader is not None:
            self._reader.ping()
        else:
            self._sdk_call("ping")

    def version(self) -> Doc:
        return self._reader.version() if self._reader is not None else self._sdk_call("version")

    def info(self) -> Doc:
        return self._reader.get("/info") if self._reader is not None else self._sdk_call("info")

    def containers(self, *, labels: Mapping[str, str] | None = None) -> list[Doc]:
        filters = _label_filter(labels)
        if self._reader is not None:
            return self._reader.containers(all=True, filters=filters)
        return list(self._sdk_call("containers", all=True, filters=filters))

    def inspect_container(self, cid: str) -> Doc:
        if self._reader is not None:
            return self._reader.inspect_container(cid)
        return dict(self._sdk_call("inspect_container", cid))

    def inspect_image(self, ref: str) -> Doc:
        if self._reader is not None:
            return self._reader.inspect_image(ref)
        return dict(self._sdk_call("inspect_image", ref))

    def events(self, *, actions: Collection[str]) -> Iterator[Doc]:
        # Opened here, before the first event: an engine that does not answer raises now, not at the first next().
        stream = self._sdk_call("events", decode=True, filters={"type": "container", "event": list(actions)})
        return self._events(stream)

    def _events(self, stream: Iterator[Doc]) -> Iterator[Doc]:
        with self.sdk_errors():
            yield from stream

    # ------------------------------------------------------------ writes

    def create(self, spec: Mapping[str, Any]) -> str:
        sdk = self.sdk
        with self.sdk_errors():
            hc = sdk.create_host_config(**spec["host_config"])
            args = {k: v for k, v in spec.items() if k != "host_config"}
            return str(sdk.create_container(host_config=hc, **args)["Id"])

    def start(self, cid: str) -> None:
        self._sdk_call("start", cid)

    def stop(self, cid: str, *, timeout_s: int) -> None:
        # The SDK's HTTP timeout for a stop is its own timeout plus the engine's stop timeout: it outlasts the stop.
        self._sdk_call("stop", cid, timeout=timeout_s)

    def kill(self, cid: str) -> None:
        self._sdk_call("kill", cid)

    def remove(self, cid: str) -> None:
        self._sdk_call("remove_container", cid, v=True, force=False)

    def rename(self, cid: str, name: str) -> None:
        self._sdk_call("rename", cid, name)

    def logs(self, cid: str, *, tail: int) -> str:
        raw = self._sdk_call("logs", cid, stdout=True, stderr=True, tail=tail)
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
