"""A local user against the operator's root, for real: a root, a directory of it or a recipe that uid 65534 owns or
can write, or a symlink it made on the way, would let that user choose the images and mounts root's engine runs (a
recipe that bind-mounts a root-only directory into a lane). The real command line, run as root, refuses each before
it reads anything from it (exit 1, the path named, the fix), as sshd's StrictModes refuses a ``~/.ssh`` anyone can
write; a root of root's own under a sticky directory such as /tmp is accepted.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from e2e_helpers import Root

from attack.helpers import NOBODY, Attacker, no_traceback

pytestmark = [pytest.mark.docker, pytest.mark.root]

B = "dark-compute-b"
FIX = "chown root:root"


def reachable(root: Root, scratch: Path) -> Root:
    """The test's root copied where the unprivileged user can reach it (``scratch``, 0755 under /tmp)."""
    dest = scratch / "root"
    shutil.copytree(root.path, dest, symlinks=True)
    return dataclasses.replace(root, path=dest)


def planted_recipe(precious: Path) -> str:
    """What the attacker writes: a lane that bind-mounts root's private directory, and a line that does not parse
    (had the file been read, validate would quote the syntax error)."""
    return (
        'tensor_parallel_size = 1\n[model]\nid = "x"\n[container]\nimage = "reconciler/fake-vllm:latest"\n'
        f'command = ["sleep", "1"]\nvolumes = ["{precious.parent}:/loot"]\nthis is not TOML\n'
    )


def refused(r: Root, path: Path, *, what: str) -> None:
    """Every command that reads the root exits 1 naming ``path`` and the fix, quoting nothing it would have read."""
    for args in (("validate",), ("plan",), ("validate", "--json"), ("plan", "--json"), ("status",)):
        res = r.cli(*args, env={"RECONCILER_NO_LOOP": "1"})
        assert res.rc == 1, res
        out = res.stdout + res.stderr
        no_traceback(out)
        assert f"refusing {what}" in out and str(path) in out and FIX in out and "chmod go-w" in out, res
        assert "TOML syntax error" not in out and "unknown recipe" not in out, f"the root was read: {res}"


def test_a_root_of_roots_own_under_tmp_is_accepted(root: Root, scratch: Path) -> None:
    name = root.recipe("omni")
    root.manifest((name, [B]))
    r = reachable(root, scratch)
    res = r.cli("validate", "--json")
    assert res.rc == 0 and res.data["valid"] is True, res


def test_a_root_owned_by_nobody_is_refused_before_anything_is_read(
    root: Root, attacker: Attacker, scratch: Path, precious: Path
) -> None:
    name = root.recipe("omni")
    root.manifest((name, [B]))
    r = reachable(root, scratch)
    for dirpath, _dirs, files in os.walk(r.path):
        os.chown(dirpath, NOBODY, NOBODY)
        for f in files:
            os.chown(os.path.join(dirpath, f), NOBODY, NOBODY)
    # The unprivileged user writes into the root it owns: a recipe of its own, and the manifest assigning it.
    attacker.python(
        "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        str(r.path / "configs/recipes/loot.toml"),
        planted_recipe(precious),
        check=True,
    )
    attacker.python(
        "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
        str(r.manifest_path),
        f"host: {r.host}\nassignments:\n  - {{recipe: loot, gpus: [{B}]}}\n  - {{recipe: nothing-of-this-name}}\n",
        check=True,
    )
    refused(r, r.path, what="--root")
    res = r.cli("plan", "--json", env={"RECONCILER_NO_LOOP": "1"})
    assert "is owned by uid 65534" in res.stdout, res
    assert not r.containers(), "nothing was created"


@pytest.mark.parametrize("where", ["configs", "configs/recipes", "manifests"])
def test_a_directory_of_the_root_that_others_can_write_is_refused(root: Root, scratch: Path, where: str) -> None:
    name = root.recipe("omni")
    root.manifest((name, [B]))
    r = reachable(root, scratch)
    (r.path / where).chmod(0o777)
    (r.path / "configs/recipes/extra.toml").write_text("this is not TOML\n")
    refused(r, r.path / where, what="the")


def test_a_recipe_or_manifest_of_nobodys_is_refused(root: Root, attacker: Attacker, scratch: Path) -> None:
    name = root.recipe("omni")
    root.manifest((name, [B]))
    r = reachable(root, scratch)
    recipe = r.path / "configs/recipes" / f"{name}.toml"
    os.chown(recipe, NOBODY, NOBODY)
    attacker.python(
        "import sys; open(sys.argv[1], 'a').write(sys.argv[2])", str(recipe), "\nthis is not TOML\n", check=True
    )
    refused(r, recipe, what="a recipe")
    os.chown(recipe, 0, 0)
    recipe.chmod(0o666)  # root's, but anyone may write it
    refused(r, recipe, what="a recipe")
    recipe.chmod(0o644)
    r.manifest_path.chmod(0o646)
    res = r.cli("validate")
    assert res.rc == 1 and f"refusing a manifest {r.manifest_path}" in res.stderr and FIX in res.stderr, res


def test_a_symlink_of_nobodys_on_the_way_is_refused(
    root: Root, attacker: Attacker, scratch: Path, public: Path
) -> None:
    name = root.recipe("omni")
    root.manifest((name, [B]))
    r = reachable(root, scratch)
    # The root reached through a link the unprivileged user made in a sticky directory: it could point it anywhere.
    link = public / "root"
    attacker.run("ln", "-s", str(r.path), str(link), check=True)
    via = dataclasses.replace(r, path=link)
    res = via.cli("validate")
    assert res.rc == 1 and f"{link} is a symlink made by uid 65534" in res.stderr and "chown -h" in res.stderr, res
    no_traceback(res.stderr)
    # A recipe that is root's link to a file in a directory of nobody's: the file could be swapped under it.
    theirs = scratch / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    target = theirs / "lane.toml"
    shutil.copyfile(r.path / "configs/recipes" / f"{name}.toml", target)
    (r.path / "configs/recipes/lane.toml").symlink_to(target)
    res = r.cli("validate")
    assert res.rc == 1 and f"{theirs} is owned by uid 65534" in res.stderr and FIX in res.stderr, res
