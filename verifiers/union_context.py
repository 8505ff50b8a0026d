"""Labels on a union tree of delayed trees: what every method's label hooks share (ALGORITHMS.md 4).

- ``UnionContext``: one union tree, its p rows and what methods gather from them once (``rows``:
  ``UnionRows``; ``cache(key)``: scratch shared between methods, e.g. Traversal's residual masses).
  ``decoding.labels.union_labels`` builds one per union tree and passes it to every method's
  ``union_block_efficiency`` / ``estimate_union_block_efficiency`` (base.VerificationMethod).
- ``branching_union_labels``: the factorized DP of top-down (OT) methods. In a delayed tree only the
  branch node has more than one child. Every one-child node accepts its child x with the solver's
  ``chain_acceptance`` (``min(1, p(x)/q(x))``; ``p(x)`` for nss), so with T[j] = P(reach trunk node j)
  and S[k, L2] = 1 + sum_{d=2..L2} P(reach depth d of rollout k | its first node accepted),
      E(K, L1, L2) = sum_{j=1..L1} T[j] + T[L1] * sum_{i<K} w_{L1,K,i} S[i, L2],
  where w_{L1,K,i} (``branch_weights``) is the branching probability of rollout i's first token at
  branch node L1 with K children (0 for a repeated token: the walk takes the first copy). Only the
  branch rows need O(V) work.
- ``per_action_labels``: a per-sub-tree function evaluated once per canonical action.
- ``repeated_verification``: mean and standard error of accepted + 1 over repeated verifications.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from decoding.actions import Action
from decoding.probability import as_float64
from decoding.tree import DraftTree
from decoding.union_tree import UnionTree

from .ratios import RatioTable

if TYPE_CHECKING:
    from .base import OTSolver, VerificationMethod


@dataclass
class UnionRows:
    """What the branching label path reads from the p/q rows of a union tree, gathered once and
    shared by all OT methods. J = len(space.L1) branch rows; shapes in comments."""

    trunk_p: np.ndarray  # [max L1] p(trunk token j | trunk node j-1), j = 1..max L1
    trunk_q: np.ndarray  # [max L1]
    roll_p: np.ndarray  # [J, Kmax, L2max-1] p of rollout nodes at depth offset d >= 1 given their parent
    roll_q: np.ndarray  # [J, Kmax, L2max-1]
    first: np.ndarray  # [J, Kmax] first token of each rollout
    p_b: np.ndarray  # [J, V] branch rows of p (a view when L1 is a contiguous range)
    q_b: np.ndarray  # [J, V]
    _tables: list[RatioTable] | None = None

    @property
    def tables(self) -> list[RatioTable]:
        """Likelihood-ratio tables of the branch rows (built once, shared by methods)."""
        if self._tables is None:
            self._tables = [RatioTable.build(self.p_b[j], self.q_b[j]) for j in range(self.p_b.shape[0])]
        return self._tables


def gather_union_rows(union: UnionTree, p_rows: np.ndarray) -> UnionRows:
    """Gather the scalars and branch rows the branching label path needs (see UnionRows)."""
    tree = union.tree
    if p_rows.shape != tree.q_rows.shape:
        raise ValueError(f"p_rows: expected shape {tree.q_rows.shape} (one row per union-tree node), got {p_rows.shape}")
    q_rows, tokens, parents = tree.q_rows, tree.tokens, tree.parents
    tj = np.arange(1, union.max_l1 + 1)
    ro = union.rollouts  # [J, Kmax, L2max]
    par, tok = parents[ro[..., 1:]], tokens[ro[..., 1:]]
    l1 = union.space.L1
    branch = slice(l1[0], l1[-1] + 1) if l1 == tuple(range(l1[0], l1[-1] + 1)) else np.asarray(l1)
    return UnionRows(
        trunk_p=as_float64(p_rows[tj - 1, tokens[tj]]), trunk_q=as_float64(q_rows[tj - 1, tokens[tj]]),
        roll_p=as_float64(p_rows[par, tok]), roll_q=as_float64(q_rows[par, tok]),
        first=tokens[ro[..., 0]] if ro.shape[2] else np.zeros(ro.shape[:2], dtype=np.int64),
        p_b=p_rows[branch], q_b=q_rows[branch])


@dataclass
class UnionContext:
    """One union tree and its ``[n, V]`` p rows, as the label hooks of every method see them."""

    union: UnionTree
    p_rows: np.ndarray  # [n, V] (validated by the caller)
    _rows: UnionRows | None = None
    _caches: dict[str, dict] = field(default_factory=dict)

    @property
    def rows(self) -> UnionRows:
        """Gathered scalars and branch rows (built on first use, shared by methods)."""
        if self._rows is None:
            self._rows = gather_union_rows(self.union, self.p_rows)
        return self._rows

    def cache(self, key: str) -> dict:
        """A scratch dict shared by every method that asks for ``key`` on this union tree."""
        return self._caches.setdefault(key, {})


def branching_union_labels(ctx: UnionContext, solver: OTSolver, name: str) -> np.ndarray:
    """``[len(space)]`` exact block efficiency of every action's sub-tree for a top-down method with
    this per-node solver (see the module docstring). ``name``: for error messages."""
    union, rows = ctx.union, ctx.rows
    ks, l1s, l2s, l1_pos = union.space.arrays()
    # trunk: reach[j] = P(reach trunk node j), e_trunk[L1] = sum_{j=1..L1} reach[j]
    tau = as_float64(solver.chain_acceptance(rows.trunk_p, rows.trunk_q))
    reach = np.concatenate([[1.0], np.cumprod(tau)])  # [max L1 + 1]
    e_trunk = np.concatenate([[0.0], np.cumsum(reach[1:])])
    ro = union.rollouts  # [J, Kmax, L2max]
    if ro.shape[2] == 0:
        return e_trunk[l1s] + 1.0
    # rollouts: s[j, k, L2] = expected accepted rollout tokens given its first node accepted
    alpha = as_float64(solver.chain_acceptance(rows.roll_p, rows.roll_q))  # [J, Kmax, L2max-1]
    pi = np.cumprod(np.concatenate([np.ones(ro.shape[:2] + (1,)), alpha], axis=-1), axis=-1)
    s = np.concatenate([np.zeros(ro.shape[:2] + (1,)), np.cumsum(pi, axis=-1)], axis=-1)  # [J, Kmax, L2max+1]
    w = solver.branch_weights(rows.p_b, rows.q_b, rows.first, tables=rows.tables)  # [J, K, i]
    big_w = np.einsum("jki,jil->jkl", w, s)  # [J, Kmax, L2max+1]
    labels = e_trunk[l1s] + reach[l1s] * big_w[l1_pos, ks - 1, l2s] + 1.0
    if not np.all(np.isfinite(labels)):
        raise ValueError(f"{name}: non-finite labels; check p_rows / q_rows for NaN")
    return labels


def per_action_labels(ctx: UnionContext, fn: Callable[[Action, np.ndarray], float | tuple[float, float]],
                      chains_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """``fn(action, nodes)`` (a float, or (mean, stderr)) for each canonical action and its sub-tree's
    ``nodes`` in the union tree, copied to the actions that share it; NaN where a chain-only method does not apply.
    Returns (values ``[A]``, stderr ``[A]``, 0 for exact values)."""
    space = ctx.union.space
    canon = space.canonical_array()
    vals, se = np.full(len(space), np.nan), np.zeros(len(space))
    for i in np.unique(canon):
        a = space.actions[i]
        if chains_only and not a.is_chain:
            continue
        out = fn(a, ctx.union.subtree_nodes(a))
        vals[i], se[i] = out if isinstance(out, tuple) else (out, 0.0)
    return vals[canon], se[canon]


def repeated_verification(method: VerificationMethod, tree: DraftTree, p_rows: np.ndarray, repeats: int,
                          rng: np.random.Generator | None) -> tuple[float, float]:
    """(mean, standard error) of accepted + 1 over ``repeats`` verifications of the same tree."""
    if repeats < 2:
        raise ValueError(f"repeats must be >= 2 to report a standard error, got {repeats}")
    if rng is None:
        raise ValueError(f"{method.name}: estimating labels by repeated verification needs an rng")
    eff = np.array([len(method.verify(tree, p_rows, rng)[0]) + 1.0 for _ in range(repeats)])
    return float(eff.mean()), float(eff.std(ddof=1) / np.sqrt(repeats))
