"""Exact Traversal / Block Verification labels of every action of a union tree in one sweep
(ALGORITHMS.md 3.2 and 4; the test sequence is traversal.py's).

On the delayed tree of (K, L1, L2), Traversal's fixed test sequence (post-order) is: rollout 1 as a
chain from its leaf up to its first node, rollout 2 likewise, ..., rollout K; then the branch node B
(trunk node L1); then trunk nodes L1-1, ..., 1; then the root (accepts surely). A test at depth d
that accepts ends the step with d + 1 tokens. Every test probability is fixed by the tree:
- trunk node i (one child) has the forward weight ``w_i = min(w_(i-1) p(x_i)/q(x_i), 1)`` and, once
  its child's subtree is rejected, ``h_i = S / (S + 1 - w_i)`` with ``S = w_i Z_i(1 / w_i)``
  (``Z_n(r) = sum (p_n - r q_n)+``, mass_numerics.py); the same holds for every rollout node;
- B starts at (w_B = w_L1, r = 0, z = 1); after rollout k is rejected, ``r' = r + z / w_B``,
  ``z' = Z_B(r')``, ``S = (w_B / z) z'`` and ``w_B' = S / (S + 1 - w_B)`` (the root keeps w = 1);
  rollout k + 1's first node starts from ``min(w_B max(p(x) - r q(x), 0) / (z q(x)), 1)``.
None of this depends on K or L2 beyond truncation: rollout k's weights are the same for every K >= k
and its h's for every L2. So, reading the sequence backwards, the value after B is
``V_B(K) = w_B(K) (L1 + 1) + (1 - w_B(K)) R_trunk(L1)``, and each rollout maps the value after it
affinely, ``V -> A_k[L2] + B_k[L2] V``, with prefix sums over its chain. One pass over each node's
rows per residual mass, O(K L2) arithmetic per action; equal to the per-action reference
(``traversal_expected_block_efficiency`` on each sub-tree) up to rounding (tests/test_labels.py).
"""

from __future__ import annotations

import numpy as np

from .mass_numerics import residual_mass
from .traversal import child_weight
from .union_context import UnionContext

CACHE_KEY = "traversal"  # UnionContext.cache key of the residual masses Z_n(r), keyed (n, r)


class _Masses:
    """Residual masses Z_n(r) of one union tree, memoized in the context (shared by traversal, bv, gbv)."""

    def __init__(self, ctx: UnionContext):
        self.p_rows, self.q_rows = ctx.p_rows, ctx.union.tree.q_rows
        self.cache = ctx.cache(CACHE_KEY)

    def __call__(self, n: int, r: float) -> float:
        key = (n, r)
        if key not in self.cache:
            self.cache[key] = residual_mass(self.p_rows[n], self.q_rows[n], r)
        return self.cache[key]

    def rejected_weight(self, n: int, w: float) -> float:
        """h: the weight of a node with one child (fresh laws, weight w) after that child's subtree
        was rejected; 0 when the node is removed (or was never reached: w = 0)."""
        if w <= 0.0:
            return 0.0
        s = w * self(n, 0.0 + 1.0 / w)  # (w / z) Z(r + z / w) with r = 0, z = 1
        return s / (s + 1.0 - w) if s > 0.0 else 0.0


def trunk_weights(ctx: UnionContext) -> tuple[np.ndarray, np.ndarray]:
    """``(w [max L1 + 1], h [max L1])`` of the trunk: forward weights (w[0] = 1, the root) and the
    weights after the one child's subtree was rejected (h[0] = 1: the root accepts surely).
    Cached in the context (GBV verifies the same trunk)."""
    cache = ctx.cache("trunk")
    if "w" not in cache:
        union, masses = ctx.union, _Masses(ctx)
        tokens, max_l1 = union.tree.tokens, union.max_l1
        w, h = np.ones(max_l1 + 1), np.ones(max_l1)
        for i in range(1, max_l1 + 1):
            w[i] = child_weight(ctx.p_rows[i - 1], union.tree.q_rows[i - 1], int(tokens[i]), float(w[i - 1]))
            if i < max_l1:
                h[i] = masses.rejected_weight(i, float(w[i]))
        cache["w"], cache["h"] = w, h
    return cache["w"], cache["h"]


def _rollout_map(ctx: UnionContext, masses: _Masses, nodes: np.ndarray, w1: float, depth0: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(A [L2max + 1], B [L2max + 1])``: the rollout chain ``nodes`` (first node weight w1, first
    node at tree depth depth0 + 1) truncated at L2 tokens maps the value after it, V, to A + B V."""
    p_rows, q_rows, tokens = ctx.p_rows, ctx.union.tree.q_rows, ctx.union.tree.tokens
    n = len(nodes)
    w = np.empty(n + 1)  # w[i]: weight of the rollout node at depth i (1-based)
    w[1] = w1
    for i in range(2, n + 1):
        parent = int(nodes[i - 2])
        w[i] = child_weight(p_rows[parent], q_rows[parent], int(tokens[nodes[i - 1]]), float(w[i - 1]))
    a, b = np.zeros(n + 1), np.ones(n + 1)  # a[m] + b[m] V: tests of nodes m, ..., 1 after the leaf
    big_a, big_b = np.zeros(n + 1), np.ones(n + 1)  # L2 = 0: no rollout, identity
    for m in range(1, n + 1):
        v = depth0 + m + 1.0
        big_a[m] = w[m] * v + (1.0 - w[m]) * a[m - 1]  # leaf at depth m, then nodes m-1..1
        big_b[m] = (1.0 - w[m]) * b[m - 1]
        if m < n:
            h = masses.rejected_weight(int(nodes[m - 1]), float(w[m]))
            a[m] = h * v + (1.0 - h) * a[m - 1]
            b[m] = (1.0 - h) * b[m - 1]
    return big_a, big_b


def _compute(ctx: UnionContext, k_max: int) -> np.ndarray:
    union, p_rows = ctx.union, ctx.p_rows
    space, tree, ro = union.space, union.tree, union.rollouts  # ro [J, Kmax, L2max]
    masses = _Masses(ctx)
    w_t, h_t = trunk_weights(ctx)
    r_trunk = np.ones(union.max_l1 + 1)  # r_trunk[j]: value of testing trunk nodes j-1..1, then the root
    for i in range(1, union.max_l1):
        r_trunk[i + 1] = h_t[i] * (i + 1) + (1.0 - h_t[i]) * r_trunk[i]
    out = np.full(len(space), np.nan)
    ks, l1s, l2s, _ = space.arrays()
    for row, j in enumerate(space.L1):
        maps, w_b = [], [float(w_t[j])]  # w_b[k]: B's weight after k rollouts were rejected
        w, r, z = float(w_t[j]), 0.0, 1.0
        for k in range(min(k_max, ro.shape[1]) if ro.shape[2] else 0):
            if w <= 0.0:  # B removed: later rollouts are never tested
                maps.append((np.zeros(ro.shape[2] + 1), np.ones(ro.shape[2] + 1)))
                w_b.append(0.0)
                continue
            x = int(tree.tokens[ro[row, k, 0]])
            w1 = child_weight(p_rows[j], tree.q_rows[j], x, w, r, z)
            maps.append(_rollout_map(ctx, masses, ro[row, k], w1, j))
            if j == 0 and k == k_max - 1:
                break  # the root accepts surely after the last rollout: no update needed
            r_new = r + z / w
            z_new = masses(j, r_new)
            s = (w / z) * z_new
            if j == 0:
                if z_new > 0.0:
                    r, z = r_new, z_new
            else:
                w = s / (s + 1.0 - w) if s > 0.0 else 0.0
                r, z = r_new, z_new
            w_b.append(w)
        sel = np.flatnonzero(l1s == j)
        for i in sel:
            k, l2 = int(ks[i]), int(l2s[i])
            if k <= k_max or l2 == 0:
                if l2 == 0:
                    k = 0  # a chain: B = trunk node L1 is the leaf
                value = 1.0 if j == 0 else w_b[k] * (j + 1.0) + (1.0 - w_b[k]) * r_trunk[j]
                for kk in range(k - 1, -1, -1):
                    big_a, big_b = maps[kk]
                    value = big_a[l2] + big_b[l2] * value
                out[i] = value
    return out


def delayed_traversal_labels(ctx: UnionContext, chains_only: bool = False) -> np.ndarray:
    """``[len(space)]`` exact Traversal labels of every action (``chains_only``: Block Verification,
    NaN for K > 1 trees). Computed once per union tree; Block Verification reuses Traversal's."""
    cache = ctx.cache("traversal_labels")
    k_max = 1 if chains_only else ctx.union.space.K[-1]
    if cache.get("k_max", 0) < k_max:
        cache["k_max"], cache["labels"] = k_max, _compute(ctx, k_max)
    labels = cache["labels"].copy()
    if chains_only:
        labels[[not a.is_chain for a in ctx.union.space.actions]] = np.nan
    return labels

