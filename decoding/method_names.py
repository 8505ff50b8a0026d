"""The names of the verification methods and which of them verify a chain as naive, without loading them
(no numba, scipy or torch).

Config validation checks method names with `check_method_name`, so `pipeline/config.py` (and every
stage, through it) does not depend on the verifiers' code. The registry (`verifiers/registry.py`)
refuses to build when its methods and `METHOD_NAMES` differ, and serves `CHAIN_EQUIVALENT` as
`chain_equivalent_methods()`; `tests/test_verifiers_exact.py` proves `CHAIN_EQUIVALENT` exactly.
(The list cannot be derived from the registry here: building the registry imports numba and scipy.)
"""

from __future__ import annotations

from .errors import UserInputError

METHOD_NAMES: tuple[str, ...] = ("naive", "nss", "naive_tree", "specinfer", "spectr", "khisti", "traversal", "bv", "gbv")

# The methods whose every step on a chain (K = 1: one child per node) has the exact law of standard speculative
# sampling, `naive` (ALGORITHMS.md 3: with one child every OT solver reduces to it), so their chain labels are naive's.
# Not: nss (emits y ~ p and accepts a matching child), traversal and bv (Block Verification on a chain), gbv (with
# K = 1, Block Verification). Ordered by preference as the source of chain labels (`evaluation.claims.chain_source`).
CHAIN_EQUIVALENT: tuple[str, ...] = ("naive", "specinfer", "spectr", "naive_tree", "khisti")


def check_method_name(method: str) -> str:
    """``method`` when it names a registered method; else the registry's error (`UserInputError`)."""
    if method not in METHOD_NAMES:
        raise UserInputError(f"unknown verification method {method!r}; known: {', '.join(sorted(METHOD_NAMES))}")
    return method
