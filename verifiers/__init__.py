"""Verification algorithms (ALGORITHMS.md section 3) and their registry ``METHODS``."""

from __future__ import annotations

import numpy as np

from decoding.tree import DistFn, DraftTree, target_rows

from .base import OTSolver, VerificationMethod, VerifyResult
from .registry import METHODS, chain_equivalent_methods, get_method


def verify(tree: DraftTree, target: DistFn | np.ndarray, method: str | VerificationMethod,
           rng: np.random.Generator) -> VerifyResult:
    """Verify a drafted tree once.

    ``target``: callable ``prefix -> p(.|root+prefix)`` or the ``[n, V]`` target rows of the tree.
    Returns the accepted node indices and ``tokens`` = accepted draft tokens + one emitted token."""
    m = get_method(method)
    p_rows = target_rows(tree, target)
    accepted, emitted = m.verify(tree, p_rows, rng)
    tokens = tuple(int(tree.tokens[i]) for i in accepted) + (int(emitted),)
    return VerifyResult(tokens=tokens, accepted_nodes=tuple(int(i) for i in accepted))


__all__ = ["METHODS", "OTSolver", "VerificationMethod", "VerifyResult", "chain_equivalent_methods", "get_method",
           "verify"]
