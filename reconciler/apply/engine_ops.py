"""The engine's writes for the apply layer: create (labelled in the same call), start, stop, remove, rename, logs.

Only ``reconciler.apply`` and the service's prune call this; they reach the engine through its one interface
(``reconciler.host.engine.protocol.Engine``), whichever engine it is. Transient engine errors (no answer, 5xx)
are retried with exponential backoff through tenacity; permanent ones (4xx: bad config, conflict, missing image)
fail at once. The message of the last attempt says it was the last.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from reconciler.base.clock import REAL_CLOCK, Clock
from reconciler.base.errors import ReconcilerError
from reconciler.host.engine.protocol import Engine, EngineDown, EngineError, EngineSlow, NotFound, failure_cause
from reconciler.model import DesiredState, container_name, recipe_hash
from reconciler.observe.containers import inherited_labels
from reconciler.plan import spec
from reconciler.plan.observed import (
    INACTIVE_STATES,
    LABEL_GPUS,
    LABEL_HASH_VERSION,
    LABEL_HOST,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_OFFLOAD,
    LABEL_PREFIX,
    LABEL_RECIPE,
    LABEL_RECIPE_HASH,
    LABEL_SLOTS,
    LABEL_SPEC_HASH,
    LABEL_SPEC_PARTS,
    PRESERVED_SUFFIX,
)

T = TypeVar("T")
ATTEMPTS = 4
PRESERVE_NAME_TRIES = 10


class DockerActionError(ReconcilerError):
    """A Docker call failed for good (permanent error, or the last of the retries)."""

    code = "docker_action"


class DockerUnavailable(ReconcilerError):
    """No engine answers at ``docker.url`` (not running, wrong URL, socket not reachable): nothing was attempted."""

    code = "docker_unavailable"

    def __init__(self, url: str, cause: BaseException | str):
        self.url = url
        text = str(cause).strip()
        detail = (text.splitlines()[0] if text else type(cause).__name__)[:300]
        if isinstance(cause, BaseException) and failure_cause(cause) == "slow":
            fix = (
                "The engine is there but busy: find what keeps it busy, or raise docker.timeout_s in configs/host.yaml"
            )
        else:
            fix = "Start the Docker engine, or fix docker.url in configs/host.yaml"
        super().__init__(f"docker source unavailable at {url}: {detail}; nothing changed. {fix}")


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (EngineDown, EngineSlow, ConnectionError)):
        return True
    return isinstance(exc, EngineError) and not isinstance(exc, NotFound) and exc.status >= 500


def _call(fn: Callable[..., T], *args: Any, sleep: Callable[[float], None], name: str, **kwargs: Any) -> T:
    """Run one engine call with the retry policy (its waits through ``sleep``); permanent errors surface unchanged
    at once. ``name``: the call's, for the messages."""
    # tenacity: the writes only, never the reads (start-up budget)
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    try:
        for attempt in Retrying(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_exponential(multiplier=0.2, max=3),
            sleep=sleep,
            reraise=True,
        ):
            with attempt:
                return fn(*args, **kwargs)
    except Exception as exc:
        if _transient(exc):
            raise DockerActionError(f"docker {name}: {exc} (the last of {ATTEMPTS} attempts)") from exc
        if isinstance(exc, EngineError) and exc.proxy is not None:
            raise DockerActionError(f"docker {name}: {exc.proxy}") from exc
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def labels_for(desired: DesiredState, recipe_name: str, slots: tuple[str, ...], *, install_id: str) -> dict[str, str]:
    recipe = desired.recipes[recipe_name]
    gpus = [desired.host.gpus[s].preferred_id() for s in slots]
    parts = spec.part_hashes(desired.host, recipe, slots, secret_digests=desired.secret_digests)
    labels = {
        LABEL_MANAGED: "true",
        LABEL_HOST: desired.host.name,
        LABEL_INSTALL: install_id,
        LABEL_RECIPE: recipe_name,
        LABEL_RECIPE_HASH: recipe.content_hash(),
        LABEL_SPEC_HASH: spec.spec_hash(parts),
        LABEL_SPEC_PARTS: spec.encode_parts(parts),
        LABEL_HASH_VERSION: str(recipe_hash.hash_version()),
        LABEL_SLOTS: ",".join(slots),
        LABEL_GPUS: ",".join(gpus),
        LABEL_OFFLOAD: "true" if recipe.offload.enabled else "false",
        LABEL_PREFIX + "model": recipe.model.id,
    }
    if recipe.model.revision:
        labels[LABEL_PREFIX + "model-revision"] = recipe.model.revision
    return labels


def create_spec(
    desired: DesiredState,
    recipe_name: str,
    slots: tuple[str, ...],
    *,
    install_id: str,
    secrets: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Pure: the create_container arguments for a recipe on its slots (``reconciler.plan.spec.render``), with its name
    and the labels that make it ours: this host's name, this install's id, and the hashes of what it is made of.
    ``secrets``: the values of the recipe's ``"${NAME}"`` env references (they go to the engine, nowhere else)."""
    return {
        **spec.render(desired.host, desired.recipes[recipe_name], slots, secrets=secrets),
        "labels": labels_for(desired, recipe_name, slots, install_id=install_id),
        "name": container_name(recipe_name, slots),
    }


class EngineOps:
    """The writes, through ``engine`` (an ``Engine``), or the one ``connect`` gives when it is first needed (Docker's
    makes its SDK client then, which asks the engine for its version and fails when no engine answers): the failure
    is then a ``DockerUnavailable`` naming ``url``, never the engine's own exception."""

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        connect: Callable[[], Engine] | None = None,
        url: str = "",
        ping: Callable[[], None] | None = None,
        clock: Clock = REAL_CLOCK,
    ):
        if engine is None and connect is None:
            raise TypeError("EngineOps needs an engine or a connect function")
        self._engine = engine
        self._connect = connect
        self._ping = ping
        self.clock = clock  # the retries' waits and the preserved names' stamps
        self.url = url or (engine.url if engine is not None else "")

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``self.engine.NAME(*args, **kwargs)`` under the retry policy."""
        return _call(getattr(self.engine, name), *args, sleep=self.clock.sleep, name=name, **kwargs)

    def check(self) -> None:
        """Raise ``DockerUnavailable`` when no engine answers at ``url``. With ``ping`` (the observer's) this costs
        one request and no SDK: a pass with nothing to write never imports it."""
        if self._ping is None or self._engine is not None:
            _ = self.engine
            return
        try:
            self._ping()
        except Exception as exc:  # EngineDown, EngineSlow, EngineError: the engine is not there
            raise DockerUnavailable(self.url or "docker.url", exc) from exc

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            assert self._connect is not None
            try:
                self._engine = self._connect()
            except Exception as exc:  # EngineDown, EngineSlow (the engine's connect), OSError
                raise DockerUnavailable(self.url or "docker.url", exc) from exc
        return self._engine

    def image_present(self, image: str) -> bool:
        try:
            self._call("inspect_image", image)
            return True
        except NotFound:
            return False

    def create(self, spec: dict[str, Any]) -> str:
        return str(self._call("create", spec))

    def start(self, cid: str) -> None:
        self._call("start", cid)

    def inspect(self, cid: str) -> dict[str, Any]:
        return dict(self._call("inspect_container", cid))

    def stop(self, cid: str, timeout_s: float) -> None:
        try:
            self._call("stop", cid, timeout_s=int(max(1, round(timeout_s))))
        except NotFound:
            return

    def remove(self, cid: str) -> None:
        try:
            self._call("remove", cid)
        except NotFound:
            return

    def kill(self, cid: str) -> None:
        try:
            self._call("kill", cid)
        except EngineError:
            return  # not running any more

    def preserve(self, cid: str, name: str) -> str:
        """Rename a failed container so its name is free and its logs stay readable."""
        now = self.clock.time()
        # A start that fails at once can fail again within the same second (two quick applies), and the stamp
        # has one-second resolution: take the next free second rather than lose the failure to a name conflict.
        for later in range(PRESERVE_NAME_TRIES):
            new = f"{name}{PRESERVED_SUFFIX}{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now + later))}"
            try:
                self._call("rename", cid, new)
                return new
            except EngineError as exc:
                if exc.status != 409:
                    raise
        raise DockerActionError(
            f"cannot keep failed container {cid[:12]}: {PRESERVE_NAME_TRIES} names {name}{PRESERVED_SUFFIX}... "
            "are taken; remove old kept containers (docker rm NAME)"
        )

    def prune_kept(
        self,
        name: str,
        *,
        host: str,
        keep: int,
        install_id: str | None = None,
        owned: Collection[str] | None = None,
    ) -> list[str]:
        """Remove all but the newest ``keep`` stopped failed containers kept under ``name``; returns the removed.

        Only stopped containers named ``name-failed-STAMP`` that carry, on themselves, this tool's labels for
        ``host`` and ``install_id`` (this install's) are touched. Another install's, one from before install ids,
        and one that has those labels only from its image (every container made from that image carries them:
        ``containers.inherited_labels``) are not proven ours and stay; with ``owned`` (the ids this install recorded as
        its own) so does one whose id is not among them, a copy that carries the labels. Without ``install_id``
        nothing is removed."""
        if not install_id:
            return []
        pattern = re.compile(re.escape(name + PRESERVED_SUFFIX) + r"\d{8}-\d{6}$")
        own = {LABEL_MANAGED: "true", LABEL_HOST: host, LABEL_INSTALL: install_id}
        listed = self._call("containers", labels=own)
        images: dict[str, dict[str, str] | None] = {}

        def proven(c: Mapping[str, Any]) -> bool:
            labels = c.get("Labels") or {}
            if any(labels.get(k) != v for k, v in own.items()):
                return False  # an engine that ignored the filter
            if owned is not None and c["Id"] not in owned:
                return False  # this install's labels, copied: not a container it created
            image = c.get("ImageID")  # the image's id, never its name: a name may since point at another image
            if not image:
                try:
                    image = self._call("inspect_container", c["Id"]).get("Image") or ""
                except NotFound:
                    return False  # removed meanwhile: nothing left to prune
            if image not in images:
                images[image] = self._image_labels(image)
            found = images[image]
            return found is not None and not inherited_labels(labels, found) & own.keys()

        kept = sorted(
            (
                ((c.get("Names") or ["/"])[0].lstrip("/"), c["Id"])
                for c in listed
                if c.get("State") in INACTIVE_STATES
                and pattern.match((c.get("Names") or ["/"])[0].lstrip("/"))
                and proven(c)
            ),
            reverse=True,  # the stamp sorts by time: newest first
        )
        removed = []
        for cname, cid in kept[keep:]:
            self.remove(cid)
            removed.append(cname)
        return removed

    def _image_labels(self, image_id: str) -> dict[str, str] | None:
        """An image's labels; None when it cannot be inspected (removed while containers of it remain): what a
        container of it inherited then cannot be told."""
        if not image_id:
            return None
        try:
            return dict((self._call("inspect_image", image_id).get("Config") or {}).get("Labels") or {})
        except NotFound:
            return None

    def logs_tail(self, cid: str, lines: int = 40) -> str:
        try:
            return str(self._call("logs", cid, tail=lines))
        except (DockerActionError, Exception):  # noqa: BLE001 - logs are evidence, not a reason to fail harder
            return ""
