"""A running mount: the pyfuse3 adapter over the catalog (`fuse_ops`), the daemon's lifecycle
(`daemon`: checks, logging, the trio loop, signals, an unmount that always happens) and the
command line's deadline-bound calls to a mount (`control`).  The only package that imports
pyfuse3; imports `serve` and everything below it."""

from .. import replies as _replies  # noqa: F401 -- before pyfuse3 (see shufflefs.replies)
