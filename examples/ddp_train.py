"""Data-parallel training on CPU (gloo) from shufflefs mounts: no sampler, the mounts shuffle.

Every rank mounts its own share of the dataset from inside the script (`shufflefs.mount` with
the rank and world size torchrun gives it): the mount shows the rank's share of each epoch in a
fresh order, and the W ranks' shares hold every record exactly once.  The mount is made before
training starts and unmounted when the script ends, also when it fails.  On one machine::

    python examples/ddp_train.py --generate /tmp/ddp/src/data.jsonl --records 3000
    torchrun --nproc_per_node 2 examples/ddp_train.py --source /tmp/ddp/src \\
        --mount-dir '/tmp/ddp/mnt{rank}' --block-size 64KiB --file data.jsonl --epochs 2 --workers 2

On a cluster the same command runs on every node (``torchrun --nnodes N ...``): each process
mounts the shared dataset with its own global rank, on a mount point of its own
(``--mount-dir`` is filled in with ``{rank}`` and ``{local_rank}``).  A mount the script does
not make itself (``shufflefs mount SRC MNT --rank R --world-size W`` in a shell beforehand)
is named with ``--mount-pattern '/mnt/shuf{local_rank}'`` instead of ``--source``; the script
then checks that its mount's rank and world size are its own.

Ranks' shares differ by a few records under the mount's default ``--even none`` (a rank's share is
made of whole blocks), so ranks run different numbers of batches: DDP's ``join()`` lets a rank that
ran out keep answering the others' gradient all-reduces instead of hanging them.  (``--even
pad|drop`` gives equal counts, at the cost of repeating or leaving out a few records.)

Preemption: ``--checkpoint CKPT --checkpoint-every N`` saves the model, the optimizer and what
each rank consumed of the epoch (`shufflefs.torch.Progress`) every N steps; after a stop,
``--resume CKPT`` continues from it on any number of ranks (each with its own mount of the new
world size) and loader workers: the mounts show the rest of the interrupted epoch, each record
once.  Checkpoints fall on multiples of ``--workers`` steps (so that on the same layout the
loader's round-robin over its workers picks up where it was, and the resumed run reads the same
sequence as an uninterrupted one), and only while every rank still has batches (a checkpoint
gathers every rank's counts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

import shufflefs
from shufflefs.torch import LineDataset, Progress, rank_and_world

STATS_XATTR = "user.shufflefs.stats"
RECORDS_XATTR = "user.shufflefs.records"


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
    p.add_argument("--source", metavar="SRC", help="dataset to mount: each rank mounts its own share of it")
    p.add_argument("--mount-dir", default="/tmp/shufflefs-ddp/mnt{rank}",
                   help="with --source: this rank's mount point, made if missing; {rank} and {local_rank} "
                        "are filled in (default %(default)s)")
    p.add_argument("--block-size", help="with --source: the mount's --block-size (default auto)")
    p.add_argument("--buffer", help="with --source: the mount's --buffer (default 64MiB)")
    p.add_argument("--seed", type=int, default=0, help="with --source: the mount's --seed")
    p.add_argument("--cache-dir", help="with --source: the mount's --cache-dir")
    p.add_argument("--mount-pattern", help="instead of --source: this rank's mount, made beforehand; {rank} and "
                   "{local_rank} are filled in")
    p.add_argument("--file", default="data.jsonl", help="JSON Lines file, relative to the mount")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (each reads one part)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dim", type=int, default=8, help="length of the records' x")
    p.add_argument("--consumed-log", metavar="DIR",
                   help="append 'STEP ID' lines of the records each rank consumed to DIR/rank{r}-epoch{e}.txt")
    p.add_argument("--checkpoint", metavar="CKPT", help="save model, optimizer and data progress here")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="steps between checkpoints")
    p.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint (any number of ranks)")
    p.add_argument("--kill-at-step", type=int, default=0, metavar="S",
                   help="simulate a preemption: rank 0 kills itself (SIGKILL) after step S")
    p.add_argument("--generate", metavar="PATH", help="write a dataset of --records records to PATH and exit")
    p.add_argument("--records", type=int, default=3000)
    args = p.parse_args(argv)
    if args.generate is None and (args.source is None) == (args.mount_pattern is None):
        p.error("give --source (each rank mounts its share) or --mount-pattern (mounts made beforehand), "
                "or --generate")
    return args


def batches_left(mount: Path, rel: str, workers: int, batch: int) -> int:
    """Batches this rank's loader will give this epoch: its parts' records (the view's own when
    one worker) in batches of ``batch``."""
    parts = [mount / rel] if workers <= 1 else [mount / ".parts" / str(workers) / str(i) / rel for i in range(workers)]
    return sum(-(-int(os.getxattr(p, RECORDS_XATTR)) // batch) for p in parts)


def save(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> None:
    rank, world = rank_and_world()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(1)  # ranks and loader workers share the CPU cores
    with contextlib.ExitStack() as stack:
        if args.source:  # this rank's share, unmounted when the script ends, also by an exception
            mount = Path(args.mount_dir.format(rank=rank, local_rank=local_rank))
            mount.mkdir(parents=True, exist_ok=True)
            stack.enter_context(shufflefs.mount(args.source, mount, rank=rank, world_size=world, seed=args.seed,
                                                block_size=args.block_size, buffer=args.buffer,
                                                cache_dir=args.cache_dir))
        else:
            mount = Path(args.mount_pattern.format(rank=rank, local_rank=local_rank))
            check_mount(mount, rank, world)
        run(args, mount, rank, world)


def run(args: argparse.Namespace, mount: Path, rank: int, world: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
        model = DDP(torch.nn.Linear(args.dim, 1))
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        progress = Progress(mount, [args.file])
        loader = DataLoader(LineDataset(mount, [args.file], decode=decode, track=True), batch_size=args.batch_size,
                            num_workers=args.workers)
        log_dir = Path(args.consumed_log) if args.consumed_log else None
        if log_dir:
            log_dir.mkdir(parents=True, exist_ok=True)
        first, step = 0, 0
        if args.resume:
            ckpt = torch.load(args.resume, weights_only=False)
            model.module.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["opt"])
            progress.load_state_dict(ckpt["data"])  # this rank's mount shows the rest of that epoch
            first, step = int(ckpt["data"]["epoch"]), int(ckpt["step"])
            say(f"rank {rank}: resuming epoch {first} after step {step}")
        every = args.checkpoint_every - args.checkpoint_every % max(args.workers, 1) if args.checkpoint else 0
        for epoch in range(first, args.epochs):
            progress.start(epoch)  # set_epoch before iter(loader), unless this epoch is being resumed
            left = torch.tensor([batches_left(mount, args.file, args.workers, args.batch_size)])
            dist.all_reduce(left, op=dist.ReduceOp.MIN)  # checkpoints only while every rank has batches
            loss_sum, records, batches = 0.0, 0, 0
            log = open(log_dir / f"rank{rank}-epoch{epoch}.txt", "a") if log_dir else None
            try:
                with model.join():  # ranks run out of batches at different times
                    for ids, x, y in progress.consume(loader):
                        opt.zero_grad()
                        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                        loss.backward()
                        opt.step()
                        step += 1
                        loss_sum += loss.item() * len(ids)
                        records += len(ids)
                        batches += 1
                        if log:
                            log.write("".join(f"{step} {i}\n" for i in ids.tolist()))
                            log.flush()
                        if every and batches % every == 0 and batches < int(left):
                            data = progress.state_dict()  # every rank's counts (all ranks are here)
                            if rank == 0:
                                save(Path(args.checkpoint), {"model": model.module.state_dict(),
                                                             "opt": opt.state_dict(), "data": data, "step": step})
                            dist.barrier()  # the checkpoint is on disk before any rank goes on
                        if args.kill_at_step and step == args.kill_at_step and rank == 0:
                            say(f"rank 0: killed at step {step}")
                            os.kill(os.getpid(), signal.SIGKILL)
            finally:
                if log:
                    log.close()
            totals = torch.tensor([loss_sum, records, batches], dtype=torch.float64)
            per_rank = [torch.zeros_like(totals) for _ in range(world)]
            dist.all_gather(per_rank, totals)
            say(f"rank {rank} epoch {epoch}: {records} records in {batches} batches")
            if rank == 0:
                total = torch.stack(per_rank).sum(0)
                say(f"epoch {epoch}: loss {total[0].item() / max(total[1].item(), 1):.4f} over "
                    f"{int(total[1].item())} records; batches per rank {[int(t[2].item()) for t in per_rank]}")
        dist.barrier()
        all_returned(world)
    finally:
        dist.destroy_process_group()


def all_returned(world: int) -> None:
    """Wait, through the rendezvous store rather than gloo, until every rank has returned from its
    last collective. A rank that leaves gloo's barrier first can close its connections while a peer
    still reads the barrier's last message; the peer's barrier then fails and tearing down its
    process group aborts it (SIGABRT, "terminate called without an active exception")."""
    store = dist.distributed_c10d._get_default_store()
    if store.add("ddp_train/returned", 1) == world:
        store.set("ddp_train/all-returned", b"1")
    store.wait(["ddp_train/all-returned"])


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
