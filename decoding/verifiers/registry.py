"""The verifier registry: the ONE place that maps method names to verification methods.

Every entry implements ``VerificationMethod`` (base.py): ``verify``, the exact law of the step's
tokens (``outcome_distribution``), and, for OT-based methods, the exact block-efficiency DP. The
exact-enumeration harness (decoding/exact.py) treats all entries alike.

Names: ``naive`` (standard speculative sampling; chains only, on trees use ``naive_tree``), ``nss``,
``naive_tree``, ``specinfer``, ``spectr``, ``khisti`` (OT-based), ``traversal`` (Traversal
Verification) and ``bv`` (Block Verification = traversal restricted to chains). Traversal's test
sequence is fixed by the tree (traversal.py), so its block efficiency is exact too. ``khisti`` and
``traversal``/``bv`` live in khisti.py and traversal.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..tree import DraftTree
from . import traversal
from .base import ChainRestricted, VerificationMethod
from .khisti import KhistiSolver
from .ot import OTMethod, make_ot_methods, standard_chain_acceptance


@dataclass
class BottomUpMethod(ChainRestricted):
    """A verifier given by plain functions (Traversal / Block Verification): no branching
    probabilities, so block efficiency is estimated by repeated verification (labels.py)."""

    name: str
    verify_fn: Callable[[DraftTree, np.ndarray, np.random.Generator], tuple[list[int], int]]
    outcome_fn: Callable[[DraftTree, np.ndarray], dict[tuple[int, ...], float]]
    # exact E[accepted + 1]: fn(tree, p_rows, nodes=None, mass_cache=None); ``nodes`` selects a sub-tree
    block_efficiency_fn: Callable[..., float] | None = None
    # repeated-verification estimate: fn(tree, p_rows, repeats, rng, nodes=None, mass_cache=None) -> (mean, se)
    block_efficiency_mc_fn: Callable[..., tuple[float, float]] | None = None
    chains_only: bool = False
    description: str = ""
    tree_alternative: ClassVar[str] = "'traversal' on trees"

    @property
    def exact_block_efficiency(self) -> bool:
        return self.block_efficiency_fn is not None

    def verify(self, tree, p_rows, rng):
        self._check(tree)
        accepted, token = self.verify_fn(tree, p_rows, rng)
        return list(accepted), int(token)

    def outcome_distribution(self, tree, p_rows):
        self._check(tree)
        return self.outcome_fn(tree, p_rows)

    def expected_block_efficiency(self, tree, p_rows):
        self._check(tree)
        if self.block_efficiency_fn is None:
            raise NotImplementedError(
                f"method {self.name!r} has no exact block efficiency; use "
                "decoding.labels.estimate_block_efficiency (repeated verification) instead")
        return float(self.block_efficiency_fn(tree, p_rows))


def _build() -> dict[str, VerificationMethod]:
    fns = (traversal.traversal_verify, traversal.traversal_outcome_distribution,
           traversal.traversal_expected_block_efficiency, traversal.traversal_expected_block_efficiency_mc)
    methods: list[VerificationMethod] = [
        *make_ot_methods(),
        OTMethod("khisti", KhistiSolver(), chain_acceptance=standard_chain_acceptance,
                 description="Khisti et al. importance-weighted selection (pairwise LP tournament)"),
        BottomUpMethod("traversal", *fns, description="Traversal Verification (bottom-up, sequence level)"),
        BottomUpMethod("bv", *fns, chains_only=True, description="Block Verification (= traversal on chains)"),
    ]
    return {m.name: m for m in methods}


METHODS: dict[str, VerificationMethod] = _build()


def get_method(method: str | VerificationMethod) -> VerificationMethod:
    """Look a method up by name (a method object is returned as is)."""
    if not isinstance(method, str):
        if isinstance(method, VerificationMethod):
            return method
        raise ValueError(f"method must be a registry name or a VerificationMethod, got {type(method).__name__}")
    try:
        return METHODS[method]
    except KeyError:
        raise ValueError(f"unknown verification method {method!r}; known: {', '.join(sorted(METHODS))}") from None
