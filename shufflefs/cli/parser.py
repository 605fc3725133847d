"""The argument parser of every command (its options come from `options.OPTIONS`)."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from .. import __version__
from ..config import (
    MAX_EPOCH,
)
from ..index.table import default_cache_dir
from ..serve.access import SETTERS
from ..sources.cache_mode import SOURCE_CACHE_MODES
from ..serve.passthrough import PASSTHROUGH_MODES
from ..stages.decoded import DECODED_COPY_MODES
from ..strategies.base import EVEN_MODES, LOCAL_MODES
from .common import PROG
from .options import VERIFY_MODES


def _strategy_lines() -> str:
    from ..strategies import STRATEGIES, STRATEGY_HELP

    width = max(len(s) for s in STRATEGIES)
    return "\n".join(f"  {name:<{width}}  {STRATEGY_HELP.get(name, '')}" for name in STRATEGIES)


def _add_format_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("formats and index cache")
    g.add_argument(
        "--format", action="append", default=[], metavar="GLOB=NAME[:k=v,...]",
        help="record format of files matching GLOB (relative to SRC), with its parameters; "
        "repeatable, first match wins; files no rule matches are typed by extension",
    )
    g.add_argument("--record-size", metavar="SIZE", help="record size of fixed-size '.bin' files")
    g.add_argument("--header-bytes", metavar="SIZE", help="header bytes of fixed-size '.bin' files (default 0)")
    g.add_argument("--cache-dir", metavar="DIR", help="where indexes are cached and, without --stage-dir, decoded copies "
                   "and Parquet stages go, kept in part for the next mount (kept-copies; default: %s)"
                   % _default_cache_text())
    g.add_argument("--index-dir", metavar="DIR", help="local sources: indexes published on a shared path "
                   "(shufflefs index SRC --publish --index-dir DIR), read when one matches a file's version, "
                   "never written by a mount; the same SRC path on every node (s3:// sources: --index-url)")
    g.add_argument(
        "--config", metavar="FILE",
        help="TOML file: top-level keys are long option names, [[format]] tables hold glob, "
        "format and params, [[pool]] tables a glob, [[mix]] tables a mixture shown in MNT/.mix/NAME/ "
        "(name, samples, shards and [[mix.source]] tables of glob and weight); options given here override it",
    )


def _default_cache_text() -> str:
    return str(default_cache_dir())


class _Parser(argparse.ArgumentParser):
    """A usage error is the one line that matters and where the options are, not the whole
    usage block (which for ``mount`` buries the error under 15 lines)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(options: {self.prog} --help)\n")


def build_parser(parser_class: type[argparse.ArgumentParser] = _Parser,
                 ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line's parser and its subcommands' (``parser_class``: the Python API's raises
    its usage errors instead of exiting, with the same messages)."""
    from ..strategies import STRATEGIES

    strategies = _strategy_lines()
    raw = argparse.RawDescriptionHelpFormatter
    parser = parser_class(
        prog=PROG,
        description="Mount a dataset directory read-only; every data file shows its records in a "
        "fresh shuffled order each epoch.",
        epilog=f"strategies:\n{strategies}\n\nRun '{PROG} COMMAND --help' for the options of a command.",
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subs: dict[str, argparse.ArgumentParser] = {}

    p = subs["mount"] = sub.add_parser(
        "mount", help="mount SRC at MNT with shuffled views", formatter_class=raw,
        description="Mount SRC at MNT. Returns once the mount is ready; the daemon keeps running "
        "in the background until 'shufflefs umount MNT'.",
        epilog=f"strategies:\n{strategies}\n\n"
        "sizes: 4096, 64KiB, 4MiB, 1GB; --buffer also takes a share of each file's record "
        "bytes (10%).\nOne --buffer sizes the buffer of every strategy that has one, so "
        "strategies compare at equal memory.",
    )
    p.add_argument("source", metavar="SRC", help="dataset directory")
    p.add_argument("mountpoint", metavar="MNT", help="empty directory to mount on")
    g = p.add_argument_group("shuffling")
    g.add_argument("--strategy", choices=list(STRATEGIES), metavar="S", help="shuffle strategy (default stratified; listed below)")
    g.add_argument("--block-size", metavar="SIZE|auto",
                   help="bytes per block, the unit of storage reads and of block shuffling, 512 B to 1GiB; "
                        "auto (default): per file, the largest power of two up to 1/512 of the buffer (a "
                        "buffer draws from hundreds of blocks), but not below what the storage reads near "
                        "full speed (the size `shufflefs advise` measured for the source's device, else "
                        "128KiB), nor above 4MiB or 1/64 of the file's record bytes, nor below --page-size; "
                        "on object storage the buffer / 16 (a buffer draws from 16 stretches of a file), "
                        "1MiB to 8MiB, one ranged GET each: 4MiB for the default buffer, and a buffer given "
                        "as a percentage takes the per-file rule with a 1MiB floor. With --world-size above 1 "
                        "a measurement is not used (every "
                        "rank must cut the same blocks): give --block-size")
    g.add_argument("--buffer", metavar="SIZE|P%", help="shuffle buffer: bytes (4KiB to 1TiB), or a percentage of each "
                   "file's record bytes (0.01%% to 100%%) (default 64MiB)")
    g.add_argument("--seed", metavar="N", help="seed of every order, 0 to 2**63-1 (default 0)")
    g.add_argument("--epoch", metavar="N", help=f"initial epoch, 0 to {MAX_EPOCH} (default 0)")
    g.add_argument("--page-size", metavar="SIZE", help="page size for page-aware strategies, a power of two from 512 to 1MiB (default 4096)")
    g.add_argument("--exchange", metavar="Q", help="pls: fraction of every rank's records traded with other "
                   "ranks before each epoch, 0 (pure local shuffling) to 1 (default 0)")
    g.add_argument("--pls-local", choices=LOCAL_MODES, default=None,
                   help="pls: how each rank shuffles its partition: uniform (default) or corgipile "
                        "(its records grouped by block, blocks permuted, records shuffled inside "
                        "the buffer: block-sized reads)")
    g.add_argument("--verify", choices=VERIFY_MODES, default=None,
                   help="record framing (lines and CSV rows end at their bounds, TFRecord lengths, tar "
                        "headers) is checked in every window as it is gathered, and npy/fixed bounds "
                        "against the file's header, whatever this says, so a wrong index (a damaged "
                        "cache entry) is EIO and rebuilt, never served; frames (default): TFRecord "
                        "CRCs too, so a byte changed after indexing is EIO; index: CRCs only when the "
                        "index is built")
    g.add_argument("--source-cache", choices=SOURCE_CACHE_MODES, default=None,
                   help="how a window's source bytes are read: keep (buffered, left in the page "
                        "cache), drop (buffered, dropped from it once the window is built: each byte "
                        "is cached once, as the view's), direct (O_DIRECT reads by several threads, "
                        "nothing cached), or auto (default: keep when the file and its view fit the "
                        "machine's memory and the daemon's memory cgroup limit or the file is already "
                        "cached, else direct for windows of short runs and drop for the others); "
                        "shufflefs stat shows the choice")
    g.add_argument("--decoded-copies", choices=DECODED_COPY_MODES, default=None,
                   help="compressed files (.jsonl.gz, .jsonl.zst, ...): auto (default) decodes each "
                        "one into a copy on node-local disk (under --stage-dir, else the cache "
                        "directory) when the disk keeps 10%% and 1 GiB free besides it: written by "
                        "the scan that indexes it, else (index cached) during its first epoch by "
                        "a low-priority child process (zstd: filled with the frames its views decode, "
                        "the rest by such a child), one file after another; views that find the copy "
                        "read it and decode nothing; at unmount copies are kept for later mounts "
                        "of the same files (they give way to copies in use); needed: only files without restart points (one zstd "
                        "frame) or under record-level orders get one, the others are decoded from "
                        "restart points every epoch. shufflefs stat shows the copies")
    g.add_argument("--passthrough", choices=PASSTHROUGH_MODES, default=None,
                   help="auto (default): where the kernel offers FUSE passthrough (Linux 6.9+) and the "
                        "daemon runs as root, a Parquet view is encoded once per epoch into a stage "
                        "file on node-local disk (beside the decoded copies) and the kernel reads it "
                        "for every handle of that view, as fast as a local file; off: the daemon "
                        "serves every read. shufflefs stat says whether it is on and why not")
    g.add_argument("--stage-wait", metavar="S",
                   help="seconds an open of a Parquet view waits for its stage (default 1): a stage "
                        "written by then is read by the kernel; else the daemon serves the open from "
                        "the stage as it is written, footer first, so the first row group comes a "
                        "fraction of a second after that wait, whatever the file's size (0: never wait)")
    g.add_argument("--stage-dir", metavar="DIR",
                   help="pls: keep this rank's partition of every file on local disk under DIR: "
                        "copied from SRC when a file's first view opens, then each next epoch's "
                        "built in the background from the kept records plus only the received "
                        "ones read from SRC (about Q of the share); removed at unmount")
    g = p.add_argument_group(
        "ranks and loader parts",
        "The mount shows rank R's share of every epoch; the W ranks' shares are disjoint and hold "
        "every record once. MNT/.parts/K/i/ mirrors the tree with the i-th of K disjoint parts of "
        "each view, one per DataLoader worker.")
    g.add_argument("--rank", metavar="R", help="this mount's rank (default $RANK, else 0)")
    g.add_argument("--world-size", "--world", dest="world_size", metavar="W",
                   help="number of ranks (default $WORLD_SIZE, else 1)")
    g.add_argument("--even", choices=EVEN_MODES, default=None,
                   help="equal record counts per rank: none (default: every record exactly once, "
                        "counts differ by at most one record), pad (short ranks repeat some of "
                        "their records, like DistributedSampler) or drop (long ranks leave their "
                        "last records out)")
    g.add_argument("--balance", action="store_true", default=None,
                   help="with --strategy full: assign records so that the i-th record of every rank "
                        "has a similar cost (its byte length), like Bagua's load-balancing sampler; "
                        "still every record once per epoch (with --even none)")
    g.add_argument("--balance-field", metavar="NAME",
                   help="JSON lines: the cost of a record is this numeric top-level field (e.g. a "
                        "token count) instead of its byte length; implies --balance")
    g.add_argument("--random-level", metavar="X",
                   help="--balance: noise added to the costs before sorting, 0 (the same cost "
                        "groups every epoch) to 1 (noise spanning the cost range) (default 0)")
    _add_format_options(p)
    g = p.add_argument_group(
        "pools of shards",
        "Numbered files of one stem and extension in one directory (train-00000-of-00064.tfrecord, "
        "part-00001.jsonl, shard-000123.tar) are shards of one set, shuffled as one pool: output "
        "shard i, under its own name, holds the i-th equal share of the pool's stream, so the "
        "shards read in name order are the pooled order. Other files are shuffled alone.")
    g.add_argument("--pool", action="append", default=[], metavar="GLOB",
                   help="declare a set: the data files matching GLOB (relative to SRC, '*' spans "
                        "directories) are one pool; repeatable, first match wins; also [[pool]] "
                        "tables with a glob key in --config")
    g.add_argument("--no-pool", action="store_true", default=None,
                   help="shuffle every file alone, shards of a set too")
    g = p.add_argument_group(
        "object storage",
        "SRC may be s3://BUCKET/PREFIX (pip install 'shufflefs[s3]'): the objects under PREFIX are "
        "the files. Credentials come from the standard AWS environment variables, else from the "
        "shared config and credentials files (AWS_PROFILE). --block-size defaults to the buffer / 16 "
        "there, 1MiB to 8MiB (4MiB for the default 64MiB buffer: the default view of a label-sorted "
        "object mixes within 1.7x of a uniform shuffle); shufflefs advise s3://... says what a buffer gives.")
    g.add_argument("--endpoint-url", metavar="URL",
                   help="S3-compatible server (default $AWS_ENDPOINT_URL, else AWS)")
    g.add_argument("--region", metavar="NAME", help="bucket region (default $AWS_REGION, else the profile's)")
    g.add_argument("--requests", metavar="N", help="ranged GETs in flight at once for the whole mount, 1 to 256 (default "
                   "16); N x 8 MiB is also the most a sequential reader's readahead keeps loading (it follows the "
                   "link's measured bandwidth x latency below that)")
    g.add_argument("--request-timeout", metavar="S", help="seconds before a request is given up and retried (default 30)")
    g.add_argument("--retries", metavar="N", help="retries of a failed request, with exponential backoff, "
                   "before the read fails with EIO (default 4)")
    g.add_argument("--index-url", metavar="URL", help="where published indexes are (s3://BUCKET/PREFIX; default "
                   "SRC/.shufflefs/index): see shufflefs index --publish")
    g.add_argument("--listing-ttl", metavar="S", help="seconds a listing of a prefix answers lookups before it is "
                   "asked for again, 0.1 to 3600 (default 2), counted from its arrival, and at least ten times "
                   "as long as it took (a prefix of 100,000 objects takes seconds): longer saves LIST requests "
                   "on large prefixes, shorter shows new or rewritten objects sooner")
    g = p.add_argument_group("daemon")
    g.add_argument("--log-file", metavar="FILE", help="append the daemon's log here")
    g.add_argument("-v", "--verbose", action="count", default=None, help="more output (repeatable)")
    g.add_argument("-f", "--foreground", action="store_true", default=None, help="run the daemon in this process")
    g.add_argument("--direct-io", action="store_true", default=None,
                   help="serve views other than .npy and fixed-size ones with direct_io, bypassing "
                        "the page cache (the serving of earlier versions; faster on some machines, "
                        "docs/performance.md, Serving modes). What breaks: a shared mmap of those "
                        "views fails with ENODEV, so pandas.read_csv of a CSV over a few MB and "
                        "numpy.memmap fail; private mappings (MAP_PRIVATE, as pyarrow.memory_map makes) "
                        "and read() work")
    g.add_argument("--page-cache", action="store_true", default=None,
                   help="serve every view through the page cache. By default a JSON lines, text, "
                        "TFRecord or tar view whose file and view do not fit the page cache (the "
                        "choice --source-cache auto makes) is served with direct_io: each read is "
                        "copied once into the reader's buffer (1.7x the rate of a line loop in a "
                        "memory cgroup of 1/4 of the file), and a shared mmap of it fails with ENODEV")
    g.add_argument("--python-replies", action="store_true", default=None,
                   help="answer every read in Python. By default a read inside the window its open file "
                        "already reads is answered by compiled code, with the same check of the source "
                        "before each reply and no Python call (docs/performance.md, Compiled replies); "
                        "shufflefs stat shows how many under compiled_replies")
    g.add_argument("--reply-threads", metavar="N|auto",
                   help="threads that copy compiled replies into the kernel, 0 to 64; 0: the thread that "
                        "receives requests; auto (default): 2, or 1 on a single CPU (docs/performance.md, "
                        "Compiled replies)")
    g.add_argument("--allow-other", action="store_true", default=None,
                   help="let other users read the mount (FUSE allow_other; -o allow_other in mount(8) and fstab): "
                        "the kernel checks every access against the source's modes, so a user reads, and reads the "
                        "attributes and errors of, only the files they could read in SRC. A user other than root "
                        "needs user_allow_other in /etc/fuse.conf")
    g.add_argument("--epoch-setters", choices=SETTERS, default=None,
                   help="who may set epochs and resume states: owner (default: the user who mounted it, and "
                        "root; others get EPERM) or any (every user the kernel lets write the path). A state given "
                        "as @PATH is read by the daemon, so only from the owner and root")
    g.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    g.add_argument("--owner-pid", type=int, help=argparse.SUPPRESS)

    p = subs["epoch"] = sub.add_parser(
        "epoch", help="show or set the epoch",
        description="Show the epoch of a mount (MNT is its root: every file), of a directory in it "
        "(the files below) or of one file; with N set it, with 'next' advance it by one. Setting "
        "it on the root or a directory replaces the epochs set below it, and clears a resume "
        "state. With --resume (on the root), every view shows the records of epoch N that the "
        "layouts in STATE did not consume, as this mount's rank's share; a file of STATE: "
        '{"epoch": N, "views": {"train.jsonl": [{"world_size": 2, "parts": 1, "consumed": '
        '[[12345], [23456]]}]}} (consumed[r][i]: records read from the front of rank r\'s part i; '
        "a view not named consumed nothing; a second stop in the same epoch appends a layout, "
        "whose counts refer to the resumed views). On the same layout as the last one each view "
        "goes on where it stopped; on another, the rest is cut among the new ranks and parts.",
    )
    p.add_argument("path", metavar="MNT", help="mount root, or a directory or file inside the mount")
    p.add_argument("value", metavar="N|next", nargs="?", help="new epoch, or 'next'")
    p.add_argument("--resume", metavar="STATE", help="resume epoch N after a stop: a JSON file of the "
                   "records each layout consumed (shufflefs.torch writes one)")

    p = subs["umount"] = sub.add_parser(
        "umount", help="unmount and wait for the daemon to exit",
        description="Unmount MNT (fusermount3 -u, or umount) and wait for its daemon to exit.",
    )
    p.add_argument("mountpoint", metavar="MNT")
    p.add_argument("-l", "--lazy", action="store_true", help="detach now even if busy; the daemon exits when the last file closes")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SEC", help="how long to wait for the daemon to exit (default 10)")

    p = subs["index"] = sub.add_parser(
        "index", help="build (or check) the index of every data file in SRC",
        description="Build the index of every data file in SRC, or reuse the cached one, so a later "
        "mount starts without scanning. For SRC s3://BUCKET/PREFIX, --publish writes every object's "
        "index beside the data (PREFIX/.shufflefs/index/, keyed by the object's ETag, size and time "
        "and the format, with a checksum), so that every mount of the prefix takes an object's small "
        "index instead of downloading the object to index it; --part i/N indexes every N-th object "
        "from the i-th (a Slurm array or an indexed Job builds a large bucket in parallel).",
    )
    p.add_argument("source", metavar="SRC", help="dataset directory, or s3://BUCKET/PREFIX")
    p.add_argument("--publish", action="store_true", help="write the indexes where every node finds them: beside "
                   "the data of an s3:// source, or into --index-dir for a local one")
    p.add_argument("--part", metavar="i/N", help="index only every N-th data file (in key order) from the i-th, 0 <= i < N")
    p.add_argument("--endpoint-url", metavar="URL", help="S3-compatible server (default $AWS_ENDPOINT_URL, else AWS)")
    p.add_argument("--region", metavar="NAME", help="bucket region (default $AWS_REGION, else the profile's)")
    p.add_argument("--index-url", metavar="URL", help="publish to s3://BUCKET/PREFIX instead of SRC/.shufflefs/index "
                   "(another prefix or bucket; mounts then take --index-url too)")
    _add_format_options(p)

    p = subs["stat"] = sub.add_parser("stat", help="show a mount's settings and counters")
    p.add_argument("mountpoint", metavar="MNT")
    p.add_argument("--json", action="store_true", help="print the raw JSON")

    p = subs["demo"] = sub.add_parser(
        "demo", help="mount a small label-sorted dataset and show two shuffled epochs",
    )
    p.add_argument("--dir", metavar="DIR", help="work here instead of a new temporary directory")
    p.add_argument("--keep", action="store_true", help="keep the generated files")

    _add_inspect_parser(sub, subs, strategies)
    _add_advise_parser(sub, subs)
    return parser, subs


def _add_inspect_parser(sub: Any, subs: dict[str, argparse.ArgumentParser], strategies: str) -> None:
    p = subs["inspect"] = sub.add_parser(
        "inspect", help="measure how well a file's records are shuffled, per strategy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure the shuffle quality of a file's record order against a uniform shuffle.\n"
        "PATH in a shufflefs mount: the order its view delivers (the mount's strategy, seed and\n"
        "current epoch). PATH a source file: the orders of --strategies, without mounting.",
        epilog=f"strategies:\n{strategies}\n\n"
        "metrics: rank correlation of source and output position (1 unshuffled, ~0 random); total\n"
        "variation distance of each window's label mix from the whole file's (0 = perfect mix);\n"
        "entropy of successive id gaps (MosaicML Streaming's measure); share of in-batch record\n"
        "pairs from one source block. Columns 'uniform' (a seeded uniform permutation) and\n"
        "'expected' (its exact expectation, where one exists) are the reference.",
    )
    p.add_argument("path", metavar="PATH", help="a data file inside a shufflefs mount, or a source data file")
    g = p.add_argument_group("orders to compare (source files; a mount's view has its own)")
    g.add_argument("--strategies", metavar="S[@BUFFER],...",
                   help="comma-separated strategies, each optionally with its own buffer, e.g. "
                   "'none,full,corgipile,corgipile@2%%' (default: all)")
    g.add_argument("--block-size", metavar="SIZE|auto", help="bytes per block (default auto, as a mount with no saved measurement: up to 1/512 of the buffer, "
                   "at least 128KiB, at most 4MiB and 1/64 of the file's record bytes)")
    g.add_argument("--buffer", metavar="SIZE|P%", help="shuffle buffer, bytes or a share of the record bytes (default 64MiB)")
    g.add_argument("--seed", metavar="N", help="seed (default 0)")
    g.add_argument("--page-size", metavar="SIZE", help="page size of lirs-page (default 4096)")
    g.add_argument("--mix", metavar="NAME", help="measure mixture NAME of --config (PATH: its source directory): "
                   "how its epoch mixes its sources, each record labelled by its source unless a label option is given")
    p.add_argument("--epoch", metavar="N", help="epoch to measure (default: the view's current epoch, or 0)")
    _add_format_options(p)
    g = p.add_argument_group("labels (for the label-mix metric and picture)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--label-field", metavar="F",
                   help="top-level field of JSON Lines records; for tar shards the suffix of the member holding the label (cls); "
                   "for Parquet files a column")
    x.add_argument("--label-column", metavar="NAME|INDEX", help="CSV/TSV column (header name or 0-based index), .npy column (index or field name), or Parquet column")
    x.add_argument("--label-byte", metavar="OFFSET", help="byte at OFFSET of every record (fixed-size records)")
    g = p.add_argument_group("output")
    g.add_argument("--window", metavar="K", default="100", help="records per window of the label-mix metric (default 100)")
    g.add_argument("--batch", metavar="B", default="32", help="records per batch of the same-block metric (default 32)")
    g.add_argument("--png", metavar="OUT.png", help="draw every order (record id by position; label counts per 20 records); needs matplotlib")
    g.add_argument("--json", action="store_true", help="print the results as JSON")
    g.add_argument("--verify", action="store_true",
                   help="(mounted PATH) also read the view and check that it holds exactly the bytes of the order reported")


def _add_advise_parser(sub: Any, subs: dict[str, argparse.ArgumentParser]) -> None:
    p = subs["advise"] = sub.add_parser(
        "advise", help="measure the storage under SRC and recommend --block-size and --buffer",
        description="Time random reads of 4 KiB to 16 MiB against a sequential read on the files "
        "under SRC, one at a time (O_DIRECT, so the page cache cannot serve them) and as views read "
        "them (a window's blocks hinted at once, cached pages dropped first); SRC is only read. "
        "Recommends the smallest block size reaching about 90% of sequential throughput as views "
        "read, a buffer for a memory budget and one for a label-mix target, and saves the "
        "measurement for the source's device: mounts of that device take its block size as the "
        "floor of the automatic block size.",
    )
    p.add_argument("source", metavar="SRC", help="dataset directory (its largest files are read), or s3://BUCKET/PREFIX: "
                   "no request is made; what buffers give there (block size, label mix, reading rate, GETs and "
                   "their price) is stated for the link of --rtt-ms and --link-rate")
    p.add_argument("--buffer", metavar="SIZE", action="append",
                   help="object storage: the buffer to state (repeatable; default 16MiB to 1GiB); with a directory, "
                   "also what this buffer gives on object storage")
    p.add_argument("--requests", metavar="N", default="16", help="object storage: GETs in flight (mount --requests, default 16)")
    p.add_argument("--rtt-ms", metavar="MS", default="30", help="object storage: a GET's round trip (default 30)")
    p.add_argument("--link-rate", metavar="SIZE", default="400MB",
                   help="object storage: bytes a second of the link (default 400MB; 80MB per connection)")
    p.add_argument("--budget", metavar="SIZE", default="1GiB",
                   help="memory the daemon may use per file read at once (default 1GiB); the buffer is a third of it")
    p.add_argument("--seconds", metavar="S", default="5", help="time to spend measuring (default 5)")
    p.add_argument("--target-mix", metavar="X", default="0.074",
                   help="label-mix target for windows of 1,000 records over 10 labels: recommend the blocks per "
                   "buffer whose expected mix is at most X (default 0.074, within 2x of a uniform shuffle's "
                   "0.038), the buffer and the memory it costs, locally and on object storage")
    p.add_argument("--no-save", action="store_true",
                   help="do not save the measurement for the source's device (by default it is saved under the "
                   "shufflefs cache directory, advise/, where mounts read the floor of the automatic block size)")
