"""A leave through `reconciler apply` on a real engine drops clean page cache when the host file asks for it
(``page_cache: {drop_after_leave: true}``), and says so in the leave's outcome and the audit trail: the result
(``dropped``, or ``refused`` with the kernel's error where it says no) and Cached before and after."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from e2e_helpers import Root

from reconciler.apply.pagecache import DROP_CACHES

pytestmark = [pytest.mark.docker, pytest.mark.root]


def _host_file(root: Root, **keys: object) -> None:
    path = root.path / "configs" / "host.yaml"
    doc = yaml.safe_load(path.read_text())
    doc.update(keys)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_leave_drops_page_cache_and_reports_it(root: Root) -> None:
    omni = root.recipe("omni")
    root.manifest((omni, ["dark-compute-b"]))
    entered = root.apply()
    assert entered.rc == 0, str(entered)
    assert "page_cache" not in entered.data["actions"][0]  # an enter never drops it

    _host_file(root, page_cache={"drop_after_leave": True})
    with open(root.path / "weights.bin", "wb") as fh:  # clean page cache to drop: 128 MiB written, synced, read
        fh.write(os.urandom(128 << 20))
    os.sync()
    (root.path / "weights.bin").read_bytes()
    root.manifest()
    left = root.apply()
    assert left.rc == 0, str(left)
    (leave,) = [a for a in left.data["actions"] if a["kind"] == "leave"]
    drop = leave["page_cache"]
    assert isinstance(drop["before_bytes"], int) and isinstance(drop["after_bytes"], int)
    if os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK):
        assert drop["result"] == "dropped", drop
        assert drop["before_bytes"] - drop["after_bytes"] >= 100 << 20, drop
        assert "page cache " in leave["detail"]
    else:
        assert drop["result"] == "refused" and DROP_CACHES in drop["error"], drop

    audit = root.cli("audit", "--json")
    assert audit.rc == 0, str(audit)
    entries = audit.data["records"]
    recorded = [a for e in entries for a in e.get("actions") or [] if a.get("kind") == "leave"]
    assert recorded and recorded[-1]["page_cache"] == drop, json.dumps(entries)[-2000:]
