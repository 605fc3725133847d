"""The compiled gather and the compiled replies live here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

SOURCES = ["shufflefs/_gather.c", "shufflefs/_mapped.c", "shufflefs/_framing.c", "shufflefs/_edges.c", "shufflefs/_rows.c"]
setup(ext_modules=[Extension("shufflefs._gather", SOURCES, depends=["shufflefs/_gather.h", "shufflefs/_framing.h"],
                             optional=True),
                   Extension("shufflefs._replies", ["shufflefs/_replies.c", "shufflefs/_passthrough.c"], libraries=["dl"], optional=True)])
