"""Partial local shuffling (PLS, "Why Globally Re-shuffle?", §III, Algorithm 1), in closed form.

Each of W ranks holds a partition of the records; before every epoch a fraction Q of every
rank's records moves to other ranks, every rank sending and receiving the same number, and each
rank then shuffles its partition locally (that local shuffle is the plan's business, not this
module's).  Q = 0 is pure local shuffling, Q = 1 exchanges everything.

Any epoch's partition is computed directly, in O(m_r + log U) per record of the rank and with
no dependence on the epoch number (epoch 10**12 costs what epoch 1 costs); state is O(U + W):

* Epoch 0: the units (blocks) in the seed's ``unit_order`` form one record stream, cut at equal
  record counts: rank s holds stream positions ``[S_s, S_{s+1})`` (``n // W`` or one more
  records), its *slots* 0..m_s-1, read in whole-block runs except at the two cuts.
* Layers: with m = n // W, a keyed permutation pi_s of [0, m) gives slot j < m of rank s the
  layer pi_s(j); layer l has exactly one slot on every rank.  Slots j >= m (at most one per rank)
  never move.
* Moves: q = floor(Q * m) layers move before each epoch t >= 1, those in the cyclic window
  ``[(t-1)q, tq) mod m`` of layer numbers (random, as pi is).  By epoch t layer l has moved
  ``era(l, t)`` = #{k >= 0 : l + k*m < t*q} = A + (l < R) times, where t*q = A*m + R.
* Places: in era e a layer sits at rank offset f(l, e): 0 in era 0, then a keyed hash of (l, e)
  drawn from [0, ceil(W/2)) in even eras and from [ceil(W/2), W) in odd ones.  Consecutive eras
  always differ, so a moving layer's every record changes rank; the layer's W records stay on W
  distinct ranks (record of rank s's slot goes to rank s + f), so every rank sends exactly q and
  receives exactly q records per epoch.  Slot j of rank r at epoch t holds the epoch-0 record of
  slot pi_s^-1(l) of rank s = r - f(l, era(l, t)) mod W, l = pi_r(j).

Every rank computes the same assignment from the seed without communication.  Records of one
layer never share a rank (1/m of the pairs), which costs no measurable mixing.
"""

from __future__ import annotations

import math

import numpy as np

from .base import rng
from .units import I64, frozen, id_dtype, salt, share_edges

LAYERS = salt("exchange/layers")
PLACES = salt("exchange/places")

U64 = np.uint64
ROUNDS = 6
CHUNK = 1 << 15
PARTITION_CHUNK = 1 << 15
"""Slots of a partition computed at once (bounds its temporaries to a few MiB)."""
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
    """The PLS assignment of records to ranks' slots at any epoch (see the module docstring).

    ``firsts`` (int64[U+1]) is the first record id of every unit, then n; ``unit_order``
    (int64[U]) the units' order shared by all ranks, whose record stream is cut into the ranks'
    epoch-0 partitions.  State is O(U + W).
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
        self.starts = frozen(share_edges(self.n, self.world))
        """Stream position of every rank's slot 0, then n (int64[W+1]): equal record counts."""
        self.sizes = frozen(np.diff(self.starts))
        """Slots of every rank, m_s (int64[W]); the same every epoch, differing by at most one."""
        self.layers = self.n // self.world
        """m: slots per rank that take part in the exchange (one of every layer)."""
        self.q = 0 if self.world == 1 else math.floor(self.fraction * self.layers)
        """Records every rank sends, and receives, before each epoch >= 1."""
        self._layer_keys = rng(self.seed, LAYERS).integers(0, 2**64, size=self.world, dtype=U64)
        self._place_key = int(rng(self.seed, PLACES).integers(0, 2**64, dtype=U64))

    # -- layers and places, identical on every rank ------------------------------------------

    def _layer(self, rank: int | np.ndarray, slots: np.ndarray, inverse: bool = False) -> np.ndarray:
        """pi_rank(slots) (or its inverse), ``rank`` one for all or one per slot."""
        keys = self._layer_keys[rank]
        if np.ndim(keys) == 0:
            keys = int(keys)
        return keyed_permutation(slots, self.layers, keys, inverse)

    def eras(self, layers: np.ndarray, epoch: int) -> np.ndarray:
        """How often each layer has moved by ``epoch`` (int64): O(1) each, whatever the epoch."""
        m = self.layers
        if self.q == 0 or epoch <= 0 or m == 0:
            return np.zeros(len(layers), I64)
        a, r = divmod(int(epoch) * self.q, m)  # Python ints: t*q may exceed int64
        return np.int64(a) + (np.asarray(layers, I64) < r).astype(I64)

    def offsets_at(self, layers: np.ndarray, eras: np.ndarray) -> np.ndarray:
        """f(l, e): the rank offset of each layer in its era (int64; 0 in era 0)."""
        w = self.world
        half = (w + 1) // 2
        z = (np.asarray(layers).astype(U64) * _GOLDEN) ^ (np.asarray(eras).astype(U64) * _M1)
        z ^= U64(self._place_key)
        h = _mix(z).astype(np.uint64)
        odd = (np.asarray(eras) & 1).astype(bool)
        out = np.where(odd, U64(half) + h % U64(max(w - half, 1)), h % U64(half)).astype(I64)
        out[np.asarray(eras) == 0] = 0
        return out

    def moving_layers(self, epoch: int) -> np.ndarray:
        """The layers that move before ``epoch`` (int64[q]; none at epoch 0)."""
        if epoch <= 0 or self.q == 0:
            return np.zeros(0, I64)
        lo = (int(epoch) - 1) * self.q % self.layers
        return (np.arange(lo, lo + self.q, dtype=I64) % self.layers).astype(I64)

    # -- slots ------------------------------------------------------------------------------

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
        """The rank's slots that receive a record from another rank before ``epoch`` (int64[q];
        empty at epoch 0).  O(q)."""
        self._check(rank, epoch)
        return self._layer(rank, self.moving_layers(epoch), inverse=True)

    def partition(self, rank: int, epoch: int, previous: np.ndarray | None = None) -> np.ndarray:
        """The rank's record ids at ``epoch`` in slot order (`id_dtype`), before any local
        shuffle.  O(m_r) for any epoch; ``previous`` (the partition at ``epoch - 1``) is accepted
        for callers that keep it, and only its length is checked.

        Computed `PARTITION_CHUNK` slots at a time: the ids are the only O(m_r) memory.  A slot's
        source takes ~150 bytes of int64 temporaries (round keys per slot), which for a whole
        partition at once was 144 bytes per record on top of the 4 of the result."""
        self._check(rank, epoch)
        m_r = int(self.sizes[rank])
        if previous is not None and len(previous) != m_r:
            raise ValueError(f"previous partition has {len(previous)} records, rank {rank} holds {m_r}")
        out = np.empty(m_r, id_dtype(self.n))
        for lo in range(0, m_r, PARTITION_CHUNK):
            out[lo: lo + PARTITION_CHUNK] = self._slots(rank, epoch, lo, min(lo + PARTITION_CHUNK, m_r))
        return out

    def _slots(self, rank: int, epoch: int, lo: int, hi: int) -> np.ndarray:
        """The records slots ``[lo, hi)`` of ``rank`` hold at ``epoch``."""
        pos = np.arange(lo, hi, dtype=I64)
        m = self.layers
        if self.q == 0 or epoch == 0 or lo >= m:
            return self._records(rank, pos)
        moving = pos[: max(0, m - lo)]  # slots below m take part in the exchange
        layer = self._layer(rank, moving)
        src = (rank - self.offsets_at(layer, self.eras(layer, epoch))) % self.world
        got = self._records(src, self._layer(src, layer, inverse=True))
        if len(moving) == len(pos):
            return got
        return np.concatenate((got, self._records(rank, pos[len(moving):])))

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
    """One rank's partitions by epoch, for its stage builds: each call computes a fresh array,
    so nothing O(m_r) is kept between builds (a mount may stage many files)."""

    def __init__(self, exchange: Exchange, rank: int) -> None:
        exchange._check(rank, 0)
        self.exchange, self.rank = exchange, rank

    def __call__(self, epoch: int) -> np.ndarray:
        """The rank's record ids at ``epoch`` (a fresh array, like `Exchange.partition`)."""
        return self.exchange.partition(self.rank, epoch)
