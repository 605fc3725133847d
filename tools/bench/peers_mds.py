"""MosaicML Streaming in the peers race, run by `peers_child` in its own venv.

``mosaicml-streaming`` cannot be imported beside the main venv's ``datasets`` (their
``huggingface_hub`` / ``transformers`` requirements conflict), so `ensure_venv` makes a venv of
its own (``python -m venv``, then ``pip install`` of torch, mosaicml-streaming and numpy; the
torchvision that comes along does not load with the CPU torch and is removed: Streaming gets the
stand-in of `streaming_import.import_streaming`), and the parent runs the child with its Python.

The conversion is ``MDSWriter`` with the docs' defaults (no compression, 64 MB shards), one
``bytes`` column holding each line; the first contender converts and the second reuses the shards
(its row shows the same conversion time).  Reading is ``StreamingDataset(local=..., shuffle=True)``
(``py1e``, default ``shuffle_block_size``), through a DataLoader with 2 workers (the setup its docs
recommend) or iterated directly in the main process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 64
WORKERS = 2
MARK = ".peers-ready"
PACKAGES = ("torch==2.13.0", "mosaicml-streaming", "numpy")


def ensure_venv(venv: Path, log) -> tuple[Path | None, str]:
    """The venv's Python, made on first use; (None, why) if it cannot be made."""
    py = venv / "bin" / "python"
    if (venv / MARK).exists() and py.exists():
        return py, ""
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(py), "-m", "pip", "install", "-q", *PACKAGES],
             [str(py), "-m", "pip", "uninstall", "-y", "-q", "torchvision"]]
    for cmd in steps:
        log(f"peers: {' '.join(cmd)}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 and "uninstall" not in cmd:
            return None, f"`{' '.join(cmd[-3:])}` failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    r = subprocess.run([str(py), "-c", "import sys; sys.path[:0] = [sys.argv[1]]\n"
                        "from bench.streaming_import import import_streaming\nassert import_streaming()",
                        str(Path(__file__).resolve().parent.parent)], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"streaming does not import in {venv}: {r.stderr.strip().splitlines()[-1:]}"
    (venv / MARK).write_text("ok\n")
    return py, ""


class Streaming:
    direct = False

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.n = int(cfg["n"])
        self.src = Path(cfg["jsonl"])
        self.mds = Path(cfg["mds"])
        self.locks = Path(cfg["work"]) / "locks"
        self.info: dict = {}
        how = ("iterated directly in the main process (a cross-process file lock per sample)" if self.direct
               else f"a torch DataLoader with {WORKERS} workers")
        self.config = (f"`MDSWriter(columns={{\"line\": \"bytes\"}})` (defaults: no compression, 64 MB shards), "
                       f"`StreamingDataset(local=..., shuffle=True, shuffle_seed=epoch, batch_size={BATCH})` made anew each epoch (py1e, default "
                       f"shuffle_block_size, no sample buffer), {how}, `json.loads` of each line")

    def prepare(self) -> str:
        from bench.streaming_import import import_streaming

        streaming = import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        self.locks.mkdir(parents=True, exist_ok=True)
        tempfile.tempdir = str(self.locks)  # Streaming's lock files go to the temporary directory
        note = ""
        done = self.mds / "conversion.json"
        if done.exists():
            self.convert_s = json.loads(done.read_text())["seconds"]
            note = "conversion shared with the DataLoader row"
        else:
            shutil.rmtree(self.mds, ignore_errors=True)
            t0 = time.perf_counter()
            with streaming.MDSWriter(out=str(self.mds), columns={"line": "bytes"}) as w, \
                    open(self.src, "rb", buffering=1 << 20) as f:
                for line in f:
                    w.write({"line": line})
            self.convert_s = time.perf_counter() - t0
            done.write_text(json.dumps({"seconds": self.convert_s}))
        self.info = {"conversion_s": self.convert_s, "conversion_shared": bool(note)}
        self.streaming = streaming
        self.ds = None
        return note

    def dataset(self, epoch: int):
        """A fresh StreamingDataset for every epoch (its seed salted by the epoch, as in
        `alternatives.mds_epoch`): one reused after a cut-short epoch waits forever."""
        from streaming.base.util import clean_stale_shared_memory

        if self.ds is not None:
            self._stop_threads()
            self.ds = None
            clean_stale_shared_memory()
        self.ds = self.streaming.StreamingDataset(local=str(self.mds), shuffle=True, shuffle_seed=epoch,
                                                  batch_size=BATCH)
        return self.ds

    def files(self) -> list[Path]:
        return [self.mds]

    def batches(self, epoch: int):
        from bench.peers_readers import loader_batches, record_batches

        ds = self.dataset(epoch)
        if self.direct:
            def gen():
                it = iter(ds)
                try:
                    yield from record_batches(sample["line"] for sample in it)
                finally:
                    it.close()
                    self._stop_threads()
            return gen()
        from torch.utils.data import DataLoader

        return loader_batches(DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_decode_lines))

    def _stop_threads(self) -> None:
        # a cut-short epoch leaves Streaming's download threads running (as in alternatives._mds_epoch)
        iterator = getattr(self.ds, "_iterator", None)
        if iterator is not None:
            iterator.exit()
        executor = getattr(self.ds, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)

    def close(self, it) -> None:
        it.close()

    def finish(self) -> None:
        from streaming.base.util import clean_stale_shared_memory

        if self.ds is not None:
            self._stop_threads()
        self.ds = None
        clean_stale_shared_memory()


def _decode_lines(batch: list) -> list:
    return [json.loads(sample["line"]) for sample in batch]


class StreamingDirect(Streaming):
    direct = True


CONTENDERS = {"streaming-loader": Streaming, "streaming-direct": StreamingDirect}
