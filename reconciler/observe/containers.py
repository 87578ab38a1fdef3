"""Engine observation, read-only: the containers on the host and what each holds.

``EngineObserver.read`` asks the engine (``reconciler.host.engine.protocol.Engine``: one list call, plus one inspect
per container not seen before:
the parts we read from an inspect never change for a container id, so they are cached). ``parse_container``
is pure and turns those dicts into ``ContainerView`` values; it is tested on captured engine answers.
Called by ``reconciler.observe.observe`` and the apply layer's re-observation.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reconciler.host.engine.connect import connect
from reconciler.host.engine.docker import DockerEngine
from reconciler.host.engine.protocol import (
    DEFAULT_TIMEOUT_S,
    GONE_ACTIONS,
    Engine,
    NotFound,
    engine_kind,
    failure_cause,
    slow_text,
)
from reconciler.observe.device_rules import DEVICE_RULE, bind_pairs, nvidia_majors, read_proc_devices, rule_cards
from reconciler.observe.procfs import NVIDIA_CARD_MINORS, NVIDIA_MAJOR
from reconciler.plan.observed import (
    LABEL_HOST,
    LABEL_OFFLOAD,
    LABEL_PREFIX,
    ContainerView,
    Reading,
)

# vLLM's native KV offload switches; any of them in a running container's config forbids reclaiming.
OFFLOAD_FLAGS = ("--kv-offloading-size", "--kv-offloading-backend")
OFFLOAD_ENV_PREFIX = "VLLM_KV_OFFLOAD"


def _status_exit_code(status: str) -> int | None:
    # The list API's Status reads like "Exited (137) 3 seconds ago".
    if status.startswith("Exited (") and ")" in status:
        try:
            return int(status[len("Exited (") : status.index(")")])
        except ValueError:
            return None
    return None


# A CDI device name of an NVIDIA GPU, as Podman and Docker (25+) take it: nvidia.com/gpu=<index | UUID | i:j | all>.
CDI_GPU_PREFIX = "nvidia.com/gpu="
# Any other CDI device of NVIDIA's (nvidia.com/mig=..., nvidia.com/pgpu=...): what card it is cannot be told here.
CDI_NVIDIA_VENDOR = "nvidia.com/"
# The id a container run with --privileged holds: every device node of the host, every card among them.
PRIVILEGED = "privileged"
# A card's device node: /dev/nvidiaN, N its minor number (character major 195, NVIDIA_MAJOR). /dev/nvidiactl (minor
# 255), /dev/nvidia-modeset (254), /dev/nvidia-uvm and /dev/nvidia-caps/* are not cards.
_CARD_NODE = re.compile(r"^/dev/nvidia(\d{1,3})$")
# A path that holds the card nodes beneath it: --device /dev maps every node in it.
_NODE_DIRS = ("/dev", "/dev/")


def card_node(path: str) -> str | None:
    """Pure: ``/dev/nvidiaN`` when ``path`` names a card's device node (N a card's minor), else None."""
    m = _CARD_NODE.match(path)
    return path if m is not None and int(m.group(1)) in NVIDIA_CARD_MINORS else None


def node_of_rdev(rdev: int) -> str | None:
    """Pure: ``/dev/nvidiaN`` when a device number is a card's (major 195, minor N), else None."""
    major, minor = os.major(rdev), os.minor(rdev)
    return f"/dev/nvidia{minor}" if major == NVIDIA_MAJOR and minor in NVIDIA_CARD_MINORS else None


def gpu_devices_of(inspect: Mapping[str, Any]) -> tuple[str, ...]:
    """GPU ids a container is given: from its DeviceRequests (NVIDIA's, or CDI names), its devices (a card's device
    node ``/dev/nvidiaN`` by the path on the host, the path in the container, or the node's device number the
    observer read, ``DeviceNodes``; a CDI name), ``--privileged`` (``PRIVILEGED``: every card), its device cgroup
    rules with the card nodes it can reach (``device_rules.rule_cards``; ``DEVICE_RULE``: every card), and its
    NVIDIA_VISIBLE_DEVICES env (every value of it: a CDI spec's own ``void`` comes after ours). Ids are returned as
    written (an index, a UUID, a MIG id, ``i:j``, a device node); ``reconciler.plan.claims`` resolves them to slots and
    holds every slot for one it cannot resolve."""
    host_config = inspect.get("HostConfig") or {}
    if host_config.get("Privileged"):
        return (PRIVILEGED,)
    paths = _device_paths(host_config)
    requests = _device_requests(host_config)
    if paths is None or requests is None:
        return ("all",)
    (devices, cdi), (requested, cdi_requested) = paths, requests
    devices.extend(str(n) for n in inspect.get("DeviceNodes") or [])
    ruled = rule_cards(inspect)
    if ruled is None:
        return (DEVICE_RULE,)
    devices.extend(ruled)
    devices.extend(requested)
    for more in (_cdi_gpus([*cdi, *cdi_requested]), _visible_devices(inspect)):
        if more is None:
            return ("all",)
        devices.extend(more)
    return tuple(dict.fromkeys(devices))


# The helpers of gpu_devices_of: each returns None where what it reads gives the container every card.


def _device_paths(host_config: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """The card nodes among a container's devices (by the path on the host or in the container), and the NVIDIA CDI
    names given as devices; None for a device directory that holds every node."""
    nodes: list[str] = []
    cdi: list[str] = []
    for d in host_config.get("Devices") or []:
        if not isinstance(d, Mapping):
            continue
        on_host, in_container = str(d.get("PathOnHost") or ""), str(d.get("PathInContainer") or "")
        if on_host in _NODE_DIRS or in_container in _NODE_DIRS:
            return None
        node = card_node(on_host) or card_node(in_container)
        if node is not None:
            nodes.append(node)
        elif on_host.startswith(CDI_NVIDIA_VENDOR):
            cdi.append(on_host)
    return nodes, cdi


def _device_requests(host_config: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """The GPU ids of a container's GPU DeviceRequests, and the CDI names of its CDI ones; None for a request of
    every GPU (count -1)."""
    ids: list[str] = []
    cdi: list[str] = []
    for req in host_config.get("DeviceRequests") or []:
        if req.get("Driver") == "cdi":
            cdi.extend(str(i) for i in req.get("DeviceIDs") or [])
            continue
        caps = [c for group in (req.get("Capabilities") or []) for c in group]
        if req.get("Driver") not in ("", None, "nvidia") and "gpu" not in caps:
            continue
        given = req.get("DeviceIDs") or []
        if given:
            ids.extend(str(i) for i in given)
        elif req.get("Count") == -1:
            return None
        elif (req.get("Count") or 0) > 0:
            # The NVIDIA runtime hands out the first N GPUs.
            ids.extend(str(i) for i in range(int(req["Count"])))
    return ids, cdi


def _cdi_gpus(names: Iterable[str]) -> list[str] | None:
    """The GPU ids NVIDIA's CDI names give (``nvidia.com/gpu=ID``; any other of its devices as written, which
    resolves to no card); None for ``nvidia.com/gpu=all``."""
    out: list[str] = []
    for name in names:
        if name.startswith(CDI_GPU_PREFIX):
            gpu = name[len(CDI_GPU_PREFIX) :]
            if gpu == "all":
                return None
            out.append(gpu)
        elif name.startswith(CDI_NVIDIA_VENDOR):
            out.append(name)  # resolves to no card: held as every slot
    return out


def _visible_devices(inspect: Mapping[str, Any]) -> list[str] | None:
    """The ids of every NVIDIA_VISIBLE_DEVICES in a container's env; None for ``all``."""
    out: list[str] = []
    for item in (inspect.get("Config") or {}).get("Env") or []:
        key, _, value = item.partition("=")
        if key != "NVIDIA_VISIBLE_DEVICES":
            continue
        value = value.strip()
        if value == "all":
            return None
        if value in ("", "none", "void"):
            continue
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return out


def offload_configured(inspect: Mapping[str, Any]) -> bool:
    """Native KV offload in a container's config: our label, vLLM's offload flags, or offload env."""
    config = inspect.get("Config") or {}
    if (config.get("Labels") or {}).get(LABEL_OFFLOAD) == "true":
        return True
    args = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or []), *(inspect.get("Args") or [])]
    for i, arg in enumerate(args):
        if any(arg == f or arg.startswith(f + "=") for f in OFFLOAD_FLAGS):
            return True
        if arg.startswith("--kv-transfer-config"):
            value = arg if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            if "Offloading" in value:
                return True
    for item in config.get("Env") or []:
        key, _, value = item.partition("=")
        if key.startswith(OFFLOAD_ENV_PREFIX) and value:
            return True
    return False


def parse_container(summary: Mapping[str, Any], inspect: Mapping[str, Any]) -> ContainerView:
    """Pure: a list-API summary (current state) plus an inspect (immutable config) -> ContainerView."""
    names = summary.get("Names") or [inspect.get("Name", "")]
    name = (names[0] if names else "").lstrip("/")
    state = summary.get("State") or (inspect.get("State") or {}).get("Status", "unknown")
    return ContainerView(
        id=summary["Id"],
        name=name,
        state=state,
        image=summary.get("Image") or (inspect.get("Config") or {}).get("Image", ""),
        labels=dict(summary.get("Labels") or (inspect.get("Config") or {}).get("Labels") or {}),
        exit_code=_status_exit_code(summary.get("Status") or ""),
        gpu_devices=gpu_devices_of(inspect),
        offload=offload_configured(inspect),
        inherited=inherited_labels((inspect.get("Config") or {}).get("Labels") or {}, inspect.get("ImageLabels") or {}),
        published_ports=published_ports_of(summary),
    )


def published_ports_of(summary: Mapping[str, Any]) -> tuple[int, ...]:
    """Pure: the host ports the list API says a container publishes (``Ports[].PublicPort``)."""
    out: list[int] = []
    for p in summary.get("Ports") or []:
        if isinstance(p, Mapping) and isinstance(p.get("PublicPort"), int) and p["PublicPort"] not in out:
            out.append(p["PublicPort"])
    return tuple(out)


# Where NVIDIA's container toolkit puts the hook through which Docker registers its "nvidia" device driver at start
# (without an "nvidia" runtime in daemon.json, the engine's /info does not show it).
NVIDIA_HOOK_PATHS = ("/usr/bin/nvidia-container-runtime-hook", "/usr/local/bin/nvidia-container-runtime-hook")


def toolkit_hook_installed() -> bool:
    """Whether NVIDIA's container toolkit hook is installed on this machine (one of ``NVIDIA_HOOK_PATHS``)."""
    return any(os.path.exists(p) for p in NVIDIA_HOOK_PATHS)


def gpu_runtime_of(info: Mapping[str, Any], *, engine: str, hook_installed: bool = False) -> tuple[str, str]:
    """Pure: whether the engine's /info answer shows a way to give a container NVIDIA GPUs by DeviceRequest:
    ("present" | "absent" | "unknown", what it listed). An "nvidia" runtime (``nvidia-ctk runtime configure``), a
    CDI device ``nvidia.com/gpu=...`` (Docker 28's ``DiscoveredDevices``) or the toolkit's hook on a local engine's
    host is present. Podman gives GPUs by CDI specs that its /info does not list: unknown, never absent."""
    runtimes = sorted(str(k) for k in (info.get("Runtimes") or {}))
    devices = [
        str(d.get("ID") or "")
        for d in info.get("DiscoveredDevices") or []
        if isinstance(d, Mapping) and str(d.get("ID") or "").startswith(CDI_GPU_PREFIX)
    ]
    detail = f"runtimes: {', '.join(runtimes) or 'none'}; no CDI device {CDI_GPU_PREFIX}*"
    if any("nvidia" in r for r in runtimes):
        return "present", f"runtimes: {', '.join(runtimes)}"
    if devices:
        return "present", f"CDI devices: {', '.join(devices)}"
    if hook_installed:
        return "present", "nvidia-container-runtime-hook installed"
    if engine == "podman":
        return "unknown", "Podman gives GPUs by CDI specs its /info does not list"
    return "absent", detail


def inherited_labels(labels: Mapping[str, str], image_labels: Mapping[str, str]) -> frozenset[str]:
    """Pure: this tool's label keys whose value the container has from its image (the same key and value)."""
    return frozenset(k for k, v in labels.items() if k.startswith(LABEL_PREFIX) and image_labels.get(k) == v)


class EngineObserver:
    """Reads containers from one engine (``engine``: Docker's Engine API at ``url`` unless another is given, the
    simulation's say). Keeps a cache of the immutable parts of each inspect."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT_S, engine: Engine | None = None):
        self.url = url
        self.timeout = timeout
        self.engine: Engine = engine if engine is not None else DockerEngine(url, timeout=timeout)
        self._kind: str | None = None
        self._writes: Engine | None = None
        self._cache: dict[str, dict[str, Any]] = {}
        self._images: dict[str, dict[str, str]] = {}  # image id -> its labels (an image id's labels never change)
        self._card_majors: list[int] | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_host(cls, host: Any) -> EngineObserver:
        """The observer of a host's engine: ``docker.url``, answering within ``docker.timeout_s``."""
        return cls(host.docker.url, timeout=host.docker.timeout_s)

    def writes(self) -> Engine:
        """The engine to write through (``reconciler.apply.engine_ops``): for Docker's Engine API, the implementation
        of the engine that answers there (Docker's or Podman's, ``reconciler.host.engine.connect``), asked once; any
        other engine (the simulation's) as it is."""
        if self._writes is None:
            self._writes = connect(self.engine) if isinstance(self.engine, DockerEngine) else self.engine
        return self._writes

    def ping(self) -> None:
        """Raise when no engine answers at ``url`` (``EngineDown``, ``EngineSlow``, ``EngineError``)."""
        self.engine.ping()

    def kind(self) -> str:
        """``podman`` or ``docker``, from the engine's version answer (asked once per observer)."""
        if self._kind is None:
            self._kind = engine_kind(self.engine.version())
        return self._kind

    def _inspect(self, cid: str) -> dict[str, Any] | None:
        try:
            full = self.engine.inspect_container(cid)
        except NotFound:
            return None  # removed between list and inspect: simply gone
        keep = {
            "Name": full.get("Name"),
            "Args": full.get("Args"),
            "Config": {k: (full.get("Config") or {}).get(k) for k in ("Env", "Cmd", "Entrypoint", "Labels", "Image")},
            "HostConfig": {k: (full.get("HostConfig") or {}).get(k) for k in _HOST_CONFIG_KEYS},
        }
        nodes = device_nodes((full.get("HostConfig") or {}).get("Devices") or [])
        if nodes:
            keep["DeviceNodes"] = nodes
        if (full.get("HostConfig") or {}).get("DeviceCgroupRules"):
            self._rule_facts(full, keep)
        labels = (full.get("Config") or {}).get("Labels") or {}
        if any(k.startswith(LABEL_PREFIX) for k in labels) and full.get("Image"):
            # A container inherits its image's labels: ours on an image prove nothing about its containers.
            keep["ImageLabels"] = self._image_labels(full["Image"])
        with self._lock:
            self._cache[cid] = keep
        return keep

    def _rule_facts(self, full: Mapping[str, Any], keep: dict[str, Any]) -> None:
        """What ``rule_cards`` reads of a container with device cgroup rules besides its HostConfig: its mounts, its
        capabilities where the engine says them (Podman), the card nodes among its bound paths (by device number),
        and the cards' majors (/proc/devices, read once per observer)."""
        keep["Mounts"] = full.get("Mounts")
        if isinstance(full.get("EffectiveCaps"), list):
            keep["EffectiveCaps"] = full["EffectiveCaps"]
        bound = device_nodes({"PathOnHost": src} for src, _ in bind_pairs(full))
        if bound:
            keep["BoundNodes"] = bound
        if self._card_majors is None:
            self._card_majors = sorted(nvidia_majors(read_proc_devices())[0])
        keep["CardMajors"] = self._card_majors

    def _image_labels(self, image_id: str) -> dict[str, str]:
        with self._lock:
            if image_id in self._images:
                return self._images[image_id]
        try:
            labels = dict((self.engine.inspect_image(image_id).get("Config") or {}).get("Labels") or {})
        except NotFound:
            labels = {}
        with self._lock:
            self._images[image_id] = labels
        return labels

    def read(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(summary, inspect) pairs for every container, running or not."""
        summaries = self.engine.containers()
        missing = [s["Id"] for s in summaries if s["Id"] not in self._cache]
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
                list(pool.map(self._inspect, missing))
        elif missing:
            self._inspect(missing[0])
        live = {s["Id"] for s in summaries}
        with self._lock:
            for cid in list(self._cache):
                if cid not in live:
                    del self._cache[cid]
            return [(s, self._cache[s["Id"]]) for s in summaries if s["Id"] in self._cache]

    def container_ids(self) -> frozenset[str]:
        """The full ids of every container the engine lists, running or not (one list call; raises on failure).

        The set a pid's cgroup is confirmed against (``procfs.innermost_known``): only these are its containers.
        """
        return frozenset(s["Id"] for s in self.engine.containers())

    def images_present(self, images: Iterable[str]) -> tuple[tuple[str, bool], ...]:
        """Whether each image is on the engine, by the engine's own resolution of its name (an inspect each); an
        image the engine could not be asked about is left out (not judged)."""
        out: list[tuple[str, bool]] = []
        for image in dict.fromkeys(images):
            try:
                self.engine.inspect_image(image)
                out.append((image, True))
            except NotFound:
                out.append((image, False))
            except Exception:  # noqa: BLE001 - an engine that does not answer: not judged here
                continue
        return tuple(out)

    def gpu_runtime(self, hook_installed: Callable[[], bool] = toolkit_hook_installed) -> tuple[str, str]:
        """Whether the engine can give NVIDIA GPUs by DeviceRequest (``gpu_runtime_of``); unknown when it does not
        answer. The toolkit's hook (``hook_installed``: this machine's, by default) counts only for an engine on
        this host (a unix socket)."""
        try:
            info = self.engine.info()
            engine = self.kind()
        except Exception as exc:  # noqa: BLE001 - not answered: not judged
            return "unknown", f"the engine's /info did not answer: {_short(exc)}"
        hook = self.url.startswith("unix://") and hook_installed()
        return gpu_runtime_of(info if isinstance(info, Mapping) else {}, engine=engine, hook_installed=hook)

    def observe(self) -> tuple[tuple[ContainerView, ...], Reading]:
        """All containers, or an empty tuple and an unavailable source when the engine does not answer."""
        try:
            pairs = self.read()
        except Exception as exc:  # noqa: BLE001 - any failure to talk to the engine makes the source unavailable
            return (), self.unavailable(exc)
        return parse_all(pairs), Reading("docker", True)

    def unavailable(self, exc: BaseException) -> Reading:
        """The docker source after ``exc``: says whether the engine was slow, down, or answered an error."""
        cause = failure_cause(exc)
        text = _short(exc)
        if cause == "slow" and "too slowly" not in text:
            text = f"{slow_text(self.timeout)}: {text}"  # the SDK's own words for it are a urllib3 repr
        elif cause == "down" and "does not answer" not in text:
            text = f"the engine does not answer: {text}"
        return Reading("docker", False, f"{self.url}: {text}", cause=cause)


# What an inspect's HostConfig gives a container of the cards (kept in the observer's cache).
_HOST_CONFIG_KEYS = (
    "DeviceRequests",
    "Devices",
    "Privileged",
    "DeviceCgroupRules",
    "Binds",
    "Mounts",
    "CapAdd",
    "CapDrop",
)


def device_nodes(devices: Iterable[Any], *, stat: Callable[[str], os.stat_result] = os.stat) -> list[str]:
    """The cards a container's device mappings give it, by the device number of each node on the host (whatever
    its name: ``--device /srv/gpu0:/dev/accel0`` of node 195:0 is ``/dev/nvidia0``). A path that cannot be read
    here is judged by its names alone (``gpu_devices_of``). Read once per container, at its first inspect."""
    out: list[str] = []
    for d in devices:
        path = str((d or {}).get("PathOnHost") or "") if isinstance(d, Mapping) else ""
        if not path.startswith("/"):
            continue
        try:
            st = stat(path)
        except OSError:
            continue
        node = node_of_rdev(st.st_rdev) if stat_mod.S_ISCHR(st.st_mode) else None
        if node is not None and node not in out:
            out.append(node)
    return out


def parse_all(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> tuple[ContainerView, ...]:
    return tuple(parse_container(s, i) for s, i in pairs)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


class EventFilter:
    """Which engine events the loop looks again for: those of containers it cares about.

    A container matters when it carries this host's label (ours, or made by an earlier version of this tool), or
    when its config claims one of this host's GPUs (DeviceRequests, NVIDIA_VISIBLE_DEVICES: "all", an index of a
    slot, any UUID) or native offload: those are the ones a plan reads. Its config is the observer's cached inspect
    (every pass fills it), or one inspect on its first event, which the next pass then reuses. Unknown is
    "matters": an event whose container cannot be looked at (removed already, the engine not answering) wakes
    the loop, as every event did before this filter.

    ``scope()`` gives this host's name and the GPU indexes of its slots as text (None: a slot is known by UUID
    only, so an index cannot be ruled out), or None before a desired state is loaded (then every event matters).
    """

    def __init__(self, observer: EngineObserver, scope: Callable[[], tuple[str, frozenset[str] | None] | None]):
        self.observer = observer
        self.scope = scope
        self._verdicts: dict[str, bool] = {}

    def matters(self, event: Mapping[str, Any]) -> bool:
        actor = event.get("Actor") or {}
        cid = event.get("id") or actor.get("ID") or ""
        action = event.get("status") or event.get("Action") or ""
        scope = self.scope()
        if not cid or scope is None:
            return True
        host, indexes = scope
        if (actor.get("Attributes") or {}).get(LABEL_HOST) == host:
            return True
        verdict = self._verdicts.get(cid)
        if verdict is None:
            inspect = self._config(cid, action)
            verdict = None if inspect is None else container_matters(inspect, host=host, indexes=indexes)
        if action in GONE_ACTIONS:
            self._verdicts.pop(cid, None)
        elif verdict is not None:
            if len(self._verdicts) > 10_000:
                self._verdicts.clear()  # ids of containers removed while no destroy event was seen: forget them
            self._verdicts[cid] = verdict
        return True if verdict is None else verdict

    def _config(self, cid: str, action: str) -> Mapping[str, Any] | None:
        with self.observer._lock:
            inspect = self.observer._cache.get(cid)
        if inspect is None and action not in GONE_ACTIONS:
            try:
                inspect = self.observer._inspect(cid)
            except Exception:  # noqa: BLE001 - the engine did not answer: unknown
                return None
        return inspect


def container_matters(inspect: Mapping[str, Any], *, host: str, indexes: frozenset[str] | None) -> bool:
    """Pure: whether a container's (cached) inspect makes it one a plan reads: this host's label, a claim on one
    of its GPUs (``indexes`` None: on any GPU), or native offload configured."""
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_HOST) == host or offload_configured(inspect):
        return True
    devices = gpu_devices_of(inspect)
    if indexes is None:
        return bool(devices)
    return any(d == "all" or not d.isdigit() or d in indexes for d in devices)
