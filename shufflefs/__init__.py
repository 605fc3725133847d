"""shufflefs: a read-only FUSE view of a dataset whose files hold their records in a per-epoch shuffled order."""

__version__ = "0.1.0"
