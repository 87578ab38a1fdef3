"""The one interface every container engine is reached through: ``Engine``, and the errors it raises.

Every read of containers, images and events (``reconciler.observe.containers``) and every write
(``reconciler.apply.engine_ops``) goes through an ``Engine``: Docker's (``reconciler.host.engine.docker``), Podman's
(``.podman``), the simulation's (tests/sim), or a new one, which is one module that passes the conformance suite
(tests/real/test_engine_conformance.py) and a line in ``reconciler.host.engine.connect``.

What an engine answers is the Engine API's own JSON (a container's list summary, its inspect, an image's inspect, an
event), the documents Docker's API, Podman's Docker-compatible service and the simulation all speak; the observers'
parse (``containers.parse_container``) is pure and tested on captured answers of it. A create takes the rendering of
``reconciler.plan.spec.render`` (with its name and labels): the engine turns it into its own create request.

The errors say what the caller must tell apart, whichever engine and client answered: ``NotFound`` (no such
container or image), ``EngineError`` with the engine's status (409: a name in use), ``EngineDown`` (nothing answers)
and ``EngineSlow`` (it did not answer in time). An implementation raises these and no client library's own.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

DEFAULT_TIMEOUT_S = 60.0
DOCKER = "docker"
PODMAN = "podman"

# The container events the loop looks again for. Podman's Docker-compatible API says "remove" where Docker says
# "destroy", and matches its filter against its own name for a death, "died", though it reports it as "die"
# (measured on Podman 4.3: a filter of "die" alone never matches); each engine ignores the other's names.
EVENT_ACTIONS = ("start", "die", "died", "destroy", "remove")
GONE_ACTIONS = frozenset({"destroy", "remove"})

# A JSON document of the Engine API: a container's summary or inspect, an image's inspect, an event.
Doc = dict[str, Any]


class EngineError(Exception):
    """The engine answered with an error status (``status``), or not in HTTP at all (``status`` 0). ``proxy``: what a
    socket proxy in front of the engine refused (a 401/403/405 that is no answer of the engine's), in words."""

    def __init__(self, status: int, message: str, *, text: str | None = None, proxy: str | None = None):
        super().__init__(text if text is not None else (f"{status} {message}".strip() if status else message))
        self.status = status
        self.proxy = proxy


class NotFound(EngineError):
    """404: no such container or image (removed between a list and an inspect, say)."""


class EngineDown(ConnectionError):
    """Nothing answers at the engine's address: no socket, connection refused, or closed before any answer."""


class EngineSlow(TimeoutError):
    """The engine is there but did not finish its answer within ``timeout`` seconds."""

    def __init__(self, message: str, timeout: float):
        super().__init__(message)
        self.timeout = timeout


def slow_text(timeout: float) -> str:
    """How an engine that missed its deadline is described, the same words everywhere."""
    return f"the engine answered too slowly ({timeout:g} s, docker.timeout_s)"


def failure_cause(exc: BaseException) -> str:
    """Why a call to the engine failed: "slow" (it did not answer within docker.timeout_s), "down" (nothing
    answers there), or "error" (it answered with an error)."""
    if isinstance(exc, (EngineSlow, socket.timeout)):
        return "slow"
    if isinstance(exc, (EngineDown, ConnectionError, FileNotFoundError)):
        return "down"
    return "error"


def engine_kind(version: Mapping[str, Any]) -> str:
    """Pure: which engine a ``GET /version`` answer comes from. Podman's service names itself in ``Components``
    ("Podman Engine"); Docker's says "Engine". Anything else speaks Docker's API as Docker does."""
    for component in version.get("Components") or []:
        if str((component or {}).get("Name", "")).startswith("Podman"):
            return PODMAN
    return DOCKER


@runtime_checkable
class Engine(Protocol):
    """A container engine: what the tool reads of it and does to it, and nothing more.

    Reads: ``ping``, ``version``, ``info``, ``containers``, ``inspect_container``, ``inspect_image``, ``events``.
    Writes: ``create`` (labelled in the same call), ``start``, ``stop``, ``kill``, ``remove``, ``rename``; and
    ``logs`` (the evidence of a failed start). Each raises the errors of this module: a container or image that is
    not there is ``NotFound`` (``stop``, ``kill`` and ``remove`` of one too), and an engine that does not answer is
    ``EngineDown`` or ``EngineSlow``, never a client library's own exception.
    """

    url: str  # where it is reached (docker.url), for the messages
    kind: str  # DOCKER, PODMAN, or the name of another implementation

    def ping(self) -> None:
        """Answer, or raise ``EngineDown``/``EngineSlow``/``EngineError``."""

    def version(self) -> Doc:
        """``GET /version``: the engine's own description (``engine_kind`` reads it)."""

    def info(self) -> Doc:
        """``GET /info``: its runtimes and devices (``containers.gpu_runtime_of`` reads it)."""

    def containers(self, *, labels: Mapping[str, str] | None = None) -> list[Doc]:
        """Every container's list summary, running or not; with ``labels``, those that carry each (key, value)."""

    def inspect_container(self, cid: str) -> Doc:
        """A container's inspect, by id or name."""

    def inspect_image(self, ref: str) -> Doc:
        """An image's inspect, by name or id, as the engine resolves it."""

    def create(self, spec: Mapping[str, Any]) -> str:
        """Create a container from ``reconciler.apply.engine_ops.create_spec`` (its image, command, env, binds, GPU
        requests, name and labels); its id. Not started."""

    def start(self, cid: str) -> None: ...

    def stop(self, cid: str, *, timeout_s: int) -> None:
        """SIGTERM (the image's stop signal), and SIGKILL once ``timeout_s`` seconds have passed; returns when it
        has stopped."""

    def kill(self, cid: str) -> None:
        """SIGKILL. A container that is not running is an ``EngineError`` (409)."""

    def remove(self, cid: str) -> None:
        """Remove a stopped container and its anonymous volumes."""

    def rename(self, cid: str, name: str) -> None:
        """A name in use is an ``EngineError`` of status 409."""

    def logs(self, cid: str, *, tail: int) -> str:
        """The last ``tail`` lines of its output and errors."""

    def events(self, *, actions: Collection[str]) -> Iterator[Doc]:
        """The containers' events of ``actions`` (``EVENT_ACTIONS``) as they happen, until the engine closes the
        stream (or the connection fails, raising)."""
