"""What ``reconciler init`` reads of the machine before it writes a root: the NVIDIA cards (NVML), whether this is
WSL2, the container engines that answer, and the tmpfs of ``/dev/shm``. Read-only; each source is a read and a pure
parse (``parse_wsl``), and a source that cannot be read is said so, never guessed.

Called by the service's ``init_root``; the host file written from it is ``reconciler.load.init_files``'.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from reconciler.base.mounts import mount_holding, parse_mountinfo, read_mountinfo
from reconciler.host.engine.http import EngineClient
from reconciler.observe.gpu import nvml_error, nvml_text

# Where engines listen when nothing says otherwise: Docker's socket, then Podman's rootful one.
ENGINE_SOCKETS = ("unix:///var/run/docker.sock", "unix:///run/podman/podman.sock")


@dataclass(frozen=True)
class Card:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    used_bytes: int  # in use when read (on WSL2: what Windows and its desktop hold, which NVML lists no process of)


@dataclass(frozen=True)
class Engine:
    url: str
    name: str  # "Docker Engine" or "Podman Engine"
    version: str
    why: str  # how it was found: "$DOCKER_HOST", "the default socket"


@dataclass(frozen=True)
class Machine:
    cards: tuple[Card, ...] = ()
    nvml: str = ""  # "" when NVML answered; else why there are no cards from it
    driver: str = ""
    wsl2: bool = False
    wsl_why: str = ""
    engines: tuple[Engine, ...] = ()
    engines_tried: tuple[str, ...] = ()  # "URL: why not" for each that did not answer
    shm_dir: str = "/dev/shm"
    shm_bytes: int | None = None
    shm_fs: str = ""
    notes: tuple[str, ...] = field(default=())


def parse_wsl(osrelease: str, environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether the kernel is WSL2's (its release names Microsoft's WSL2 kernel), and what said so."""
    text = osrelease.strip()
    if "microsoft" in text.lower() and "wsl2" in text.lower():
        return True, f"the kernel release is {text!r}"
    if "microsoft" in text.lower() and environ.get("WSL_DISTRO_NAME"):
        return True, f"the kernel release is {text!r} and WSL_DISTRO_NAME is set"
    return False, ""


def read_cards() -> tuple[tuple[Card, ...], str, str]:
    """Every NVIDIA card NVML lists, with its index, UUID, name and memory; ((), why, "") when NVML cannot say."""
    try:
        import pynvml  # optional SDK: a host without NVIDIA GPUs has none
    except ImportError:
        return (), "the nvidia-ml-py package is not installed", ""
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_* or OSError from the C loader: no NVIDIA driver here
        return (), f"NVML did not start ({nvml_error(exc)}): no NVIDIA driver on this machine", ""
    try:
        driver = nvml_text(pynvml.nvmlSystemGetDriverVersion())
        cards = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            cards.append(
                Card(
                    index=i,
                    uuid=nvml_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=nvml_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(memory.total),
                    used_bytes=int(memory.used),
                )
            )
        return tuple(cards), "", driver
    except Exception as exc:  # noqa: BLE001 - a card that does not answer: say so, write nothing guessed
        return (), f"NVML failed while listing the cards ({nvml_error(exc)})", ""
    finally:
        with contextlib.suppress(Exception):  # what was read stands
            pynvml.nvmlShutdown()


def read_engines(environ: Mapping[str, str]) -> tuple[tuple[Engine, ...], tuple[str, ...]]:
    """The engines that answer GET /version: $DOCKER_HOST's first, then the default sockets."""
    candidates: list[tuple[str, str]] = []
    if environ.get("DOCKER_HOST"):
        candidates.append((environ["DOCKER_HOST"], "$DOCKER_HOST"))
    candidates += [(url, "the default socket") for url in ENGINE_SOCKETS if url != environ.get("DOCKER_HOST")]
    found: list[Engine] = []
    tried: list[str] = []
    for url, why in candidates:
        client = EngineClient.for_url(url, timeout=3.0)
        if client is None:
            tried.append(f"{url}: not a unix:// or tcp:// address")
            continue
        try:
            version = client.version()
        except Exception as exc:  # noqa: BLE001 - an engine that does not answer is only not found
            tried.append(f"{url}: {type(exc).__name__}: {exc}")
            continue
        finally:
            client.close()
        components = [str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict)]
        name = "Podman Engine" if any("podman" in c.lower() for c in components) else "Docker Engine"
        found.append(Engine(url=url, name=name, version=str(version.get("Version", "?")), why=why))
    return tuple(found), tuple(tried)


def read_machine(environ: Mapping[str, str] | None = None, *, proc_root: str = "/proc") -> Machine:
    env = os.environ if environ is None else environ
    cards, nvml, driver = read_cards()
    try:
        with open(f"{proc_root}/sys/kernel/osrelease", encoding="utf-8") as fh:
            osrelease = fh.read()
    except OSError:
        osrelease = ""
    wsl2, wsl_why = parse_wsl(osrelease, env)
    engines, tried = read_engines(env)
    shm_bytes: int | None
    try:
        st = os.statvfs("/dev/shm")
        shm_bytes = st.f_blocks * st.f_frsize
    except OSError:
        shm_bytes = None
    return Machine(
        cards=cards,
        nvml=nvml,
        driver=driver,
        wsl2=wsl2,
        wsl_why=wsl_why,
        engines=engines,
        engines_tried=tried,
        shm_bytes=shm_bytes,
        shm_fs=_fs_type("/dev/shm"),
    )


def _fs_type(path: str) -> str:
    try:
        return mount_holding(path, parse_mountinfo(read_mountinfo())).fstype
    except (OSError, ValueError):
        return ""
