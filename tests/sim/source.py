"""The host's git source in the simulation: a real repository, made and committed to with the git CLI, that the
simulated host follows (``source:`` of its host file) through the project's own fetch, export and sync
(``reconciler.load.git_source``, ``reconciler.load.source_sync``): nothing of the source is modelled.

The operator's edits of manifests and recipes go to the repository's work tree and land as commits; the host takes
one when its loop's fetch timer is due (the loop's clock, the world's) or when a second terminal runs
``reconciler sync``. A commit costs one ``git commit``; a fetch, git's own few processes: a run follows a source in a
share of its examples only (``HostMachine.setup``'s draw), which keeps the soak's rate.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_AUTHOR_NAME": "operator",
    "GIT_AUTHOR_EMAIL": "operator@example.invalid",
    "GIT_COMMITTER_NAME": "operator",
    "GIT_COMMITTER_EMAIL": "operator@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "LC_ALL": "C",
}


class SimSource:
    """A git repository whose top holds ``manifests/`` and ``configs/recipes/`` (the source's ``path: .``)."""

    def __init__(self, path: Path):
        self.path = path
        (path / "manifests").mkdir(parents=True)
        (path / "configs" / "recipes").mkdir(parents=True)
        self.commits = 0
        self.synced = -1  # self.commits at the last sync a second terminal ran
        self._git("init", "-q", "-b", "main")

    def _git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", *args],
            cwd=self.path,
            env=_ENV,
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def commit(self, message: str) -> None:
        """Commit the work tree as it is (an edit that changed nothing is a commit all the same: a new hash)."""
        if self.commits == 0:
            self._git("add", "-A")
            self._git("commit", "-q", "--allow-empty", "-m", message)
        else:
            self._git("commit", "-q", "-a", "--allow-empty", "-m", message)
        self.commits += 1

    def differs(self, a: str, b: str) -> bool:
        """Whether commits ``a`` and ``b`` differ in anything the host reads (its manifests and recipes)."""
        done = self._git("diff", "--quiet", a, b, "--", "manifests", "configs/recipes", check=False)
        return done.returncode != 0
