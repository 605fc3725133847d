"""Importing MosaicML Streaming where it may be missing or half-working, with nothing of shufflefs
imported: `peers_mds` checks a venv of its own with it, a venv without trio or the package."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types


def import_streaming() -> types.ModuleType | None:
    """``streaming``, or None if not installed or not importable (a dependency missing: its rows
    are then skipped rather than the run failing).

    The package imports its torchvision datasets at import time; CPU-only PyTorch installs often
    have no matching torchvision, so an empty stand-in is registered when torchvision is
    missing.  Only ``MDSWriter`` and ``StreamingDataset`` are used here.
    """
    if importlib.util.find_spec("streaming") is None:
        return None
    if importlib.util.find_spec("torchvision") is None and "torchvision" not in sys.modules:
        def stub(name: str) -> types.ModuleType:
            m = types.ModuleType(name)
            m.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = m
            return m

        tv, ds, tr, fn = (stub(n) for n in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                                             "torchvision.transforms.functional"))
        ds.VisionDataset = type("VisionDataset", (), {})
        ds.CIFAR10 = None
        fn.to_tensor = None
        tv.datasets, tv.transforms, tr.functional = ds, tr, fn
    try:
        import streaming
    except ImportError as e:
        print(f"bench: mosaicml-streaming is installed but cannot be imported ({e}): its rows are skipped",
              file=sys.stderr)
        return None
    return streaming
