"""Dropping clean page cache after a leave, for real: the cache is filled by reading a file made here, then
``drop_page_cache`` syncs and writes 1 to /proc/sys/vm/drop_caches. Root can on the machines this is built and
tested on; where the kernel refuses (no root, a read-only /proc/sys), the test asserts what the tool reports then,
so it runs (and proves something) on every machine rather than being skipped."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from reconciler.apply import pagecache
from reconciler.apply.pagecache import DROP_CACHES, drop_page_cache, parse_cached_bytes, read_cached_bytes

MIB = 1 << 20


def _fill_cache(path: Path, mib: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(block)
    os.sync()
    with open(path, "rb") as fh:  # written and read: its pages are clean page cache now
        while fh.read(8 * MIB):
            pass


def _kernel_allows() -> bool:
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def test_drop_after_filling_the_cache(tmp_path: Path) -> None:
    big = tmp_path / "weights.bin"  # under /tmp: a disk-backed file (tmpfs pages are not clean cache)
    _fill_cache(big, 256)
    before = read_cached_bytes()
    assert before is not None and before >= 200 * MIB
    drop = drop_page_cache()
    assert drop.before_bytes is not None and drop.after_bytes is not None
    if _kernel_allows():
        assert drop.result == "dropped", drop
        # The 256 MiB just read is clean cache: at least most of it goes.
        assert drop.before_bytes - drop.after_bytes >= 200 * MIB, drop
        assert drop.describe().startswith("page cache ")
    else:
        assert drop.result == "refused" and DROP_CACHES in drop.error, drop
        assert "the kernel refused" in drop.describe()


def test_refused_write_is_reported_not_raised(tmp_path: Path) -> None:
    # A drop_caches the process cannot write (a directory stands in for a read-only /proc/sys).
    drop = drop_page_cache(drop_caches=str(tmp_path))
    assert drop.result == "refused" and "Is a directory" in drop.error
    assert drop.to_json()["result"] == "refused"


def test_never_while_an_enter_waits_for_health(tmp_path: Path) -> None:
    _fill_cache(tmp_path / "weights.bin", 64)
    waiting = threading.Event()
    done = threading.Event()

    def enter() -> None:
        with pagecache.entering():
            waiting.set()
            done.wait(10)

    t = threading.Thread(target=enter)
    t.start()
    try:
        assert waiting.wait(10)
        drop = drop_page_cache()
        assert drop.result == "skipped" and "waiting for health" in drop.error
        assert drop.after_bytes == drop.before_bytes
    finally:
        done.set()
        t.join()
    assert not pagecache.enter_in_progress()


def test_parse_cached() -> None:
    text = "MemTotal:       16384000 kB\nBuffers:          1000 kB\nCached:          9600000 kB\nSwapCached: 0 kB\n"
    assert parse_cached_bytes(text) == 9600000 * 1024
    assert parse_cached_bytes("MemTotal: 1 kB\n") is None
