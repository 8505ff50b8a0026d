"""Protocols of the verifier registry (ALGORITHMS.md section 3).

Vocabulary:
- *accepted tokens*: draft tokens on the root-to-node path the verifier keeps;
- *emitted token*: the one extra token every step produces: a *correction* (drawn from a residual
  after a rejection) or a *bonus* (drawn from p at a leaf);
- *branching probability* ``B_n(t)``: probability that the per-node solver at node n emits the
  child token t (OT-based methods only);
- *label*: E[accepted + 1] of an action's tree over the verification randomness (ALGORITHMS.md 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

import numpy as np

from decoding.probability import acceptance
from decoding.tree import DraftTree

if TYPE_CHECKING:
    from .ratios import RatioTable
    from .union_context import UnionContext


@runtime_checkable
class OTSolver(Protocol):
    """Per-node solver of an OT-based (top-down) verifier.

    ``children`` are the child TOKENS of the node (duplicates allowed, i.i.d. from q). Whenever they
    are i.i.d. from q, the emitted token is distributed as p. Besides sampling and the exact law, a
    solver gives the label path (union_context.branching_union_labels) two batched helpers that use
    the same formulas as ``output_distribution`` (so they agree to rounding)."""

    name: str

    def sample(self, p: np.ndarray, q: np.ndarray, children: Sequence[int], rng: np.random.Generator) -> int:
        """Emit one token."""
        ...

    def output_distribution(self, p: np.ndarray, q: np.ndarray, children: Sequence[int]) -> np.ndarray:
        """``[V]`` exact law of the emitted token given these children (no sampling)."""
        ...

    def chain_acceptance(self, p_x: np.ndarray, q_x: np.ndarray) -> np.ndarray:
        """Branching probability of the only child x of a one-child node, elementwise over arrays of
        ``p(x)``, ``q(x)`` (any shape)."""
        ...

    def branch_weights(self, p: np.ndarray, q: np.ndarray, tokens: np.ndarray,
                       tables: list[RatioTable] | None = None) -> np.ndarray:
        """``[J, Kmax, Kmax]``: for rows j (p, q ``[J, V]``), K = 1..Kmax and child positions i < K, the
        branching probability of child i's token at a node whose children are ``tokens[j, :K]``
        (``[J, Kmax]``), or 0 when i >= K or an earlier child has the same token (the walk moves to
        the FIRST copy, by position). ``tables``: ratios.RatioTable per row, when already built."""
        ...


class StandardChainSolver:
    """Mixin for solvers whose one-child case is standard speculative sampling (all but ``nss``)."""

    @staticmethod
    def chain_acceptance(p_x: np.ndarray, q_x: np.ndarray) -> np.ndarray:
        return acceptance(p_x, q_x)


@runtime_checkable
class VerificationMethod(Protocol):
    """One entry of the registry ``verifiers.METHODS``.

    ``p_rows`` is ``[n, V]``: p(.|root+path(node)) for every node of the tree. The two label hooks
    work on a whole union tree (union_tree.py; ``ctx``: union_context.UnionContext, shared by the
    methods of one ``decoding.labels.union_labels`` call) and return ``[len(space)]`` arrays with NaN
    for actions the method does not support (``chains_only`` methods on branching trees)."""

    name: str
    description: str
    chains_only: bool  # defined on chains only (K = 1 or L2 = 0)
    exact_block_efficiency: bool  # True when expected_block_efficiency is exact (not an estimate)

    def supports(self, tree: DraftTree) -> bool:
        """Whether the method is defined on this tree shape (e.g. chain-only methods)."""
        ...

    def verify(self, tree: DraftTree, p_rows: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
        """One verification: (accepted node indices, root excluded, in path order; emitted token)."""
        ...

    def outcome_distribution(self, tree: DraftTree, p_rows: np.ndarray) -> dict[tuple[int, ...], float]:
        """Exact law of ``accepted tokens + (emitted token,)`` over the verification randomness."""
        ...

    def expected_block_efficiency(self, tree: DraftTree, p_rows: np.ndarray) -> float:
        """Exact E[accepted + 1] over verification randomness (NotImplementedError if no closed form)."""
        ...

    def union_block_efficiency(self, ctx: UnionContext) -> np.ndarray:
        """``[A]`` exact E[accepted + 1] of every action's sub-tree (NotImplementedError when
        ``exact_block_efficiency`` is False)."""
        ...

    def estimate_union_block_efficiency(self, ctx: UnionContext, repeats: int,
                                        rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """``([A] mean, [A] standard error)`` of accepted + 1 over ``repeats`` verifications of every
        action's sub-tree. Methods whose exact label costs less than one verification (the top-down
        DP) return it with standard error 0."""
        ...


class ChainRestricted:
    """Mixin for registry methods with a ``chains_only`` flag (``naive``, ``bv``): they are defined on
    chains only (K = 1 or L2 = 0) and point the user to ``tree_alternative`` on branching trees."""

    chains_only: bool
    name: str
    tree_alternative: ClassVar[str] = "a tree method"

    def supports(self, tree: DraftTree) -> bool:
        return not self.chains_only or all(len(c) <= 1 for c in tree.children)

    def _check(self, tree: DraftTree) -> None:
        if not self.supports(tree):
            raise ValueError(f"method {self.name!r} is defined on chains only (K = 1 or L2 = 0), got action "
                             f"{tree.action}; use {self.tree_alternative}")


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one verification step."""

    tokens: tuple[int, ...]  # accepted draft tokens, then exactly one emitted token
    accepted_nodes: tuple[int, ...]  # node indices of the accepted tokens (root excluded)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)

    @property
    def emitted_token(self) -> int:
        return self.tokens[-1]

    @property
    def block_efficiency(self) -> int:
        """Tokens produced by this step's target pass: accepted + 1."""
        return len(self.tokens)
