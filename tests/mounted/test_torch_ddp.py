"""Level: mounted (real FUSE mounts, real readers).

`shufflefs.torch` and `examples/ddp_train.py`: DDP training on CPU from one mount per rank.

The end-to-end test runs the example under ``torchrun`` with two ranks and two DataLoader
workers each, on a dataset whose block-made rank shares are uneven, and checks from the ids each
rank consumed that every epoch trains on every record exactly once across the ranks.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from conftest import REPO, is_mounted, shufflefs_mounts, wait_for  # noqa: E402
from shufflefs.torch import LineDataset, part_path, rank_and_world, set_epoch  # noqa: E402

ARGS = ["--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3"]
N, DIM, EPOCHS = 3000, 8, 2
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT = 240


def dataset(n: int = N, dim: int = DIM, start: int = 0) -> str:
    """JSON Lines with ids start..start+n-1 and a linear target; lines of varying length."""
    lines = []
    for i in range(start, start + n):
        x = [round(((i * 37 + j * 11) % 101) / 50 - 1, (i + j) % 4 + 1) for j in range(dim)]
        lines.append(json.dumps({"id": i, "x": x, "y": round(sum(x) / dim + (i % 7) / 100, 4)}) + "\n")
    return "".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(cwd: Path, world: int, *args: str) -> tuple[int, str]:
    """``examples/ddp_train.py`` under torchrun with ``world`` ranks: its exit status and output.
    Whatever way it ends, nothing it started is left running."""
    cmd = [str(TORCHRUN), "--nproc_per_node", str(world), "--master-port", str(free_port()),
           str(REPO / "examples" / "ddp_train.py"), *args]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(cwd),
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun, its ranks and their loader workers
        except ProcessLookupError:
            pass
        proc.communicate()
    return proc.returncode, out.decode(errors="replace")


def ids_of(path: Path) -> list[int]:
    return [int(line.split()[-1]) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- unit tests


def test_part_path_names_the_workers_part_and_the_view_in_the_main_process():
    mnt = Path("/m")
    assert part_path(mnt, "d/a.jsonl", SimpleNamespace(id=2, num_workers=3)) == Path("/m/.parts/3/2/d/a.jsonl")
    assert part_path("/m", Path("a.jsonl"), SimpleNamespace(id=0, num_workers=2)) == Path("/m/.parts/2/0/a.jsonl")
    # one worker reads the whole view; outside a worker (this process) the view itself
    assert part_path(mnt, "a.jsonl", SimpleNamespace(id=0, num_workers=1)) == Path("/m/a.jsonl")
    assert part_path(mnt, "d/a.jsonl") == Path("/m/d/a.jsonl")
    for bad in ("/etc/passwd", "../a.jsonl", "d/../../a", ""):
        with pytest.raises(ValueError):
            part_path(mnt, bad)
    with pytest.raises(ValueError):
        part_path(mnt, "a.jsonl", SimpleNamespace(id=3, num_workers=3))


def test_rank_and_world_from_the_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not torch.distributed.is_initialized()
    assert rank_and_world() == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rank_and_world() == (3, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="not in"):
        rank_and_world()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="integers"):
        rank_and_world()
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="together"):
        rank_and_world()


def test_set_epoch_on_a_mount_and_its_error_elsewhere(mount, tmp_path):
    m = mount({"a.jsonl": dataset(400)}, *ARGS)
    before = (m.path("a.jsonl")).read_bytes()
    set_epoch(m.mnt, 5)
    assert os.getxattr(m.mnt, "user.shufflefs.epoch") == b"5"
    assert os.getxattr(m.path("a.jsonl"), "user.shufflefs.epoch") == b"5"
    assert m.path("a.jsonl").read_bytes() != before
    set_epoch(str(m.mnt), 0)
    assert m.path("a.jsonl").read_bytes() == before
    with pytest.raises(ValueError):
        set_epoch(m.mnt, -1)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(OSError, match="not a shufflefs mount") as e:
        set_epoch(plain, 1)
    assert e.value.errno == errno.ENOTSUP
    with pytest.raises(OSError) as e:
        os.getxattr(plain, "user.shufflefs.epoch")  # nothing was written
    assert e.value.errno in (errno.ENODATA, errno.ENOTSUP)
    with pytest.raises(FileNotFoundError):
        set_epoch(tmp_path / "missing", 1)


def test_line_dataset_workers_read_disjoint_parts_that_make_the_view(mount):
    m = mount({"a.jsonl": dataset(500), "d/b.jsonl": dataset(300, start=500)}, *ARGS, "--rank", "1", "--world-size", "2")
    view = [json.loads(line)["id"] for rel in ("a.jsonl", "d/b.jsonl") for line in m.path(rel).read_bytes().splitlines()]
    ds = LineDataset(m.mnt, ["a.jsonl", "d/b.jsonl"], decode=lambda line: json.loads(line)["id"])
    assert list(ds) == view  # the main process reads the views themselves
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = [int(i) for i in loader]
    assert sorted(got) == sorted(view) and len(set(view)) == len(view)
    assert got != view  # two parts, interleaved
    raw = list(LineDataset(m.mnt, "a.jsonl", decode=None))
    assert raw and all(isinstance(r, bytes) and not r.endswith(b"\n") for r in raw)
    with pytest.raises(ValueError):
        LineDataset(m.mnt, ["../x.jsonl"])


# --------------------------------------------------------------------------- end to end


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_ddp_training_sees_every_record_once_per_epoch(tmp_path):
    """Each rank mounts its own share from inside the script (`shufflefs.mount`, rank and world
    size from torchrun) and unmounts it at the end: no shell step, nothing left behind."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.jsonl").write_text(dataset())
    mnt = tmp_path / "mnt{rank}"
    logs = tmp_path / "consumed"
    try:
        code, text = torchrun(tmp_path, 2, "--source", str(src), "--mount-dir", str(mnt), "--cache-dir",
                              str(tmp_path / "cache"), "--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3",
                              "--file", "data.jsonl", "--epochs", str(EPOCHS), "--workers", "2", "--batch-size", "16",
                              "--dim", str(DIM), "--consumed-log", str(logs))
        assert code == 0, text
        left = [p for p in shufflefs_mounts() if p.startswith(str(tmp_path) + os.sep)]
        assert not left, f"mounts left behind: {left}"
    finally:
        for r in (0, 1):
            if is_mounted(str(mnt).format(rank=r)):
                subprocess.run(["fusermount3", "-u", "-z", str(mnt).format(rank=r)], capture_output=True)

    every = list(range(N))
    orders = collections.defaultdict(list)
    for epoch in range(EPOCHS):
        shares = [ids_of(logs / f"rank{r}-epoch{epoch}.txt") for r in (0, 1)]
        assert sorted(shares[0] + shares[1]) == every, f"epoch {epoch}: not every record exactly once"
        assert all(shares), f"epoch {epoch}: a rank trained on nothing"
        for r in (0, 1):
            orders[r].append(shares[r])
        assert re.search(rf"^epoch {epoch}: loss [0-9.]+ over {N} records", text, re.M), text
    assert all(orders[r][0] != orders[r][1] for r in (0, 1))
    assert set(orders[0][0]).isdisjoint(orders[1][0])  # two shares, not one share read twice
    # shares are cut at equal record counts, as DistributedSampler's are (join() covers a rank
    # whose loader parts end a batch earlier)
    counts = [tuple(map(int, m)) for m in re.findall(r"^rank (\d) epoch (\d): (\d+) records in \d+ batches", text, re.M)]
    per_epoch = collections.defaultdict(dict)
    for rank, epoch, n in counts:
        per_epoch[epoch][rank] = n
        assert n == len(orders[rank][epoch])
    assert sorted(per_epoch) == list(range(EPOCHS))
    assert all(max(p.values()) - min(p.values()) <= 1 for p in per_epoch.values()), text


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_ddp_training_from_mounts_made_beforehand(mount, tmp_path):
    """``--mount-pattern``: mounts made by ``shufflefs mount`` before the job, checked to be the rank's."""
    ranks = [mount({"data.jsonl": dataset(600)}, *ARGS, "--rank", "0", "--world-size", "2", name="r")]
    ranks.append(mount(None, *ARGS, "--rank", "1", "--world-size", "2", src=ranks[0].src, name="r"))
    pattern = str(ranks[0].mnt.parent.parent / "r{rank}" / "mnt")
    assert [Path(pattern.format(rank=r)) for r in (0, 1)] == [m.mnt for m in ranks]
    logs = tmp_path / "consumed"
    code, text = torchrun(tmp_path, 2, "--mount-pattern", pattern, "--file", "data.jsonl", "--epochs", "1",
                          "--workers", "2", "--batch-size", "16", "--dim", str(DIM), "--consumed-log", str(logs))
    assert code == 0, text
    shares = [ids_of(logs / f"rank{r}-epoch0.txt") for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == list(range(600))
    for r in (0, 1):
        assert int(ranks[r].xattr("records", "data.jsonl")) == len(shares[r])  # the rank's whole share
    code, text = torchrun(tmp_path, 2, "--mount-pattern", str(ranks[0].mnt.parent.parent / "r0" / "mnt"),
                          "--file", "data.jsonl", "--epochs", "1")
    assert code != 0 and "is mounted with --rank 0 --world-size 2" in text, text


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_a_killed_rank_leaves_no_mount_behind(tmp_path):
    """Rank 0 is killed (SIGKILL) mid-epoch and torchrun ends rank 1: neither runs its exit
    handlers, and both mounts still go (each daemon sees its rank's process gone)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.jsonl").write_text(dataset(1000))
    mnt = tmp_path / "mnt{rank}"
    code, text = torchrun(tmp_path, 2, "--source", str(src), "--mount-dir", str(mnt), "--cache-dir",
                          str(tmp_path / "cache"), "--block-size", "4KiB", "--buffer", "16KiB", "--file", "data.jsonl",
                          "--epochs", "1", "--workers", "1", "--batch-size", "16", "--kill-at-step", "5")
    ours = lambda: [p for p in shufflefs_mounts() if p.startswith(str(tmp_path) + os.sep)]  # noqa: E731
    try:
        assert code != 0 and "rank 0: killed at step 5" in text, text
        wait_for(lambda: not ours(), "the ranks' mounts to go", 30)
    finally:
        for p in ours():
            subprocess.run(["fusermount3", "-u", "-z", p], capture_output=True)
