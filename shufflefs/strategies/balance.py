"""Load-balanced rank assignment (Bagua's ``LoadBalancingDistributedSampler``).

Each record has a cost (its byte length, or a numeric field such as a token count).  Every
epoch the costs get seeded noise (integers in ``[0, int((max - min) * random_level + 1))`` as in
Bagua, or uniform floats in ``[0, (max - min) * random_level)`` for float costs), the
records are sorted by noisy cost, cut into consecutive chunks of ``world`` records, the chunk
order is shuffled, and rank r takes the r-th record of every chunk.  The i-th record of every
rank therefore comes from the same chunk, so step i costs about the same on every rank and no
rank waits for a slower one.  ``random_level`` trades that balance for randomness: at 0 the
chunks are the same every epoch (only their order changes), at 1 the noise spans the whole
cost range.

Every rank computes the same sort and chunk order from ``(seed, epoch)`` and keeps its own
column, so nothing is exchanged between ranks; the sort is O(records) per rank and epoch.
"""

from __future__ import annotations

import json
import re

import numpy as np

from ..index.table import RecordIndex
from .base import EVEN_MODES, ShuffleSpec, rng
from .units import OrderPlan, id_dtype, salt

NOISE = salt("balance/noise")
CHUNKS = salt("balance/chunks")
LEVEL = salt("balance/level")
SHORT = salt("balance/short")


class RecordCostError(ValueError):
    """A record whose cost cannot be read; ``record`` is its id, so callers can name its offset."""

    def __init__(self, record: int, message: str) -> None:
        super().__init__(f"record {record}: {message}")
        self.record = record


def _check_costs(costs: np.ndarray) -> np.ndarray:
    """Costs as a 1-D array of non-negative integers (int64 if unsigned) or finite floats."""
    c = np.asarray(costs)
    if c.ndim != 1:
        raise ValueError(f"costs must be one-dimensional, got shape {c.shape}")
    if c.dtype.kind not in "iuf":
        raise ValueError(f"costs must be integers or floats, got dtype {c.dtype}")
    if len(c) == 0:
        return c
    if c.dtype.kind == "f" and not np.isfinite(c).all():
        raise ValueError(f"cost of record {int(np.flatnonzero(~np.isfinite(c))[0])} is not finite")
    if c.dtype.kind == "u":
        if int(c.max()) >= 2**62:
            raise ValueError("integer costs must be below 2**62")
        return c.astype(np.int64)
    if c.min() < 0:
        raise ValueError(f"cost of record {int(np.argmin(c))} is negative")
    if c.dtype.kind == "i" and int(c.max()) >= 2**62:
        raise ValueError("integer costs must be below 2**62")
    return c


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def noisy_costs(costs: np.ndarray, seed: int, epoch: int, random_level: float) -> np.ndarray:
    """The epoch's sort keys: costs plus seeded noise (Bagua's integer noise for integer costs,
    uniform float noise in ``[0, (max - min) * random_level)`` for float costs).

    The minimum is subtracted first from integer costs, which leaves their order unchanged and
    keeps the keys within int64 (both ranges are below 2**62), and from float costs only when
    noise is added: two float costs a rounding apart could become a tie.
    """
    c = _check_costs(costs)
    if len(c) == 0:
        return c.astype(np.int64 if c.dtype.kind in "iu" else np.float64)
    lo, hi = c.min(), c.max()
    if c.dtype.kind in "iu":
        out = c.astype(np.int64) - np.int64(lo)
        random_number = int((int(hi) - int(lo)) * random_level + 1)
        if random_number > 1:
            out += rng(seed, epoch, NOISE).integers(0, random_number, len(c), dtype=np.int64)
        return out
    out = c.astype(np.float64)
    span = (float(hi) - float(lo)) * random_level
    if span > 0:  # (without noise the costs themselves: subtracting the minimum could round two apart into a tie)
        out = out - float(lo) + rng(seed, epoch, NOISE).random(len(c)) * span
    return out


def balanced_order(costs: np.ndarray, world: int, rank: int, seed: int, epoch: int,
                   random_level: float = 0.0, even: str = "none") -> np.ndarray:
    """Rank ``rank``'s record ids (`id_dtype`) in output order for ``epoch``.

    Records are sorted by noisy cost (stable, so ties go by record id and all ranks agree) and
    cut into chunks of ``world`` consecutive records; rank r takes the r-th record of each
    chunk, in a chunk order shuffled per epoch.  With N = q*world + k records and k > 0, the k
    leftovers form one partial chunk at a random cost level p in [0, q] (sorted positions
    ``[p*world, p*world + k)``; chunks below start at multiples of ``world``, chunks above are
    shifted by k), so which costs are short changes every epoch.  ``even`` chooses what becomes
    of it:

    - ``"none"``: every record exactly once.  The partial chunk is the *last* step; k ranks drawn
      per epoch (so no rank is always short) get one of its records each, in rank order, and the
      other ranks end one step earlier.  Putting it last keeps step i aligned on every rank for
      all i < q: a partial chunk in the middle would shift the later steps of the short ranks by
      one, pairing their records with other chunks (other cost levels) for the rest of the epoch.
    - ``"drop"``: the partial chunk is left out, so every rank gets q records, each record at
      most once; since p is random, which records are left out changes every epoch.  At
      ``random_level`` 0 the sort is fixed, so only records whose sorted position j has
      ``j % world < k`` can ever be left out; noise mixes them.
    - ``"pad"``: the partial chunk is completed to ``world`` records with the neighbouring
      chunk's closest ones (sorted positions ``[p*world + k - world, p*world + k)``, or
      ``[0, world)`` when p = 0), so every chunk is a window of ``world`` consecutive sorted
      records; it is shuffled with the others.  Every rank gets q + 1 records, with exactly
      ``world - k`` duplicates.  (Bagua wraps around instead, putting the cheapest records in
      the most expensive chunk.)  With fewer records than ranks they are repeated cyclically.

    Within a chunk the cheaper records go to lower ranks (as in Bagua), so at ``random_level`` 0
    rank 0 is never the slowest on any step; the spread of a step is that of ``world``
    consecutive sorted costs.
    """
    if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or world < 1:
        raise ValueError(f"world must be a positive integer, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise ValueError(f"rank {rank!r} outside world size {world}")
    for name, v in (("seed", seed), ("epoch", epoch)):
        if not _is_int(v) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if isinstance(random_level, bool) or not (0.0 <= random_level <= 1.0):
        raise ValueError(f"random_level must be in [0, 1], got {random_level!r}")
    if even not in EVEN_MODES:
        raise ValueError(f"even must be one of {EVEN_MODES}, got {even!r}")
    keys = noisy_costs(costs, seed, epoch, random_level)
    n = len(keys)
    dt = id_dtype(n)
    sorted_ids = np.argsort(keys, kind="stable")
    del keys
    q, k = divmod(n, world)
    if even == "pad" and q == 0:
        return sorted_ids[np.full(1, rank % n)].astype(dt) if n else np.zeros(0, dt)
    starts = np.arange(q, dtype=np.int64) * world
    p = 0
    if k:
        p = int(rng(seed, epoch, LEVEL).integers(0, q + 1))
        starts[p:] += k
        if even == "pad":
            starts = np.append(starts, np.int64(max(0, p * world + k - world)))
    order = rng(seed, epoch, CHUNKS).permutation(len(starts))
    pos = starts[order]
    pos += rank
    if even == "none" and k:
        lucky = np.sort(rng(seed, epoch, SHORT).permutation(world)[:k])
        i = int(np.searchsorted(lucky, rank))
        if i < k and lucky[i] == rank:
            pos = np.append(pos, np.int64(p * world + i))
    return sorted_ids[pos].astype(dt)


def step_imbalance(costs: np.ndarray, orders: list[np.ndarray], batch: int) -> np.ndarray:
    """Per step, the slowest rank's batch cost over the fastest's (float64).

    Step i is records ``[i*batch, (i+1)*batch)`` of every rank's order, for the steps every rank
    has (at least one record in); a rank's last batch may be short.  A step whose cheapest batch
    costs 0 gives inf, or 1.0 when every batch of that step costs 0 (equal loads).  Costs must
    be non-negative, as for `balanced_order`.
    """
    if not orders:
        raise ValueError("need the order of at least one rank")
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    c = _check_costs(costs)
    steps = -(-min(len(o) for o in orders) // batch)
    if steps == 0:
        return np.zeros(0, np.float64)
    sums = np.empty((len(orders), steps), np.float64)
    cuts = np.arange(steps, dtype=np.int64) * batch
    for r, o in enumerate(orders):
        vals = c[np.asarray(o)[: steps * batch]].astype(np.float64)
        sums[r] = np.add.reduceat(vals, cuts)
    hi, lo = sums.max(axis=0), sums.min(axis=0)
    out = np.full(steps, np.inf)
    np.divide(hi, lo, out=out, where=lo > 0)
    out[hi == 0] = 1.0
    return out


_NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_WS = rb"[ \t\r\n]*"
_IS_WS = np.zeros(256, bool)
_IS_WS[list(b" \t\r\n")] = True
_OPENS_KEY = np.zeros(256, bool)
_OPENS_KEY[list(b"{,")] = True


def _field_pattern(field: str) -> re.Pattern:
    """The key as `json.dumps` writes it (either way of ``ensure_ascii``) and a colon (group 1),
    then a number ending the value (group 2; empty when the value is not a number).  The pattern opens
    with the literal key so the scan skips ahead at C speed."""
    forms = {json.dumps(field, ensure_ascii=False).encode(), json.dumps(field).encode()}
    key = b"|".join(re.escape(f) for f in sorted(forms))
    return re.compile(rb"((?:" + key + rb")" + _WS + rb":" + _WS
                      + rb")((?:" + _NUMBER + rb")(?=" + _WS + rb"[,}])|)")


def _in_key_position(arr: np.ndarray, starts: np.ndarray, firsts: np.ndarray) -> np.ndarray:
    """Whether each match is preceded, past whitespace inside its record, by ``{`` or ``,``
    (rules out the same bytes ending a longer key through an escaped quote, e.g. ``"x\\"len"``).
    Loops over the depth of the whitespace, not over matches."""
    idx = starts - 1
    live = idx >= firsts
    while True:
        step = np.flatnonzero(live)
        step = step[_IS_WS[arr[idx[step]]]]
        if not len(step):
            break
        idx[step] -= 1
        live[step] = idx[step] >= firsts[step]
    return live & _OPENS_KEY[arr[np.maximum(idx, 0)]]


def _top_level(raw: bytes, field: str, rid: int) -> int | float:
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise RecordCostError(rid, f"is not valid JSON: {e}") from None
    if not isinstance(obj, dict) or field not in obj:
        raise RecordCostError(rid, f"has no top-level field {field!r}")
    v = obj[field]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordCostError(rid, f"field {field!r} is not a number ({v!r})")
    return v


def field_costs(data: bytes | memoryview | np.ndarray, bounds: np.ndarray, field: str,
                chunk: int = 1 << 18) -> np.ndarray:
    """Costs from the numeric field ``field`` of JSON Lines records ``data[bounds[i]:bounds[i+1]]``.

    Returns int64 when every value is a JSON integer that fits, float64 otherwise.  A record
    without the field, or whose value is not a number, raises ValueError naming the record id.

    One compiled regex, opening with the literal key, scans a ``chunk`` of records at a time;
    `re.split` hands back the pieces between matches, whose lengths give the match offsets
    (mapped to records with ``searchsorted``) without a Python object per match beyond the
    pieces.  A match counts only in key position (after ``{`` or ``,`` and whitespace) and with
    a number ending the value.  No Python code runs per record: about a million short records
    per second, mostly the regex scan.  A record with several matches (the name also used by a
    nested object) is parsed with ``json.loads`` to take its top-level value, a Python loop over
    those records only.  Limitations: a record whose only match is nested (no top-level field)
    yields the nested value instead of an error; keys spelled with escapes other than
    `json.dumps`'s are not found.
    """
    buf = memoryview(np.ascontiguousarray(data).view(np.uint8)) if isinstance(data, np.ndarray) else data
    arr = np.frombuffer(buf, np.uint8)
    b = np.asarray(bounds, dtype=np.int64)
    n = max(len(b) - 1, 0)
    if n == 0:
        return np.zeros(0, np.int64)
    pat = _field_pattern(field)
    rec_parts: list[np.ndarray] = []
    num_parts: list[np.ndarray] = []
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        # split, not finditer: the pieces' lengths give the offsets without a match object each
        parts = pat.split(buf[int(b[lo]): int(b[hi])])
        lengths = np.fromiter(map(len, parts), np.int64, len(parts))
        starts = np.cumsum(lengths)[0:-1:3] + b[lo]
        rec = np.searchsorted(b, starts, side="right") - 1
        keep = _in_key_position(arr, starts, b[rec])
        rec_parts.append(rec[keep])
        nums = np.array(parts[2::3], dtype=np.bytes_) if len(parts) > 1 else np.zeros(0, "S1")
        num_parts.append(nums[keep])
        del parts
    rec = np.concatenate(rec_parts)
    nums = np.concatenate(num_parts)
    counts = np.bincount(rec, minlength=n)
    missing = np.flatnonzero(counts == 0)
    if len(missing):
        raise RecordCostError(int(missing[0]), f"has no field {field!r}")
    single = counts[rec] == 1
    rec1, nums1 = rec[single], nums[single]
    bad = np.flatnonzero(nums1 == b"")
    if len(bad):
        raise RecordCostError(int(rec1[bad[0]]), f"field {field!r} is not a number")
    multi = np.flatnonzero(counts > 1)
    extra = [_top_level(bytes(buf[b[i]:b[i + 1]]), field, int(i)) for i in multi]
    if all(map(_is_int, extra)):
        try:  # JSON integers only (b"1.0" and b"1e3" fail, as do values beyond int64)
            out = np.empty(n, np.int64)
            out[rec1] = nums1.astype(np.int64)
            out[multi] = np.array(extra, dtype=np.int64)
            return out
        except (ValueError, OverflowError):
            pass
    out = np.empty(n, np.float64)
    out[rec1] = nums1.astype(np.float64)
    out[multi] = np.array(list(map(float, extra)), dtype=np.float64)
    return out


def balanced_counts(n: int, world: int, seed: int, epoch: int, even: str = "none") -> np.ndarray:
    """Records of every rank's `balanced_order` (int64[world]), without sorting anything."""
    q, k = divmod(n, world)
    counts = np.full(world, q, np.int64)
    if even == "pad" and q == 0:
        counts[:] = 1 if n else 0
    elif even == "pad" and k:
        counts += 1
    elif even == "none" and k:
        counts[rng(seed, epoch, SHORT).permutation(world)[:k]] += 1
    return counts


def compact_costs(costs: np.ndarray) -> np.ndarray:
    """Costs in the narrowest of int32 / int64 / float64 that holds them exactly: a daemon keeps
    them for every balanced file, so a token count should not take 8 bytes per record."""
    c = _check_costs(costs)
    if c.dtype.kind in "iu" and (len(c) == 0 or int(c.max()) < 2**31):
        return c.astype(np.int32)
    return c


class BalancedPlan(OrderPlan):
    """``full`` with Bagua's load-balanced assignment: the epoch's order is `balanced_order`.

    Costs are the records' byte lengths unless ``costs`` are given (a JSONL field, see
    `field_costs`).  ``spec.even`` is applied by the assignment itself (the partial chunk), so
    `make_plan` adds no `EvenPlan` on top.  A loader part takes a contiguous piece of the rank's
    order, so the parts of all ranks still cover every record once.
    """

    name = "full"

    def __init__(self, index: RecordIndex, spec: ShuffleSpec, epoch: int, rank: int = 0, world: int = 1,
                 part: int = 0, parts: int = 1, costs: np.ndarray | None = None):
        if costs is not None and len(costs) != index.n:
            raise ValueError(f"{len(costs)} costs for {index.n} records")
        self.costs = costs
        super().__init__(index, spec, epoch, rank, world, part, parts)

    def record_order(self) -> np.ndarray:
        costs = self.costs if self.costs is not None else np.diff(self.index.bounds)
        return balanced_order(costs, self.world, self.rank, self.spec.seed, self.epoch,
                              self.spec.random_level, self.spec.even if self.world > 1 else "none")

    def share_counts(self) -> np.ndarray:
        return balanced_counts(self.index.n, self.world, self.spec.seed, self.epoch,
                               self.spec.even if self.world > 1 else "none")

    def describe(self) -> dict:
        return {**super().describe(), "balance": self.spec.balance_field or "bytes",
                "random_level": self.spec.random_level}
