"""Package names resolved on first use (PEP 562), so importing one numpy-only module of a package
loads neither its heavy siblings (numba, scipy, torch) nor the files a dvc stage would then depend on."""

from __future__ import annotations

import importlib
import sys


def lazy_getattr(package: str, exports: dict[str, str]):
    """A module ``__getattr__`` for ``package``: ``exports`` maps each name to the (relative) module
    that defines it; the value is cached in the package's namespace on first access."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        vars(sys.modules[package])[name] = value
        return value

    return __getattr__
