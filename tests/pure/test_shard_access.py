"""Level: pure.

The mode and owners a shard of a pool or a mixture shows (`shufflefs.pools.access.combine`),
checked the way the kernel checks them (``default_permissions``: owner bits for the owner, group
bits for a member of the group, else others' bits; root passes): for any user in any groups, the
shard lets them do only what every member, and every directory on the way to one, lets them do.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.pools.access import Access, combine, passages

IDS = st.integers(0, 3)
ACCESS = st.builds(Access, st.integers(0, 0o777), IDS, IDS)
USER = st.tuples(st.integers(1, 4), st.frozensets(st.integers(0, 4), max_size=3))


def may(a: Access, uid: int, groups: frozenset[int], bit: int) -> bool:
    if uid == 0:
        return True
    if uid == a.uid:
        bits = a.mode >> 6
    elif a.gid in groups:
        bits = a.mode >> 3
    else:
        bits = a.mode
    return bool(bits & bit)


@given(st.lists(ACCESS, min_size=1, max_size=6), st.lists(ACCESS, max_size=3), st.lists(USER, min_size=1, max_size=8))
@settings(max_examples=400, deadline=None)
def test_a_shard_lets_no_one_do_what_a_member_or_a_directory_on_the_way_does_not(members, dirs, users):
    """Holds: SEMANTICS.md#users-allow-other"""
    shard = combine([*members, *(d.passage() for d in dirs)])
    for uid, groups in users:
        for bit in (4, 2, 1):
            if may(shard, uid, groups, bit):
                assert all(may(m, uid, groups, bit) for m in members), (shard, uid, groups, bit)
                assert all(may(d, uid, groups, 1) for d in dirs), (shard, uid, groups, bit)


@given(st.lists(st.integers(0, 0o777), min_size=1, max_size=6), IDS, IDS, st.lists(USER, min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_members_of_one_owner_and_group_give_exactly_what_all_of_them_allow(modes, uid, gid, users):
    """The usual case loses nothing: a shard of files with one owner and group shows their
    owner and group, and lets a user do exactly what every member lets them."""
    members = [Access(m, uid, gid) for m in modes]
    shard = combine(members)
    assert (shard.uid, shard.gid) == (uid, gid)
    for who, groups in users:
        for bit in (4, 2, 1):
            assert may(shard, who, groups, bit) == all(may(m, who, groups, bit) for m in members)


def test_owners_that_differ_leave_the_shard_to_root_with_what_everyone_may_do():
    alice, bob, data = 1000, 1001, 50
    shard = combine([Access(0o640, alice, data), Access(0o644, bob, data)])
    assert shard == Access(0o040, 0, data)  # the group reads both; others not alice's, the owners not each other's
    assert combine([Access(0o644, alice, data), Access(0o644, bob, 60)]) == Access(0o444, 0, 0)
    assert combine([Access(0o600, 0, 0), Access(0o644, 0, 0)]) == Access(0o600, 0, 0)


def test_the_directories_on_the_way_are_those_below_the_root_that_were_seen():
    dirs = {"a": Access(0o755, 0, 0), "a/b": Access(0o700, 0, 0), "c": Access(0o711, 5, 5)}
    got = passages(["a/b/x.jsonl", "a/y.jsonl", "c/z.jsonl", "top.jsonl", "d/w.jsonl"], dirs)
    assert got == [Access(0o777, 0, 0), Access(0o700, 0, 0), Access(0o777, 5, 5)]
    assert Access(0o750, 1, 2).passage() == Access(0o770, 1, 2)
    assert Access(0o444, 1, 2).listing() == 0o555 and Access(0o440, 1, 2).listing() == 0o550
