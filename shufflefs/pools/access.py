"""Who may read a shard of a pool or a mixture: the mode and owners it shows.

A shard holds records of every member, so no one may read it who could not read every member.
The kernel checks each access against the mode and owners the mount shows (every mount has
``default_permissions``): the bits of the file's owner for its owner, else those of its group for
a member of the group, else the bits for others.  `combine` gives the mode and owners under which
that check lets a user through only where it would let them through on every member, whoever the
user is and whatever groups they are in.  The directories on the way to a member count as members
whose every bit is their search bit (`Access.passage`): a file in a directory one may not enter
is one they may not read.  Pure: a few numpy operations over the members' attributes, read where
their versions are.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

ROOT = 0
"""The owner and group of a shard whose members' owners (or groups) differ: root reads anyway."""
RWX = 0o7
_CLASSES = (6, 3, 0)  # the owner's, the group's and others' bits


@dataclass(frozen=True)
class Access:
    """The permission bits (``0o777``) and the owner and group of a file, as the kernel checks them."""

    mode: int
    uid: int
    gid: int

    @classmethod
    def of(cls, st: object) -> "Access":
        return cls(st.st_mode & 0o777, st.st_uid, st.st_gid)  # type: ignore[attr-defined]

    def passage(self) -> "Access":
        """A directory on the way to a member, as a member: all bits for whoever may search it,
        none for whoever may not."""
        return Access(sum(RWX << s for s in _CLASSES if self.mode >> s & 1), self.uid, self.gid)

    def listing(self) -> int:
        """The mode of a directory that holds only shards of this access: listed and entered
        (``r-x``) by whoever may read them."""
        read = self.mode & 0o444
        return read | read >> 2


def combine(members: Sequence[Access]) -> Access:
    """The access of a shard over ``members``: the owner (group) all of them have, else `ROOT`,
    and for each class of user the bits every member grants to everyone that class may hold.

    A user who is not the shard's owner may own a member that it does not own (then the member's
    owner bits apply), and whether a user is in a member's group is known only where that group is
    the shard's: elsewhere both the group's and others' bits must grant it."""
    if not members:
        raise ValueError("a shard has at least one member")
    n = len(members)
    modes = np.fromiter((a.mode for a in members), np.int64, n)
    uids = np.fromiter((a.uid for a in members), np.int64, n)
    gids = np.fromiter((a.gid for a in members), np.int64, n)
    uid = int(uids[0]) if bool(np.all(uids == uids[0])) else ROOT
    gid = int(gids[0]) if bool(np.all(gids == gids[0])) else ROOT
    own, grp, oth = modes >> 6 & RWX, modes >> 3 & RWX, modes & RWX
    same_owner, same_group = uids == uid, gids == gid
    unknown_group = grp & oth  # a user who may or may not be in the member's group
    as_owner = np.where(same_owner, own, unknown_group)
    others_own = np.where(same_owner, RWX, own)  # a user other than the shard's owner may own the member
    as_group = others_own & np.where(same_group, grp, unknown_group)
    as_other = others_own & np.where(same_group, oth, unknown_group)
    bits = [int(np.bitwise_and.reduce(c)) for c in (as_owner, as_group, as_other)]
    return Access(bits[0] << 6 | bits[1] << 3 | bits[2], uid, gid)


def passages(members: Iterable[str], dirs: Mapping[str, Access]) -> list[Access]:
    """The directories on the way to ``members`` (below the mount's root, which every access
    passes anyway) that ``dirs`` knows, as members (`Access.passage`)."""
    seen: set[str] = set()
    for m in members:
        d = posixpath.dirname(m)
        while d and d not in seen:
            seen.add(d)
            d = posixpath.dirname(d)
    return [dirs[d].passage() for d in sorted(seen) if d in dirs]
