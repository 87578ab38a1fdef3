"""The ``error.code`` of a JSON error answer made from an exception (``{"error": {"code", "message"}}`` on stdout
with ``--json``): the code each class states (``code``), read by the same function the command line's JSON
writer calls (``reconciler.cli.common.error_code``). The golden (tests/data/golden/errors/codes.json) maps every
ReconcilerError subclass, found by walking ``__subclasses__()`` from the root class (so the classes may live in any
module), to its code, keyed by class name alone: a class renamed, added or removed, or a code derived differently,
fails. ``GOLDEN_UPDATE=1 pytest tests/contract`` records a change made on purpose.
"""

from __future__ import annotations

import importlib
import pkgutil

import reconciler
from contract.golden import check_json
from reconciler.base.errors import ReconcilerError
from reconciler.cli.common import error_code


def _import_everything() -> None:
    """Every module of the package imported (but ``python -m reconciler``'s), so that a subclass defined anywhere in it is known to Python."""
    for mod in pkgutil.walk_packages(reconciler.__path__, "reconciler."):
        if not mod.name.endswith(".__main__"):  # that one runs the command line
            importlib.import_module(mod.name)


def subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *subclasses(sub)}
    return out


def test_every_error_class_has_its_code() -> None:
    _import_everything()
    found = {ReconcilerError, *subclasses(ReconcilerError)}
    # An instance made without its own __init__ (their arguments differ): the code depends on the class alone.
    codes = {cls.__name__: error_code(cls.__new__(cls)) for cls in found}
    assert len(codes) == len(found), "two error classes share a name: the code of one would be the other's"
    assert codes["ReconcilerError"] == "error" and "ConfigError" in codes, codes
    check_json("errors/codes.json", codes)


def test_every_error_class_states_its_code_itself() -> None:
    """The code is written in the class, never derived from its name: a class renamed or moved keeps its code, and a
    new class must choose one (an inherited code would answer as its parent's kind)."""
    _import_everything()
    unstated = sorted(cls.__name__ for cls in subclasses(ReconcilerError) if "code" not in vars(cls))
    assert unstated == [], f"error classes without a code of their own: {unstated}"
    codes = [vars(cls)["code"] for cls in {ReconcilerError, *subclasses(ReconcilerError)}]
    assert len(codes) == len(set(codes)), f"two error classes share a code: {sorted(codes)}"
