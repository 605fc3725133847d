"""Data-parallel training on CPU (gloo) from shufflefs mounts: no sampler, the mounts shuffle.

Every rank reads its own mount of the dataset, mounted with that rank's ``--rank`` and the job's
``--world-size``: the mount shows the rank's share of each epoch in a fresh order, and the W
ranks' shares hold every record exactly once.  On one machine::

    python examples/ddp_train.py --generate /tmp/ddp/src/data.jsonl --records 3000
    for r in 0 1; do mkdir -p /tmp/ddp/mnt$r
        shufflefs mount /tmp/ddp/src /tmp/ddp/mnt$r --rank $r --world-size 2 --block-size 64KiB; done
    torchrun --nproc_per_node 2 examples/ddp_train.py --mount-pattern '/tmp/ddp/mnt{rank}' \\
        --file data.jsonl --epochs 2 --workers 2
    for r in 0 1; do shufflefs umount /tmp/ddp/mnt$r; done

On a cluster every process needs a mount of the shared dataset with its own global rank: with one
process per node, each node mounts it once with ``--rank`` = its node's rank; with several
processes per node, one mount per local rank (``--mount-pattern '/mnt/shuf{local_rank}'``, each
mounted with ``--rank`` = that process's global rank).  The script checks that its mount's rank
and world size are its own.

Ranks' shares differ by a few records under the mount's default ``--even none`` (a rank's share is
made of whole blocks), so ranks run different numbers of batches: DDP's ``join()`` lets a rank that
ran out keep answering the others' gradient all-reduces instead of hanging them.  (``--even
pad|drop`` gives equal counts, at the cost of repeating or leaving out a few records.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from shufflefs.torch import LineDataset, rank_and_world, set_epoch

STATS_XATTR = "user.shufflefs.stats"


def write_dataset(path: Path, records: int, dim: int, seed: int = 0) -> None:
    """JSON Lines ``{"id": i, "x": [dim floats], "y": w.x + b + noise}``, ids 0..records-1."""
    rng = np.random.default_rng(seed)
    w, b = rng.normal(size=dim), rng.normal()
    x = rng.normal(size=(records, dim))
    y = x @ w + b + 0.1 * rng.normal(size=records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(records):
            f.write(json.dumps({"id": i, "x": [round(v, 4) for v in x[i].tolist()], "y": round(float(y[i]), 4)}) + "\n")


def decode(line: bytes) -> tuple[int, torch.Tensor, torch.Tensor]:
    r = json.loads(line)
    return r["id"], torch.tensor(r["x"], dtype=torch.float32), torch.tensor(r["y"], dtype=torch.float32)


def check_mount(mount: Path, rank: int, world: int) -> None:
    """A mount of another rank would train on another rank's share (and miss this one's)."""
    stats = json.loads(os.getxattr(mount, STATS_XATTR))
    got = (int(stats.get("rank", 0)), int(stats.get("world", 1)))
    if got != (rank, world):
        raise SystemExit(f"rank {rank} of {world}: {mount} is mounted with --rank {got[0]} --world-size {got[1]}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mount-pattern", help="this rank's mount; {rank} and {local_rank} are filled in")
    p.add_argument("--file", default="data.jsonl", help="JSON Lines file, relative to the mount")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (each reads one part)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dim", type=int, default=8, help="length of the records' x")
    p.add_argument("--consumed-log", metavar="DIR", help="append the ids each rank consumed to DIR/rank{r}-epoch{e}.txt")
    p.add_argument("--generate", metavar="PATH", help="write a dataset of --records records to PATH and exit")
    p.add_argument("--records", type=int, default=3000)
    args = p.parse_args(argv)
    if args.generate is None and args.mount_pattern is None:
        p.error("--mount-pattern is required (or --generate)")
    return args


def train(args: argparse.Namespace) -> None:
    rank, world = rank_and_world()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(1)  # ranks and loader workers share the CPU cores
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        mount = Path(args.mount_pattern.format(rank=rank, local_rank=local_rank))
        check_mount(mount, rank, world)
        torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
        model = DDP(torch.nn.Linear(args.dim, 1))
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        loader = DataLoader(LineDataset(mount, [args.file], decode=decode), batch_size=args.batch_size,
                            num_workers=args.workers)
        log_dir = Path(args.consumed_log) if args.consumed_log else None
        if log_dir:
            log_dir.mkdir(parents=True, exist_ok=True)
        for epoch in range(args.epochs):
            set_epoch(mount, epoch)  # before iter(loader): its workers open the files after this
            loss_sum, records, batches, consumed = 0.0, 0, 0, []
            with model.join():  # ranks run out of batches at different times
                for ids, x, y in loader:
                    opt.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                    loss.backward()
                    opt.step()
                    loss_sum += loss.item() * len(ids)
                    records += len(ids)
                    batches += 1
                    consumed.append(ids)
            if log_dir:
                with open(log_dir / f"rank{rank}-epoch{epoch}.txt", "a") as f:
                    f.write("".join(f"{i}\n" for i in torch.cat(consumed).tolist()) if consumed else "")
            totals = torch.tensor([loss_sum, records, batches], dtype=torch.float64)
            per_rank = [torch.zeros_like(totals) for _ in range(world)]
            dist.all_gather(per_rank, totals)
            say(f"rank {rank} epoch {epoch}: {records} records in {batches} batches")
            if rank == 0:
                total = torch.stack(per_rank).sum(0)
                say(f"epoch {epoch}: loss {total[0].item() / max(total[1].item(), 1):.4f} over "
                    f"{int(total[1].item())} records; batches per rank {[int(t[2].item()) for t in per_rank]}")
        # every rank done before any closes its connections: gloo aborts a rank (SIGABRT,
        # "terminate called without an active exception") whose peer tore down first
        dist.barrier()
    finally:
        dist.destroy_process_group()


def say(line: str) -> None:
    """One line in one write: the ranks share the terminal, and print() writes the text and its
    newline separately, so two ranks' lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.generate:
        write_dataset(Path(args.generate), args.records, args.dim)
        return 0
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
