"""Only the compiled gather lives here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("shufflefs._gather", ["shufflefs/_gather.c"], optional=True)])
