"""The verifier registry: the ONE place that maps method names to verification methods.

Every entry implements ``VerificationMethod`` (base.py): ``verify``, the exact law of the step's
tokens (``outcome_distribution``), and, for OT-based methods, the exact block-efficiency DP. The
exact-enumeration harness (decoding/exact.py) treats all entries alike.

Names: ``naive`` (standard speculative sampling; chains only, on trees use ``naive_tree``), ``nss``,
``naive_tree``, ``specinfer``, ``spectr``, ``khisti`` (OT-based), ``traversal`` (Traversal
Verification), ``bv`` (Block Verification = traversal restricted to chains) and ``gbv`` (greedy
multi-path Block Verification, gbv.py). Traversal's test
sequence is fixed by the tree (traversal.py), so its block efficiency is exact too. ``khisti`` and
``traversal``/``bv`` live in khisti.py and traversal.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Protocol

import numpy as np

from decoding.errors import UserInputError
from decoding.method_names import CHAIN_EQUIVALENT, METHOD_NAMES
from decoding.tree import DraftTree

from . import traversal
from .base import ChainRestricted, VerificationMethod
from .gbv import GBVMethod
from .khisti import KhistiSolver
from .ot import OTMethod, make_ot_methods
from .traversal_union import delayed_traversal_labels
from .union_context import UnionContext, per_action_labels, repeated_verification


class SubtreeLabelFn(Protocol):
    """Exact E[accepted + 1] on the sub-tree of ``tree`` induced by ``nodes`` (None: the whole tree);
    ``mass_cache``: scratch shared between calls on the same (tree, p_rows)."""

    def __call__(self, tree: DraftTree, p_rows: np.ndarray, nodes: np.ndarray | None = None,
                 mass_cache: dict | None = None) -> float: ...


class SubtreeEstimateFn(Protocol):
    """(mean, standard error) of accepted + 1 over ``repeats`` verifications of that sub-tree."""

    def __call__(self, tree: DraftTree, p_rows: np.ndarray, repeats: int, rng: np.random.Generator,
                 nodes: np.ndarray | None = None, mass_cache: dict | None = None) -> tuple[float, float]: ...


@dataclass
class BottomUpMethod(ChainRestricted):
    """A verifier given by plain functions (Traversal / Block Verification). Its label is exact when
    ``block_efficiency_fn`` is given (Traversal's fixed test sequence, traversal.py); on a union tree
    ``union_fn`` gives the exact labels of all actions at once (traversal_union.py; the per-action
    reference is labels.reference_union_labels). Estimates run per canonical action, sharing one
    residual-mass cache; without ``block_efficiency_mc_fn`` they verify copied sub-trees repeatedly."""

    name: str
    verify_fn: Callable[[DraftTree, np.ndarray, np.random.Generator], tuple[list[int], int]]
    outcome_fn: Callable[[DraftTree, np.ndarray], dict[tuple[int, ...], float]]
    block_efficiency_fn: SubtreeLabelFn | None = None
    block_efficiency_mc_fn: SubtreeEstimateFn | None = None
    chains_only: bool = False
    description: str = ""
    mass_cache_key: str = "traversal"  # UnionContext.cache key: methods with the same residual masses share it
    union_fn: Callable[[UnionContext], np.ndarray] | None = None  # all actions of a union tree at once
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

    def union_block_efficiency(self, ctx: UnionContext) -> np.ndarray:
        if self.union_fn is None:
            raise NotImplementedError(f"method {self.name!r} has no exact union-tree labels; "
                                      "estimate them by repeated verification (union_labels(..., repeats=64))")
        return self.union_fn(ctx)

    def estimate_union_block_efficiency(self, ctx, repeats, rng):
        if rng is None:
            raise ValueError(f"{self.name}: estimating labels by repeated verification needs an rng")
        mc, tree, cache = self.block_efficiency_mc_fn, ctx.union.tree, ctx.cache(self.mass_cache_key)
        if mc is not None:
            return per_action_labels(ctx, lambda _, nodes: mc(tree, ctx.p_rows, repeats, rng, nodes, cache),
                                     self.chains_only)
        return per_action_labels(
            ctx, lambda a, nodes: repeated_verification(self, ctx.union.subtree(a), ctx.p_rows[nodes], repeats, rng),
            self.chains_only)


def _build() -> dict[str, VerificationMethod]:
    fns = (traversal.traversal_verify, traversal.traversal_outcome_distribution,
           traversal.traversal_expected_block_efficiency, traversal.traversal_expected_block_efficiency_mc)
    methods: list[VerificationMethod] = [
        *make_ot_methods(),
        OTMethod("khisti", KhistiSolver(),
                 description="Khisti et al. importance-weighted selection (pairwise LP tournament)"),
        BottomUpMethod("traversal", *fns, description="Traversal Verification (bottom-up, sequence level)",
                       union_fn=delayed_traversal_labels),
        BottomUpMethod("bv", *fns, chains_only=True, description="Block Verification (= traversal on chains)",
                       union_fn=partial(delayed_traversal_labels, chains_only=True)),
        GBVMethod(),
    ]
    registry = {m.name: m for m in methods}
    if tuple(registry) != METHOD_NAMES:
        raise RuntimeError(f"decoding/method_names.py lists {METHOD_NAMES}, the registry builds {tuple(registry)}")
    return registry


METHODS: dict[str, VerificationMethod] = _build()


def chain_equivalent_methods() -> tuple[str, ...]:
    """The methods that verify a chain (K = 1) exactly as standard speculative sampling (`naive`) does, so their
    chain labels are naive's: every OT-based method but nss (ALGORITHMS.md 3); not traversal, bv or gbv (Block
    Verification on a chain). Declared once, light, in `decoding.method_names.CHAIN_EQUIVALENT` (config validation
    reads it without loading the verifiers); proved in tests/test_verifiers_exact.py."""
    return CHAIN_EQUIVALENT


def get_method(method: str | VerificationMethod) -> VerificationMethod:
    """Look a method up by name (a method object is returned as is)."""
    if not isinstance(method, str):
        if isinstance(method, VerificationMethod):
            return method
        raise UserInputError(f"method must be a registry name or a VerificationMethod, got {type(method).__name__}")
    try:
        return METHODS[method]
    except KeyError:
        raise UserInputError(f"unknown verification method {method!r}; known: {', '.join(sorted(METHODS))}") from None
