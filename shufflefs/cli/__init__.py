"""The ``shufflefs`` command: mount, epoch, umount, index, stat, inspect, advise and demo.

One module per command (`mount`, `epoch`, `umount`, `index`, `stat`, `inspect`, `advise`,
`demo`), the option table shared by the command line, config files and the mount helper in
`options`, the argument parser in `parser`, and what they all share in `common`.  Everything a
mount needs is validated before any process is started, so that mistakes surface as a usage
error (exit 2) in the user's terminal rather than in a daemon's log.  A background mount re-runs
this same command with ``-f`` in a new session and waits on a pipe until the daemon reports the
mount ready, so that the mount is usable the moment we return.  The top of the path: may import
any package; nothing imports it but ``__main__`` and the Python API (`shufflefs.api`), which
mounts through the same parser, checks and daemon start.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .advise import cmd_advise
from .common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, PROG, CliError
from .demo import cmd_demo
from .epoch import cmd_epoch
from .index import cmd_index
from .inspect import cmd_inspect
from .mount import cmd_mount, mount_config
from .options import read_config
from .parser import build_parser
from .stat import cmd_stat, format_stats
from .umount import _alive, cmd_umount


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, subs = build_parser()
    args = parser.parse_args(argv)
    sub = subs[args.command]
    try:
        if args.command == "mount":
            return cmd_mount(args, sub, argv)
        handler = {
            "epoch": cmd_epoch, "umount": cmd_umount, "index": cmd_index, "stat": cmd_stat,
            "demo": cmd_demo, "inspect": cmd_inspect, "advise": cmd_advise,
        }[args.command]
        return handler(args, sub)
    except CliError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "PROG", "CliError", "_alive", "build_parser", "format_stats",
           "main", "mount_config", "read_config"]
