"""Level: mounted (real FUSE mounts, real readers).

``--balance --balance-field FIELD`` on compressed JSON lines: the costs are the decoded records'
numeric field, read by decoding the source as a stream.  The ranks' views of a ``.jsonl.gz``
(several members) and of a ``.jsonl.zst`` (frames) are the views of the same records in a plain
``.jsonl`` (same costs, same plan): every record once across the ranks, each step's records
paired by cost.  A record without the field is EIO, the log naming its decoded offset."""

from __future__ import annotations

import collections
import errno
import json

import numpy as np
import pytest

import compressed_files as cf
from test_compressed_readers import line_loop

N = 9000  # records: about 6 MB decoded, more than one decoding step
ARGS = ("--strategy", "full", "--seed", "5", "--balance-field", "tokens", "--world-size", "2")


def tokens_jsonl(n: int, seed: int) -> bytes:
    """JSON lines whose ``tokens`` has nothing to do with their length (so balancing by the field
    differs from balancing by bytes)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 100_000, n)
    return b"".join(json.dumps({"id": i, "tokens": int(t), "text": s}).encode() + b"\n"
                    for i, (t, s) in enumerate(zip(tokens, cf._texts(n, seed))))


def tokens_of(lines: list[bytes]) -> list[int]:
    return [json.loads(line)["tokens"] for line in lines]


def test_compressed_json_lines_balance_by_a_field_as_plain_ones_do(mount):
    """Holds: SEMANTICS.md#views-compressed-balance"""
    plain = tokens_jsonl(N, 3)
    files = {"p.jsonl": plain, "g.jsonl.gz": cf.gz(plain, members=3), "z.jsonl.zst": cf.zst(plain, frame=1 << 20)}
    first = mount(files, *ARGS, "--rank", "0")
    ranks = [first, mount(None, *ARGS, "--rank", "1", src=first.src)]
    unbalanced = mount(None, "--strategy", "full", "--seed", "5", "--world-size", "2", "--rank", "1", src=first.src)
    every = collections.Counter(cf.lines_of(plain))
    for epoch in (0, 1):
        for m in (*ranks, unbalanced):
            m.set_epoch(epoch)
        shares = {name: [line_loop(m.path(name)) if name != "p.jsonl" else cf.lines_of(m.path(name).read_bytes())
                         for m in ranks] for name in files}
        for name in ("g.jsonl.gz", "z.jsonl.zst"):
            assert shares[name] == shares["p.jsonl"], f"{name} epoch {epoch}: not the plain file's balanced views"
            assert sum(map(collections.Counter, shares[name]), collections.Counter()) == every
            c0, c1 = (tokens_of(share) for share in shares[name])
            assert abs(len(c0) - len(c1)) <= 1
            assert all(a <= b for a, b in zip(c0, c1)), f"{name} epoch {epoch}: a step's records are not paired"
            assert abs(sum(c0) - sum(c1)) < 0.01 * (sum(c0) + sum(c1))  # each rank about half the tokens
            other = tokens_of(line_loop(unbalanced.path(name)))
            assert not all(a <= b for a, b in zip(c0, other))  # (unbalanced full does not pair them)
    info = json.loads(first.xattr("info", "g.jsonl.gz"))
    assert info["balance"] == "tokens"


@pytest.mark.parametrize("name", ["g.jsonl.gz", "z.jsonl.zst"])
def test_a_compressed_record_without_the_field_is_eio_naming_its_decoded_offset(mount, name: str):
    """Holds: SEMANTICS.md#views-compressed-balance"""
    good = tokens_jsonl(3000, 4)
    data = good + b'{"id": 3000}\n' + tokens_jsonl(10, 5)
    packed = cf.gz(data, members=2) if name.endswith(".gz") else cf.zst(data, frame=1 << 20)
    m = mount({name: packed}, *ARGS, "--rank", "0")
    with pytest.raises(OSError) as e, open(m.path(name), "rb") as f:
        f.read()
    assert e.value.errno == errno.EIO
    assert any(f"the record at decoded byte {len(good)}" in line and "has no field 'tokens'" in line
               for line in m.stats().get("last_errors", [])), m.stats()
