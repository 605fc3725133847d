"""Partial local shuffling (PLS, "Why Globally Re-shuffle?", §III, Algorithm 1).

Each of W ranks holds a partition of the records; before every epoch a fraction Q of every
rank's records moves to other ranks, every rank sending and receiving the same number, and each
rank then shuffles its partition locally (that local shuffle is the plan's business, not this
module's).  Q = 0 is pure local shuffling, Q = 1 exchanges everything.

The exchange is described by *slots*: rank s has m_s slots, and at epoch 0 slot (s, j) holds
the j-th record of the rank's units (``unit_order[lo:hi]`` with ``(lo, hi) = share(U, s, W)``,
source order inside a unit).  At epoch t >= 1 a keyed permutation rho_{t,s} of [0, m_s) picks
the slots whose index i = rho_{t,s}(j) is below q; exchanged slot (r, j) with index i receives
what slot (s, rho_{t,s}^-1(i)) held at epoch t-1, s = (r - o_{t,i}) mod W with an offset
o_{t,i} in [1, W).  For a fixed i the offset shifts every rank by the same amount, so each
sender has exactly one receiver and never itself.

Every rank computes the same assignment from the seed without communication, and a slot's
record is found by walking it back epoch by epoch: a rank's partition costs O(m_r * epochs),
the state is O(units + ranks), never O(records).
"""

from __future__ import annotations

import math

import numpy as np

from .base import rng
from .units import I64, frozen, id_dtype, salt, share

KEYS = salt("exchange/keys")
OFFSETS = salt("exchange/offsets")

U64 = np.uint64
ROUNDS = 6
CHUNK = 1 << 15
_GOLDEN = U64(0x9E3779B97F4A7C15)
_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)


def _mix(z: np.ndarray, tmp: np.ndarray | None = None) -> np.ndarray:
    """splitmix64's finaliser (a bijection of uint64), in place; ``tmp`` is scratch like ``z``."""
    if tmp is None:
        tmp = np.empty_like(z)
    for shift, mul in ((30, _M1), (27, _M2)):
        np.right_shift(z, U64(shift), out=tmp)
        z ^= tmp
        z *= mul
    np.right_shift(z, U64(31), out=tmp)
    z ^= tmp
    return z


def _as_u64(key: np.ndarray | int) -> np.ndarray:
    """64-bit keys as uint64, negative ones taken modulo 2**64."""
    if isinstance(key, (int, np.integer)):
        return np.asarray(int(key) & 0xFFFF_FFFF_FFFF_FFFF, dtype=U64)
    return np.asarray(key).astype(U64)


def round_keys(key: np.ndarray | int) -> np.ndarray:
    """The Feistel round keys of 64-bit ``key`` (uint64[ROUNDS, *shape of key])."""
    k = _as_u64(key)
    r = np.arange(1, ROUNDS + 1, dtype=U64).reshape((ROUNDS,) + (1,) * k.ndim)
    return _mix(k + r * _GOLDEN)


def half_bits(size: np.ndarray | int) -> np.ndarray:
    """Bits of each Feistel half for a domain of ``size`` values: the smallest h >= 1 with
    4**h >= size (uint64, same shape as ``size``)."""
    m1 = np.maximum(np.asarray(size, dtype=I64) - 1, 0)
    b = np.frexp(m1.astype(np.float64))[1].astype(I64)  # bit length, at most one too large
    b -= (b > 0) & ((m1 >> np.maximum(b - 1, 0)) == 0)
    return np.maximum((b + 1) // 2, 1).astype(U64)


def _feistel(x: np.ndarray, half: np.ndarray, rk: np.ndarray, inverse: bool) -> np.ndarray:
    """One pass of the balanced Feistel network over [0, 4**half) (no cycle walking).

    ``half`` is a scalar or one per value, ``rk`` uint64[ROUNDS] or uint64[ROUNDS, len(x)].
    Works a cache-sized chunk at a time with in-place arithmetic.
    """
    out = np.empty(len(x), U64)
    for lo in range(0, len(x), CHUNK):
        sl = slice(lo, lo + CHUNK)
        h = half if half.ndim == 0 else half[sl]
        k = rk if rk.ndim == 1 else rk[:, sl]
        mask = (U64(1) << h) - U64(1)
        left, right = x[sl] >> h, x[sl] & mask
        f, tmp = np.empty_like(left), np.empty_like(left)
        for r in (range(ROUNDS - 1, -1, -1) if inverse else range(ROUNDS)):
            if inverse:  # (L, R) <- (R ^ F(L), L)
                np.bitwise_xor(left, k[r], out=f)
                _mix(f, tmp)
                f &= mask
                f ^= right
                left, right, f = f, left, right
            else:        # (L, R) <- (R, L ^ F(R))
                np.bitwise_xor(right, k[r], out=f)
                _mix(f, tmp)
                f &= mask
                f ^= left
                left, right, f = right, f, left
        np.left_shift(left, h, out=out[sl])
        out[sl] |= right
    return out


def _permute(x: np.ndarray, size: np.ndarray, half: np.ndarray, rk: np.ndarray,
             inverse: bool) -> np.ndarray:
    """Cycle-walking Feistel: re-apply the network to the values that leave [0, size).

    ``size`` and ``half`` are scalars (0-d) or one per value; ``rk`` is uint64[ROUNDS] or
    uint64[ROUNDS, len(x)].  Walking from a value inside the domain always comes back inside it,
    after fewer than 4 passes on average.
    """
    size, half = np.asarray(size), np.asarray(half)
    out = _feistel(np.asarray(x).astype(U64), half, rk, inverse)
    bad = np.flatnonzero(out >= size.astype(U64))
    while bad.size:
        s = size if size.ndim == 0 else size[bad]
        y = _feistel(out[bad], half if half.ndim == 0 else half[bad],
                     rk if rk.ndim == 1 else rk[:, bad], inverse)
        out[bad] = y
        bad = bad[y >= s.astype(U64)]
    return out.astype(I64)


def keyed_permutation(x: np.ndarray, size: np.ndarray | int, key: np.ndarray | int,
                      inverse: bool = False) -> np.ndarray:
    """Image of ``x`` under a keyed permutation of ``[0, size)`` (int64, shape of ``x``).

    ``size`` and ``key`` may be one per value of ``x``, so values of different domains and keys
    are evaluated in one vectorised call; each value costs O(1), so any slot of a huge domain is
    found without materialising the permutation.  A Feistel network of ROUNDS rounds over the
    smallest 4**h >= size, with a splitmix64 round function keyed by ``key`` and the round
    number, made to fit the domain by cycle walking.  A keyed bijection with good statistical
    mixing, not a cryptographic one.  ``inverse=True`` gives the inverse permutation.
    """
    x = np.asarray(x, dtype=I64)
    size_a = np.asarray(size, dtype=I64)
    key_a = _as_u64(key)
    shape = np.broadcast_shapes(x.shape, size_a.shape, key_a.shape)
    if shape != x.shape:
        raise ValueError(f"size and key must be scalars or shaped like x {x.shape}")
    if x.size and ((x < 0).any() or (x >= size_a).any()):
        raise ValueError("every x must lie in [0, size)")
    flat = x.ravel()
    size_f = size_a if size_a.ndim == 0 else np.broadcast_to(size_a, shape).ravel()
    key_f = key_a if key_a.ndim == 0 else np.broadcast_to(key_a, shape).ravel()
    return _permute(flat, size_f, half_bits(size_f), round_keys(key_f), inverse).reshape(shape)


class Exchange:
    """The PLS assignment of records to ranks' slots, epoch by epoch.

    ``firsts`` (int64[U+1]) is the first record id of every unit, then n; ``unit_order``
    (int64[U]) is the units' order shared by all ranks, whose contiguous `share` pieces are the
    ranks' epoch-0 partitions.  State is O(U + W): the cumulative record counts along
    ``unit_order`` locate any slot's epoch-0 record in O(log U).
    """

    def __init__(self, firsts: np.ndarray, unit_order: np.ndarray, world: int, fraction: float,
                 seed: int):
        if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or world < 1:
            raise ValueError(f"world must be a positive integer, got {world!r}")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.integer, np.floating)) \
                or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"the exchanged fraction must be in [0, 1], got {fraction!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        firsts = np.asarray(firsts, dtype=I64)
        order = np.asarray(unit_order, dtype=I64)
        if firsts.ndim != 1 or len(firsts) == 0 or firsts[0] != 0 or (np.diff(firsts) < 0).any():
            raise ValueError("firsts must be a non-decreasing int64[units+1] starting at 0")
        n_units = len(firsts) - 1
        if order.shape != (n_units,) or (n_units and (
                order.min() < 0 or order.max() >= n_units
                or np.bincount(order, minlength=n_units).max() != 1)):
            raise ValueError(f"unit_order must be a permutation of the {n_units} units")
        self.world, self.fraction, self.seed = int(world), float(fraction), int(seed)
        self.n = int(firsts[-1])
        self.firsts = frozen(firsts.copy())
        self.unit_order = frozen(order.copy())
        self.cum = frozen(np.concatenate(([0], np.cumsum(np.diff(firsts)[order]))).astype(I64))
        edges = np.array([share(n_units, s, self.world)[0] for s in range(self.world)] + [n_units], I64)
        self.starts = frozen(self.cum[edges])
        """Global slot number of every rank's slot 0, then n (int64[W+1])."""
        self.sizes = frozen(np.diff(self.starts))
        """Slots of every rank, m_s (int64[W]); the same every epoch."""
        self.q = 0 if self.world == 1 else math.floor(self.fraction * int(self.sizes.min()))
        """Records every rank sends, and receives, before each epoch >= 1."""
        self._half = frozen(half_bits(self.sizes))

    # -- randomness, identical on every rank ------------------------------------------------

    def keys(self, epoch: int) -> np.ndarray:
        """The 64-bit key of every rank's slot permutation rho_{epoch,s} (uint64[W])."""
        return rng(self.seed, epoch, KEYS).integers(0, 2**64, size=self.world, dtype=U64)

    def offsets(self, epoch: int) -> np.ndarray:
        """o_{epoch,i} in [1, W) for every exchange index i < q (int64[q])."""
        if self.q == 0:
            return np.zeros(0, I64)
        return rng(self.seed, epoch, OFFSETS).integers(1, self.world, size=self.q, dtype=I64)

    # -- slots ------------------------------------------------------------------------------

    def _rho(self, x: np.ndarray, rank: int | np.ndarray, rk: np.ndarray,
             inverse: bool = False) -> np.ndarray:
        """rho_{t,rank}(x), ``rank`` one for all x or one per x, with ``rk`` the round keys of
        all ranks at epoch t (uint64[ROUNDS, W])."""
        return _permute(x, self.sizes[rank], self._half[rank], rk[:, rank], inverse)

    def _walk(self, rank: int | np.ndarray, pos: np.ndarray,
              epoch: int) -> tuple[int | np.ndarray, np.ndarray]:
        """The epoch-0 slots whose records slots (rank, pos) hold at ``epoch`` (pos is updated)."""
        for t in range(epoch, 0, -1):
            if self.q == 0 or len(pos) == 0:
                break
            rk = round_keys(self.keys(t))
            i = self._rho(pos, rank, rk)
            moved = np.flatnonzero(i < self.q)
            if moved.size == 0:
                continue
            if not isinstance(rank, np.ndarray):
                rank = np.full(len(pos), rank, I64)
            i = i[moved]
            src = rank[moved] - self.offsets(t)[i]
            src %= self.world
            rank[moved] = src
            pos[moved] = self._rho(i, src, rk, inverse=True)
        return rank, pos

    def _records(self, rank: int | np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Record ids the epoch-0 slots (rank, pos) hold, O(log U) each."""
        g = self.starts[rank] + pos
        k = np.searchsorted(self.cum, g, side="right") - 1
        out = self.firsts[self.unit_order[k]] + (g - self.cum[k])
        return out.astype(id_dtype(self.n), copy=False)

    def _check(self, rank: int, epoch: int) -> None:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside world size {self.world}")
        if epoch < 0:
            raise ValueError("epoch must be >= 0")

    def exchanged_slots(self, rank: int, epoch: int) -> np.ndarray:
        """The rank's slots that receive a record from another rank before ``epoch``, by
        exchange index (int64[q]; empty at epoch 0).  O(q)."""
        self._check(rank, epoch)
        if epoch == 0 or self.q == 0:
            return np.zeros(0, I64)
        return self._rho(np.arange(self.q, dtype=I64), rank, round_keys(self.keys(epoch)), inverse=True)

    def partition(self, rank: int, epoch: int, previous: np.ndarray | None = None) -> np.ndarray:
        """The rank's record ids at ``epoch`` in slot order (`id_dtype`), before any local shuffle.

        From scratch it walks every slot back to epoch 0: O(m_r * epoch).  Given ``previous``,
        the rank's partition at ``epoch - 1``, only the q exchanged slots are walked back:
        O(m_r + q * epoch).
        """
        self._check(rank, epoch)
        m = int(self.sizes[rank])
        if previous is None:
            r, pos = self._walk(rank, np.arange(m, dtype=I64), epoch)
            return self._records(r, pos)
        if epoch == 0:
            raise ValueError("epoch 0 has no previous partition")
        if len(previous) != m:
            raise ValueError(f"previous partition has {len(previous)} records, rank {rank} holds {m}")
        out = np.array(previous, dtype=id_dtype(self.n))
        if self.q == 0:
            return out
        rk = round_keys(self.keys(epoch))
        i = np.arange(self.q, dtype=I64)
        slots = self._rho(i, rank, rk, inverse=True)
        src = rank - self.offsets(epoch)
        src %= self.world
        src, pos = self._walk(src, self._rho(i, src, rk, inverse=True), epoch - 1)
        out[slots] = self._records(src, pos)
        return out

    def counts(self, rank: int, epoch: int) -> dict:
        """Records the rank holds at ``epoch``, and how many it kept, received and sent since
        ``epoch - 1`` (at epoch 0 it keeps all and exchanges none).  O(1)."""
        self._check(rank, epoch)
        m = int(self.sizes[rank])
        x = 0 if epoch == 0 else self.q
        return {"records": m, "kept": m - x, "received": x, "sent": x}

    def describe(self) -> dict:
        return {"world": self.world, "fraction": self.fraction, "exchanged_per_epoch": self.q,
                "units": len(self.unit_order), "records": self.n}


class Partitions:
    """One rank's partitions epoch after epoch, each derived from the previous epoch's when
    that was the last one asked for: O(m_r + q * epoch) instead of O(m_r * epoch) per epoch.
    Keeps the last partition (m_r ids)."""

    def __init__(self, exchange: Exchange, rank: int) -> None:
        exchange._check(rank, 0)
        self.exchange, self.rank = exchange, rank
        self._last: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int) -> np.ndarray:
        """The rank's record ids at ``epoch`` (a fresh array, like `Exchange.partition`)."""
        last = self._last
        if last is not None and last[0] == epoch:
            return last[1].copy()
        previous = last[1] if last is not None and epoch > 0 and last[0] == epoch - 1 else None
        out = self.exchange.partition(self.rank, epoch, previous)
        self._last = (epoch, out)
        return out.copy()
