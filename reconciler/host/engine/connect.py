"""Which engine a URL reaches: ``ENGINES``, each implementation of ``protocol.Engine`` by the name its version answer
gives (``protocol.engine_kind``), and ``connect``, which asks and returns that implementation ready for writes.

The reads need no answer to this: Docker's Engine API is what Docker and Podman's compatible service both answer
(``docker.DockerEngine``), so ``reconciler plan`` never asks. A write does, once per observer: a create differs.
An engine added here is one module beside this one and one line in ``ENGINES``.
"""

from __future__ import annotations

from reconciler.host.engine.docker import DockerEngine
from reconciler.host.engine.podman import PodmanEngine
from reconciler.host.engine.protocol import DOCKER, PODMAN, Engine, engine_kind

ENGINES: dict[str, type[DockerEngine]] = {DOCKER: DockerEngine, PODMAN: PodmanEngine}


def connect(reads: DockerEngine) -> Engine:
    """The implementation for the engine at ``reads.url``, sharing its clients: the SDK's is made now (it asks the
    engine for its version as it is made; an engine that does not answer raises ``EngineDown`` or ``EngineSlow``),
    and the version answer names the engine."""
    sdk = reads.sdk
    with reads.sdk_errors():
        kind = engine_kind(sdk.version())
    cls = ENGINES.get(kind, DockerEngine)
    if type(reads) is cls:
        return reads
    return cls(reads.url, timeout=reads.timeout, sdk=sdk, reader=reads.reader)
