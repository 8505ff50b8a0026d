"""The names of the verification methods, without loading them (no numba, scipy or torch).

Config validation checks method names with `check_method_name`, so `pipeline/config.py` (and every
stage, through it) does not depend on the verifiers' code; `tests/test_config.py` keeps this list
equal to the registry's `decoding.verifiers.METHODS`.
"""

from __future__ import annotations

from .errors import UserInputError

METHOD_NAMES: tuple[str, ...] = ("naive", "nss", "naive_tree", "specinfer", "spectr", "khisti", "traversal", "bv", "gbv")


def check_method_name(method: str) -> str:
    """``method`` when it names a registered method; else the registry's error (`UserInputError`)."""
    if method not in METHOD_NAMES:
        raise UserInputError(f"unknown verification method {method!r}; known: {', '.join(sorted(METHOD_NAMES))}")
    return method
