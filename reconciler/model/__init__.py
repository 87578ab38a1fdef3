"""The declarative model: the host file, recipes and manifests as pydantic types, and the desired state.

This is the package's one facade: it re-exports every public name of its modules, and importers write
``from reconciler.model import X``. The modules: ``rules`` (the rules of single values, as checks and as schema
patterns), ``strict`` (the file models' base), ``host`` (configs/host.yaml), ``recipe`` (configs/recipes/NAME.toml),
``recipe_hash`` (what a recipe's hash covers, across releases), ``probe_spec`` and ``probe_schema`` (a recipe's
probes), ``manifest`` (manifests/NAME.yaml) and ``desired`` (the desired state the planner consumes).

Pure: no I/O beyond what the caller hands in, and no Docker, NVML or metrics imports (checked by a test).
``reconciler.load`` reads the files into these types; the planner consumes ``DesiredState``.
"""

from __future__ import annotations

from reconciler.base.units import GIB
from reconciler.model.desired import (
    DesiredAssignment,
    DesiredState,
    assignment_key,
    container_name,
)
from reconciler.model.host import (
    PID_MAX,
    DockerConfig,
    GpuReserveConfig,
    GpuSlot,
    HostConfig,
    PageCacheConfig,
    SecretsConfig,
    ShmConfig,
)
from reconciler.model.manifest import (
    AssignmentSpec,
    Manifest,
)
from reconciler.model.probe_schema import (
    check_json_schema,
)
from reconciler.model.probe_spec import (
    PROBE_SUITES,
    ProbeSpec,
    ToolSpec,
)
from reconciler.model.recipe import (
    SLEEP_DEV_ENV,
    SLEEP_MODE_FLAG,
    ContainerSpec,
    DrainSpec,
    HealthSpec,
    ModelRef,
    OffloadSpec,
    Recipe,
    RecipeReserve,
    SleepSpec,
    StopSpec,
    offload_lands_in,
)
from reconciler.model.rules import (
    DOCKER_URL_PATTERN,
    DOCKER_URL_SCHEMES,
    ENV_NAME_PATTERN,
    ENV_REF,
    ENV_VALUE_PATTERN,
    GPU_UUID_PATTERN,
    IMAGE_PATTERN,
    IPC_MODES,
    IPC_PATTERN,
    LOOPBACK_URL_PATTERN,
    NAME_PATTERN,
    NAME_RE,
    NETWORK_MODES,
    NETWORK_PATTERN,
    SHM_DIR_PATTERN,
    SHM_PATTERN_DEFAULT,
    SHM_PATTERN_PATTERN,
    SHM_SIZE_PATTERN,
    USER_PATTERN,
    VOLUME_PATTERN,
    check_docker_url,
    check_env_name,
    check_env_ref,
    check_gpu_uuid,
    check_health_url,
    check_image_ref,
    check_ipc_mode,
    check_name,
    check_network_mode,
    check_probe_url,
    check_shm_dir,
    check_shm_pattern,
    check_shm_size,
    check_text,
    check_user,
    check_volume,
)
from reconciler.model.source import SourceConfig
from reconciler.model.strict import (
    DAY_S,
)

__all__ = [
    "DAY_S",
    "DOCKER_URL_PATTERN",
    "DOCKER_URL_SCHEMES",
    "ENV_NAME_PATTERN",
    "ENV_REF",
    "ENV_VALUE_PATTERN",
    "GIB",
    "GPU_UUID_PATTERN",
    "IMAGE_PATTERN",
    "IPC_MODES",
    "IPC_PATTERN",
    "LOOPBACK_URL_PATTERN",
    "NAME_PATTERN",
    "NAME_RE",
    "NETWORK_MODES",
    "NETWORK_PATTERN",
    "PID_MAX",
    "PROBE_SUITES",
    "SHM_DIR_PATTERN",
    "SHM_PATTERN_DEFAULT",
    "SHM_PATTERN_PATTERN",
    "SHM_SIZE_PATTERN",
    "SLEEP_DEV_ENV",
    "SLEEP_MODE_FLAG",
    "USER_PATTERN",
    "VOLUME_PATTERN",
    "AssignmentSpec",
    "ContainerSpec",
    "DesiredAssignment",
    "DesiredState",
    "DockerConfig",
    "DrainSpec",
    "GpuReserveConfig",
    "GpuSlot",
    "HealthSpec",
    "HostConfig",
    "Manifest",
    "ModelRef",
    "OffloadSpec",
    "PageCacheConfig",
    "ProbeSpec",
    "Recipe",
    "RecipeReserve",
    "SecretsConfig",
    "ShmConfig",
    "SleepSpec",
    "SourceConfig",
    "StopSpec",
    "ToolSpec",
    "assignment_key",
    "check_docker_url",
    "check_env_name",
    "check_env_ref",
    "check_gpu_uuid",
    "check_health_url",
    "check_image_ref",
    "check_ipc_mode",
    "check_json_schema",
    "check_name",
    "check_network_mode",
    "check_probe_url",
    "check_shm_dir",
    "check_shm_pattern",
    "check_shm_size",
    "check_text",
    "check_user",
    "check_volume",
    "container_name",
    "offload_lands_in",
]
