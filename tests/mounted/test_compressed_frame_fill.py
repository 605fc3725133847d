"""Level: mounted (real FUSE mounts, real readers).

A zstd file of many frames whose index a later mount finds cached gets its background copy from
its views' own decoding (`stages.frame_fill`): an epoch read through the mount fills the copy
without a second decode of the file (no child process decodes it), a view read only in part
has the rest decoded by a child once its reads stop, and either copy holds exactly the bytes a
mount that never copies serves.  An unmount during the fill, or the file rewritten in place
under it, leaves no copy of the wrong bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import compressed_files as cf
from conftest import children_of
from test_compressed_background_copies import compressed_info, later_mount, read, wait_for_copy

NAME = "frames.jsonl.zst"


def files(seed: int, n: int = 40000) -> dict[str, bytes]:
    return {NAME: cf.zst(cf.jsonl(n, seed=seed), frame=256 << 10)}


def test_an_epoch_read_through_the_mount_fills_the_copy_without_a_second_decode(mount):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    tree = files(21)
    m = later_mount(mount, tree, "--seed", "5")
    needed = mount(tree, "--seed", "5", "--decoded-copies", "needed")
    assert compressed_info(m, NAME)["restart_points"] >= 8
    first = read(m.path(NAME))  # epoch 0, decoded from the frames: each one also goes into the copy
    seen = []
    deadline = time.monotonic() + 1.5  # under frame_fill.IDLE: no child is started before that
    while compressed_info(m, NAME)["read_from"] != "a decoded copy" and time.monotonic() < deadline:
        seen += children_of(m.pid, b"copy_process")
        time.sleep(0.02)
    info = wait_for_copy(m, NAME)
    assert "from its views' decoding" in info["copied_because"], info
    assert not seen, "a child decoded the file again"
    assert first == read(needed.path(NAME))
    for v in (m, needed):
        v.set_epoch(1, NAME)
    got = read(m.path(NAME))  # from the copy
    assert got == read(needed.path(NAME)) and got != first
    assert sorted(cf.lines_of(cf.decode(NAME, got))) == sorted(cf.lines_of(cf.decode(NAME, tree[NAME])))


def test_a_view_read_in_part_has_the_rest_of_its_copy_decoded_by_a_child(mount):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    tree = files(22)
    m = later_mount(mount, tree, "--seed", "6", "--buffer", "2MiB", "-v")
    needed = mount(tree, "--seed", "6", "--buffer", "2MiB", "--decoded-copies", "needed")
    with open(m.path(NAME), "rb") as f:
        f.read(100 << 10)  # a window of 2 MiB and the next: the other frames are left to the child
    info = wait_for_copy(m, NAME)
    assert "from its views' decoding" in info["copied_because"], info
    assert "decoded by a child" in m.stderr()
    for v in (m, needed):
        v.set_epoch(2, NAME)
    assert read(m.path(NAME)) == read(needed.path(NAME))


def test_an_unmount_during_the_fill_leaves_nothing(mount):
    """Holds: SEMANTICS.md#views-compressed-copy"""
    m = later_mount(mount, files(23), "--buffer", "2MiB")
    with open(m.path(NAME), "rb") as f:
        f.read(100 << 10)
    assert "being made" in compressed_info(m, NAME).get("decoded_copy", "")
    m.stop()
    assert m.returncode == 0
    left = list(m.cache.glob(f"decoded-{m.pid}-*"))  # (the first mount, still up, has its own)
    assert not left, left


def test_a_file_rewritten_in_place_during_the_fill_gets_no_copy_of_the_old_bytes(mount):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#changes-new-open"""
    tree = files(24)
    m = later_mount(mount, tree, "--buffer", "2MiB")
    with open(m.path(NAME), "rb") as f:
        f.read(100 << 10)
    new = cf.jsonl(30000, seed=25)
    with open(m.src / NAME, "r+b") as f:  # the same inode, other bytes
        f.write(cf.zst(new, frame=256 << 10))
        f.truncate()
    deadline = time.monotonic() + 30
    while True:
        got = read(m.path(NAME))
        if sorted(cf.lines_of(cf.decode(NAME, got))) == sorted(cf.lines_of(new)):
            break
        assert time.monotonic() < deadline, "new opens never showed the new version"
        time.sleep(0.2)  # the listing's lifetime
    info = wait_for_copy(m, NAME)  # the new version's copy, filled by the read above
    assert info["decoded_bytes"] == len(new)
    m.set_epoch(1, NAME)
    assert sorted(cf.lines_of(cf.decode(NAME, read(m.path(NAME))))) == sorted(cf.lines_of(new))


def test_many_readers_during_the_fill_all_read_the_bytes_of_a_mount_that_never_copies(mount):
    """Eight readers of a view, each with reads of its own odd size, while their decoding fills the
    copy (their frames written and read back by any of them).
    Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#views-order"""
    tree = files(26)
    m = later_mount(mount, tree, "--buffer", "4MiB", "--seed", "8")
    needed = mount(tree, "--buffer", "4MiB", "--seed", "8", "--decoded-copies", "needed")
    want = {e: None for e in (0, 1)}
    for e in want:
        needed.set_epoch(e, NAME)
        want[e] = read(needed.path(NAME))
    got: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            with open(m.path(NAME), "rb") as f:
                parts, size = [], 4096 + 7919 * k
                while chunk := f.read(size):
                    parts.append(chunk)
            got[k] = b"".join(parts)
        except BaseException as e:  # noqa: BLE001 -- reported by the test's thread
            errors.append(e)

    m.set_epoch(0, NAME)
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(got[k] == want[0] for k in range(8))
    wait_for_copy(m, NAME)
    m.set_epoch(1, NAME)
    assert read(m.path(NAME)) == want[1]


def test_a_daemon_killed_during_the_fill_leaves_nothing_the_next_mount_keeps(mount):
    """Holds: SEMANTICS.md#views-compressed-copy, SEMANTICS.md#umount-killed"""
    tree = files(27)
    m = later_mount(mount, tree, "--buffer", "2MiB")
    with open(m.path(NAME), "rb") as f:
        f.read(100 << 10)
    assert list(m.cache.rglob("part-*")), "no copy being filled"
    os.kill(m.pid, signal.SIGKILL)
    m.wait()
    subprocess.run(["fusermount3", "-u", "-z", str(m.mnt)], capture_output=True, timeout=30)
    again = mount(None, "--cache-dir", str(m.cache), "--seed", "9", src=m.src, name="again")
    needed = mount(tree, "--seed", "9", "--decoded-copies", "needed")
    assert read(again.path(NAME)) == read(needed.path(NAME))
    wait_for_copy(again, NAME)
    left = [p for p in m.cache.rglob("part-*") if f"decoded-{m.pid}-" in str(p)]
    assert not left and not [p for p in m.cache.glob(f"decoded-{m.pid}-*")], left
