"""The desired state loaded whole: the host file, the recipes and the host's manifest read and cross-checked, every
problem of them all collected and raised together as one ``ConfigError``; nothing is acted on unless the whole
desired state is valid. Errors name the file, the line, the field and the fix.

``load_desired(root)`` is called by every command that plans (the command line, the loop, the service); the
service also calls ``_secret_digests`` for the recipes it checks alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import yaml

from reconciler.base.errors import ConfigError, ConfigProblem
from reconciler.load.admission import admission_problems
from reconciler.load.cross_checks import cross_check, manifests_of_host, offload_placement
from reconciler.load.door_checks import door_problems
from reconciler.load.files import HOST_FILE, MANIFESTS_DIR, RECIPES_DIR, check_root, rel_path
from reconciler.load.git_source import GitError, SourceFiles, source_files
from reconciler.load.host_file import load_host_file
from reconciler.load.recipes import read_recipes
from reconciler.load.secrets import SecretError, digest, keyed_digest, read_env_file, resolve
from reconciler.load.tmpfs import REAL_TMPFS, TmpfsReads
from reconciler.load.toml_source import toml_line
from reconciler.load.yaml_source import validate_yaml
from reconciler.model import DesiredAssignment, DesiredState, HostConfig, Manifest, Recipe
from reconciler.store.digest_key import digest_key
from reconciler.store.source import note_in_use
from reconciler.store.state import StateError


def load_desired(
    root: str | os.PathLike[str],
    *,
    shm_size: int | None = None,
    shm_free: int | None = None,
    commit: str | None = None,
    tmpfs: TmpfsReads = REAL_TMPFS,
) -> DesiredState:
    """Load host, recipes and the host's manifest, and cross-check them. Raises ConfigError with every problem.

    With ``source:`` in the host file the manifests and recipes are those of the source's commit in use (or of
    ``commit``, a candidate the sync checks), read as a root's would be, each problem naming ``COMMIT:FILE``.
    ``shm_size`` and ``shm_free`` stand in for the tmpfs's real figures (tests); ``tmpfs`` is how they are read (the
    host's I/O seams: the simulation's world answers)."""
    r = Path(root)
    check_root(r)
    problems: list[ConfigProblem] = []
    host: HostConfig | None = None
    host_node: yaml.Node | None = None
    try:
        host, host_node = load_host_file(r, tmpfs)
    except ConfigError as exc:
        problems.extend(exc.problems)
    source: SourceFiles | None = None
    if host is not None and host.source is not None:
        try:
            source = source_files(host, commit=commit)  # ConfigError while no commit is in use: nothing else is read
        except (GitError, StateError) as exc:
            raise ConfigError([ConfigProblem(HOST_FILE, None, f"source: {exc}")]) from None
    try:
        desired = _load_files(r, source, host, host_node, problems, shm_size=shm_size, shm_free=shm_free, tmpfs=tmpfs)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError([_named_by_commit(p, source) for p in exc.problems]) from None
    if commit is None:  # the state in use, not a candidate's check: what this process's audit records now carry
        note_in_use(desired.host.name, desired.source_commit)
    return desired


def _named_by_commit(p: ConfigProblem, source: SourceFiles) -> ConfigProblem:
    """A problem of a file the source gave, named as git names it (``COMMIT:PATH/FILE``); the host file's stay."""
    if p.path.startswith((MANIFESTS_DIR, RECIPES_DIR)):
        return ConfigProblem(source.label(p.path), p.line, p.message)
    return p


def _load_files(
    r: Path,
    source: SourceFiles | None,
    host: HostConfig | None,
    host_node: yaml.Node | None,
    problems: list[ConfigProblem],
    *,
    shm_size: int | None,
    shm_free: int | None,
    tmpfs: TmpfsReads = REAL_TMPFS,
) -> DesiredState:
    """The recipes and manifests of ``source``'s tree (or of the root ``r``), cross-checked with the host file."""
    files = source.tree if source is not None else r
    recipes: dict[str, Recipe] = {}
    try:
        recipes = read_recipes(files)
    except ConfigError as exc:
        problems.extend(exc.problems)

    mdir = files / MANIFESTS_DIR
    paths = sorted([*mdir.glob("*.yaml"), *mdir.glob("*.yml")]) if mdir.is_dir() else []
    if source is not None and host is not None:
        # A repository of a fleet holds every host's manifest: this host reads its own, manifests/HOST.yaml.
        paths = [p for p in paths if p.stem == host.name]
    if not paths:
        problems.append(
            ConfigProblem(
                MANIFESTS_DIR,
                None,
                (
                    f"no manifest of host {host.name} in the source: add manifests/{host.name}.yaml"
                    if source is not None and host is not None
                    else "no manifest found: add manifests/<name>.yaml"
                )
                + " with 'host:' and 'assignments:' (an empty list means every GPU slot free)",
            )
        )
    manifests: list[tuple[str, Manifest, yaml.Node | None]] = []
    for path in paths:
        try:
            m, node = validate_yaml(files, path, Manifest, "a manifest")
            manifests.append((rel_path(files, path), m, node))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if host is not None:
        offload_placement(files, host, recipes, problems)
    if host is None or problems:
        raise ConfigError(problems)

    mine = manifests_of_host(host, manifests, problems)
    if problems:
        raise ConfigError(problems)
    manifest_path, manifest, node = mine[0]
    topologies = cross_check(
        manifest_path,
        manifest,
        node,
        host,
        recipes,
        problems,
        shm_size=shm_size,
        shm_free=shm_free,
        host_node=host_node,
        tmpfs=tmpfs,
    )
    problems.extend(door_problems(manifest_path, manifest, node, host, recipes, topologies))
    if problems:
        raise ConfigError(problems)
    if source is not None:  # a commit's recipes ask no more of this host than its host file allows
        used = [a.recipe for lanes in topologies.values() for a in lanes]
        problems.extend(admission_problems(files, host, recipes, used))
        if problems:
            raise ConfigError(problems)  # before any secret is read: a secret it may not take is never resolved
    secret_digests, legacy_digests = _secret_digests(files, host, recipes, problems)
    if problems:
        raise ConfigError(problems)
    running = tuple(topologies[manifest.topology])
    standby = standby_lanes(running, [topologies[n] for n in manifest.standby if n != manifest.topology])
    return DesiredState(
        host=host,
        recipes=recipes,
        assignments=running,
        manifest_path=source.label(manifest_path) if source is not None else manifest_path,
        secret_digests=secret_digests,
        legacy_secret_digests=legacy_digests,
        fallback=manifest.fallback,
        topology=manifest.topology,
        topologies={n: tuple(a) for n, a in topologies.items() if n is not None},
        standby_topologies=tuple(manifest.standby),
        standby=standby,
        source_commit=source.commit if source is not None else None,
        aliases=manifest.alias_targets(),
        demand=manifest.demand,
    )


def standby_lanes(
    running: Sequence[DesiredAssignment], standby: Sequence[Sequence[DesiredAssignment]]
) -> tuple[DesiredAssignment, ...]:
    """The lanes of the standby topologies that the running one does not have, each once, in order."""
    seen = {a.key for a in running}
    out: list[DesiredAssignment] = []
    for lanes in standby:
        for a in lanes:
            if a.key not in seen:
                seen.add(a.key)
                out.append(a)
    return tuple(out)


def _secret_digests(
    root: Path, host: HostConfig, recipes: dict[str, Recipe], problems: list[ConfigProblem]
) -> tuple[dict[str, str], dict[str, str]]:
    """The digest of every ``"${NAME}"`` env value the recipes take, keyed by the install's own key (what may enter a
    label), and its plain sha256 (only to recognise a label of an earlier version: kept in memory, never written); a
    problem (never the value) for each that cannot be resolved, at the recipe line that asks for it."""
    wanted: dict[str, list[tuple[str, str]]] = {}
    for name, recipe in recipes.items():
        for key, var in recipe.container.env_refs().items():
            wanted.setdefault(var, []).append((name, key))
    if not wanted:
        return {}, {}
    env_file = host.secrets.env_file
    if env_file:
        try:
            read_env_file(env_file)
        except SecretError as exc:
            problems.append(ConfigProblem(HOST_FILE, None, f"{exc}"))
            return {}, {}
    out: dict[str, str] = {}
    legacy: dict[str, str] = {}
    mac_key: bytes | None = None
    for var, users in wanted.items():
        try:
            value = resolve(env_file, [var])[var]
        except SecretError as exc:
            for recipe_name, env_key in users:
                path = root / RECIPES_DIR / f"{recipe_name}.toml"
                try:
                    line = toml_line(path.read_text(encoding="utf-8"), ("container", "env", env_key))
                except (OSError, UnicodeDecodeError):
                    line = None
                problems.append(
                    ConfigProblem(
                        rel_path(root, path),
                        line,
                        f"container.env.{env_key}: ${{{var}}} is {exc}. Set it there (the value is never printed)",
                    )
                )
            continue
        if mac_key is None:
            try:
                mac_key = digest_key(host.name)
            except StateError as exc:
                problems.append(ConfigProblem(HOST_FILE, None, f"secrets: the key of their digests: {exc}"))
                return {}, {}
        out[var] = keyed_digest(mac_key, var, value)
        legacy[var] = digest(value)
    return out, legacy
