"""Protocols of the verifier registry (ALGORITHMS.md section 3).

Vocabulary:
- *accepted tokens*: draft tokens on the root-to-node path the verifier keeps;
- *emitted token*: the one extra token every step produces: a *correction* (drawn from a residual
  after a rejection) or a *bonus* (drawn from p at a leaf);
- *branching probability* ``B_n(t)``: probability that the per-node solver at node n emits the
  child token t (OT-based methods only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from ..tree import DraftTree


@runtime_checkable
class OTSolver(Protocol):
    """Per-node solver of an OT-based (top-down) verifier.

    ``children`` are the child TOKENS of the node (duplicates allowed, i.i.d. from q). Whenever they
    are i.i.d. from q, the emitted token is distributed as p."""

    name: str

    def sample(self, p: np.ndarray, q: np.ndarray, children: Sequence[int], rng: np.random.Generator) -> int:
        """Emit one token."""
        ...

    def output_distribution(self, p: np.ndarray, q: np.ndarray, children: Sequence[int]) -> np.ndarray:
        """``[V]`` exact law of the emitted token given these children (no sampling)."""
        ...


@runtime_checkable
class VerificationMethod(Protocol):
    """One entry of the registry ``decoding.verifiers.METHODS``.

    ``p_rows`` is ``[n, V]``: p(.|root+path(node)) for every node of the tree."""

    name: str
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
