"""``shufflefs advise``: how large a block must be for this storage to read random blocks near
full speed, and how many blocks a buffer needs for a label-mix target.  `probe` measures and
recommends, `cache` keeps a measurement per device (what a mount reads, never measuring), `target`
turns a label-mix target into blocks per buffer.  Imports the index and quality modules only."""

from .cache import measured_block_floor
from .probe import (
    BLOCK_SIZES,
    Advice,
    AdviseError,
    Measurement,
    ProbeResult,
    _size,
    format_report,
    probe,
    recommend,
)

__all__ = ["BLOCK_SIZES", "Advice", "AdviseError", "Measurement", "ProbeResult", "_size", "format_report",
           "measured_block_floor", "probe", "recommend"]
