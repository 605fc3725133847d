"""Level: mounted (real FUSE mounts, torchrun, SIGKILL).

Preemption end to end with `examples/ddp_train.py`: two ranks train and rank 0 is killed
(SIGKILL) mid-epoch after a checkpoint; the job resumes from the checkpoint on three ranks, is
killed again, and finishes on one.  The ids each run consumed up to the checkpoint it left (and
all of the last run's) hold every record exactly once per epoch; resumed on two ranks instead,
each rank's sequence of records is the uninterrupted run's.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_torch_ddp import ARGS, DIM, TORCHRUN, dataset, torchrun  # noqa: E402

from shufflefs.torch import LineDataset, Progress  # noqa: E402

N, EPOCHS, BATCH, WORKERS, EVERY = 1500, 2, 16, 2, 4
PER_EPOCH = WORKERS * -(-N // 2 // WORKERS // BATCH)
"""Steps of an epoch on two ranks (each worker's part of a rank's 750 records, in batches)."""


def run(tmp_path: Path, pattern: str, world: int, log: str, *extra: str) -> str:
    """One torchrun of the example; its output (a killed run's nonzero exit is expected)."""
    code, text = torchrun(tmp_path, world, "--mount-pattern", pattern, "--file", "data.jsonl", "--epochs",
                          str(EPOCHS), "--workers", str(WORKERS), "--batch-size", str(BATCH), "--dim", str(DIM),
                          "--consumed-log", str(tmp_path / log), "--checkpoint", str(tmp_path / f"{log}.ckpt"),
                          "--checkpoint-every", str(EVERY), *extra)
    if "--kill-at-step" in extra:
        assert "rank 0: killed at step" in text, text
    else:
        assert code == 0, text
    return text


def consumed(tmp_path: Path, log: str, epoch: int, upto: int | None = None) -> dict[int, list[int]]:
    """Per rank, the ids a run consumed in ``epoch`` at steps up to ``upto`` (a checkpoint's)."""
    out = {}
    for f in sorted((tmp_path / log).glob(f"rank*-epoch{epoch}.txt")):
        rank = int(f.name[4:f.name.index("-")])
        pairs = [tuple(map(int, line.split())) for line in f.read_text().splitlines()]
        out[rank] = [i for s, i in pairs if upto is None or s <= upto]
    return out


def checkpoint_step(tmp_path: Path, log: str) -> tuple[int, dict]:
    ckpt = torch.load(tmp_path / f"{log}.ckpt", weights_only=False)
    return int(ckpt["step"]), ckpt["data"]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed next to this Python")
def test_killed_jobs_resume_on_other_world_sizes_with_every_record_once(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-once, SEMANTICS.md#resume-same"""
    first = mount({"data.jsonl": dataset(N)}, *ARGS, "--rank", "0", "--world-size", "2")
    layouts = {2: [first, mount(None, *ARGS, "--rank", "1", "--world-size", "2", src=first.src)],
               3: [mount(None, *ARGS, "--rank", str(r), "--world-size", "3", src=first.src) for r in range(3)],
               1: [mount(None, *ARGS, src=first.src)]}

    def pattern_of(world: int) -> str:
        """A pattern whose {rank} fills in each of the world's mounts (linked by rank)."""
        base = tmp_path / f"world{world}"
        base.mkdir(exist_ok=True)
        for r, m in enumerate(layouts[world]):
            link = base / f"rank{r}"
            if not link.exists():
                link.symlink_to(m.mnt)
        return str(base / "rank{rank}")

    run(tmp_path, pattern_of(2), 2, "whole")
    run(tmp_path, pattern_of(2), 2, "cut", "--kill-at-step", str(PER_EPOCH + 26))
    step1, state1 = checkpoint_step(tmp_path, "cut")
    assert state1["epoch"] == 1 and step1 == PER_EPOCH + 24  # killed in the second epoch, after a checkpoint

    # the same layout: every rank goes on exactly where it was
    run(tmp_path, pattern_of(2), 2, "same", "--resume", str(tmp_path / "cut.ckpt"))
    whole, cut, same = consumed(tmp_path, "whole", 1), consumed(tmp_path, "cut", 1, step1), consumed(tmp_path, "same", 1)
    for r in (0, 1):
        assert cut[r] + same[r] == whole[r], f"rank {r}: the resumed sequence is not the uninterrupted one"
    assert consumed(tmp_path, "cut", 0) == consumed(tmp_path, "whole", 0)

    # three ranks, killed again after a checkpoint, then one rank finishes
    run(tmp_path, pattern_of(3), 3, "three", "--resume", str(tmp_path / "cut.ckpt"), "--kill-at-step", str(step1 + 6))
    step2, state2 = checkpoint_step(tmp_path, "three")
    assert step2 == step1 + 4 and state2["epoch"] == 1
    assert [(x["world_size"], x["parts"]) for x in state2["views"]["data.jsonl"]] == [(2, WORKERS), (3, WORKERS)]
    run(tmp_path, pattern_of(1), 1, "one", "--resume", str(tmp_path / "three.ckpt"))
    ids = collections.Counter()
    for log, upto in (("cut", step1), ("three", step2), ("one", None)):
        for got in consumed(tmp_path, log, 1, upto).values():
            ids.update(got)
    assert ids == collections.Counter(range(N)), "epoch 1: not every record exactly once over the three runs"
    assert sum(map(len, consumed(tmp_path, "three", 1, step2).values())) > 0  # the 3-rank run did consume


def test_progress_counts_what_the_loop_consumed_and_resumes_a_mount(mount, tmp_path):
    """Without torchrun: a Progress state of one rank and two workers, loaded into a mount of the
    same layout, shows each worker's part from where the loop stopped."""
    m = mount({"data.jsonl": dataset(600)}, *ARGS)
    data = LineDataset(m.mnt, ["data.jsonl"], decode=lambda line: json.loads(line)["id"], track=True)
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)
    progress = Progress(m.mnt)
    progress.start(2)
    taken = []
    for batch in progress.consume(loader):
        taken.extend(batch.tolist())
        if len(taken) >= 100:
            break
    state = progress.state_dict()
    assert state["epoch"] == 2 and state["views"]["data.jsonl"][0]["world_size"] == 1
    counts = state["views"]["data.jsonl"][0]["consumed"][0]
    assert sum(counts) == len(taken) and len(counts) == 2
    whole = [json.loads(line)["id"] for line in m.path("data.jsonl").read_bytes().splitlines()]
    again = Progress(m.mnt)
    again.load_state_dict(json.loads(json.dumps(state)))  # through JSON, as a checkpoint keeps it
    again.start(2)  # the loaded epoch: kept, not restarted
    rest = [int(i) for b in again.consume(torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)) for i in b]
    assert sorted(taken + rest) == sorted(whole) and len(set(taken + rest)) == len(whole)
    assert again.state_dict()["views"]["data.jsonl"][0] == state["views"]["data.jsonl"][0]  # the stop it resumed
    again.start(3)  # another epoch: the whole view again
    assert json.loads(m.xattr("info", "data.jsonl")).get("resumed") is None
    with pytest.raises(ValueError, match="track=True"):
        next(Progress(m.mnt, ["data.jsonl"]).consume(torch.utils.data.DataLoader(range(3), batch_size=2)))
