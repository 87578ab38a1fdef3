"""The pure half of /proc reading: maps text (captured from real processes) in, records out."""

from __future__ import annotations

import os

import pytest

from reconciler.observe.procfs import (
    FdTarget,
    HolderScan,
    MapRecord,
    dev_token,
    maps_on_dev,
    parse_maps,
    parse_maps_line,
)

TMPFS = os.makedev(0, 41)  # printed "00:29"

# Captured from /proc/PID/maps of a Python process mapping files on a tmpfs (device 0:41) with
# names holding a blank and a newline, one file unlinked after mapping, plus a few lines from other processes
# (a memfd, an anon_inode mapping, a device with a minor above 255, a path that contains the device text).
CAPTURED = b"""\
55ef6ed1c000-55ef6ed1d000 r--p 00000000 fe:00 26723                      /root/.pyenv/versions/3.11.7/bin/python3.11
55ef93536000-55ef936c5000 rw-p 00000000 00:00 0                          [heap]
7f70235e2000-7f70235e4000 rw-s 00000000 00:29 10                         /tmp/r1/shm/gone.mmap (deleted)
7f70235e4000-7f70235e6000 r--p 00000000 fe:00 29775                      /root/.pyenv/versions/3.11.7/lib/python3.11/lib-dynload/mmap.cpython-311-x86_64-linux-gnu.so
7f70236ad000-7f70236af000 rw-s 00000000 00:29 9                          /tmp/r1/shm/vllm_offload_nl\\012x.mmap
7f70236d4000-7f70236d6000 rw-s 00000000 00:29 8                          /tmp/r1/shm/vllm_offload_a b.mmap
7f7023c00000-7f7023cf5000 r--p 00000000 fe:00 26933                      /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f7024325000-7f7024327000 rw-s 00004000 00:29 7                          /tmp/r1/shm/vllm_offload_x.mmap
7f7024330000-7f7024334000 rw-s 00000000 00:01 2051                       /memfd:cuda-ipc (deleted)
7f7024334000-7f7024335000 rw-p 00000000 00:0e 12                         anon_inode:[perf_event]
7f7024335000-7f7024336000 r--p 00000000 00:1a3 77                        /mnt/many-minors/file
7f7024336000-7f7024337000 r--p 00000000 fe:00 88                         /data/odd 00:29 name.bin
7f7024336000-7f7024338000 r-xp 00000000 00:00 0                          [vdso]
7ffcc04d3000-7ffcc04f4000 rw-p 00000000 00:00 0                          [stack]
7ffcc04f4000-7ffcc04f5000 rw-p 000"""


def test_dev_token_is_the_kernels_hex_format() -> None:
    assert dev_token(TMPFS) == b" 00:29 "
    assert dev_token(os.makedev(254, 0)) == b" fe:00 "
    assert dev_token(os.makedev(0, 0x1A3)) == b" 00:1a3 "


def test_parse_line_fields() -> None:
    rec = parse_maps_line(
        b"7f7024325000-7f7024327000 rw-s 00004000 00:29 7                          /tmp/r1/shm/vllm_offload_x.mmap\n"
    )
    assert rec == MapRecord(
        start=0x7F7024325000,
        end=0x7F7024327000,
        perms="rw-s",
        offset=0x4000,
        dev_major=0,
        dev_minor=41,
        inode=7,
        path="/tmp/r1/shm/vllm_offload_x.mmap",
        deleted=False,
    )
    assert rec.dev == TMPFS
    assert rec.length == 0x2000


def test_parse_anonymous_and_special_lines() -> None:
    heap = parse_maps_line(b"55ef93536000-55ef936c5000 rw-p 00000000 00:00 0                          [heap]")
    assert heap is not None and heap.inode == 0 and heap.path == "[heap]" and heap.dev == 0
    bare = parse_maps_line(b"7f7023c00000-7f7023cf5000 rw-p 00000000 00:00 0 ")
    assert bare is not None and bare.path == "" and not bare.deleted


def test_deleted_suffix_and_escaped_newline() -> None:
    recs = {r.inode: r for r in parse_maps(CAPTURED) if r.dev == TMPFS}
    assert recs[10].deleted and recs[10].path == "/tmp/r1/shm/gone.mmap"
    assert recs[9].path == "/tmp/r1/shm/vllm_offload_nl\nx.mmap" and not recs[9].deleted
    assert recs[8].path == "/tmp/r1/shm/vllm_offload_a b.mmap"


def test_truncated_and_garbage_lines_are_not_records() -> None:
    assert parse_maps_line(b"7ffcc04f4000-7ffcc04f5000 rw-p 000") is None
    assert parse_maps_line(b"") is None
    assert parse_maps_line(b"not a maps line at all") is None
    # 15 lines, the last one cut short by a read that raced with the process.
    assert len(parse_maps(CAPTURED)) == 14


def test_device_filter_equals_full_parse() -> None:
    """The fast path (substring search first) finds exactly what parsing every line and filtering finds."""
    for dev in (TMPFS, os.makedev(254, 0), os.makedev(0, 0x1A3), os.makedev(0, 1), os.makedev(0, 0), os.makedev(7, 7)):
        slow = [r for r in parse_maps(CAPTURED) if r.dev == dev]
        assert parse_maps(CAPTURED, dev=dev) == slow, dev


def test_device_text_inside_a_path_is_not_a_match() -> None:
    # "/data/odd 00:29 name.bin" lies on fe:00; the token hit in its path must not make it a tmpfs mapping.
    inodes = [r.inode for r in parse_maps(CAPTURED, dev=TMPFS)]
    assert inodes == [10, 9, 8, 7]
    assert 88 not in inodes


def test_device_filter_on_text_without_the_device() -> None:
    text = b"55ef93536000-55ef936c5000 rw-p 00000000 00:00 0    [heap]\n"
    assert parse_maps(text, dev=TMPFS) == []
    assert parse_maps(b"", dev=TMPFS) == []


def test_minor_above_255_is_matched_exactly() -> None:
    [rec] = parse_maps(CAPTURED, dev=os.makedev(0, 0x1A3))
    assert rec.inode == 77
    # 0:0x1a is a different device whose token " 00:1a " is not a prefix match of " 00:1a3 ".
    assert parse_maps(CAPTURED, dev=os.makedev(0, 0x1A)) == []


def test_hot_path_agrees_with_the_full_parse() -> None:
    """maps_on_dev (what the scan runs) finds the same inodes, and the unlinked ones in full."""
    for dev in (TMPFS, os.makedev(254, 0), os.makedev(0, 0x1A3), os.makedev(0, 1), os.makedev(0, 0), os.makedev(7, 7)):
        full = parse_maps(CAPTURED, dev=dev)
        inodes, unlinked = maps_on_dev(CAPTURED, dev)
        assert inodes == {r.inode for r in full}, dev
        assert unlinked == [r for r in full if r.deleted], dev
    inodes, unlinked = maps_on_dev(CAPTURED, TMPFS)
    assert inodes == {7, 8, 9, 10} and [r.path for r in unlinked] == ["/tmp/r1/shm/gone.mmap"]


def test_hot_path_ignores_device_text_inside_paths() -> None:
    text = (
        b"7f7024336000-7f7024337000 r--p 00000000 fe:00 88     /data/odd 00:29 5 name.bin\n"
        b"7f7024336000-7f7024337000 r--p 00000000 fe:00 89     /data/x 00:29 6 (deleted)\n"
    )
    assert maps_on_dev(text, TMPFS) == (set(), [])


def test_holders_groups_by_inode_mappings_first() -> None:
    scan = HolderScan(dev=TMPFS)
    scan.mapped = {100: {7}, 200: {7}}
    scan.fds = {100: [FdTarget(5, 7, 8192, 8192, 1), FdTarget(6, 7, 8192, 8192, 1)], 300: [FdTarget(3, 9, 0, 0, 1)]}
    assert scan.holders() == {7: [(100, "map"), (200, "map"), (100, "fd")], 9: [(300, "fd")]}


@pytest.mark.parametrize(
    "line",
    [
        b"zzzz-7f7024327000 rw-s 00000000 00:29 7 /x",
        b"7f7024325000-7f7024327000 rw-s 0000000g 00:29 7 /x",
        b"7f7024325000-7f7024327000 rw-s 00000000 00-29 7 /x",
        b"7f7024325000-7f7024327000 rw-s 00000000 00:29 seven /x",
    ],
)
def test_malformed_fields_are_rejected(line: bytes) -> None:
    assert parse_maps_line(line) is None
