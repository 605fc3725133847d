"""The kernel's names of views, dropped at once: one notification written to the FUSE device."""

from __future__ import annotations

import logging
import os
import struct

log = logging.getLogger("shufflefs")

FUSE_NOTIFY_INC_EPOCH = 8
"""The kernel's notification (Linux 6.16, FUSE 7.44) that every name it keeps is out of date."""


class KernelNames:
    """Tells the kernel to drop every name it keeps for this mount: one write of a notification
    header to the FUSE device.  The kernel only bumps a counter (no lock, so it is safe inside a
    request: an entry invalidation of a directory's name waits for the directory's lock, which a
    ``setxattr`` on that directory holds) and compares every name's generation with it on its next
    use.  A name is stamped with the generation read before its lookup was sent, so a lookup
    answered before an epoch change is never taken for one answered after it.  libfuse 3.14 has
    no call for it; the device is this process's only ``/dev/fuse`` descriptor."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def attach(self) -> bool:
        """Find the device (once mounted) and check that the kernel knows the notification."""
        fds = []
        try:
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                        fds.append(int(name))
                except OSError:
                    continue
        except OSError:
            pass
        if len(fds) != 1:
            log.info("names of views are not cached by the kernel: %d FUSE devices open", len(fds))
            return False
        self.fd = fds[0]
        return self.expire()

    def expire(self) -> bool:
        """Whether every name the kernel keeps is now out of date (False: not supported or failed)."""
        if self.fd is None:
            return False
        try:
            os.write(self.fd, struct.pack("<IiQ", 16, FUSE_NOTIFY_INC_EPOCH, 0))
            return True
        except OSError as e:
            log.info("names of views are not cached by the kernel (no name expiry: %s)", e)
            self.fd = None
            return False
