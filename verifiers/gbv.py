"""Greedy multi-path Block Verification (GBV; Thomas & Pal, arXiv 2602.16961) on delayed trees
(ALGORITHMS.md section 3.3).

Terms:
- *order at a node*: tokens by the unclipped ratio ``s = p/q`` (float64), ties by token id, the
  smaller id ranking higher (gbv_numerics.py). One strict total order, fixed by the node's rows.
- *greedy path*: the trunk, then the lexicographic maximum of the K rollouts under these orders: at
  each depth keep the rollouts whose token is the largest among those still tied (rollouts tied to
  the end carry the same tokens; the first by position is taken).
- *proposal law* q~ of the greedy path: q on the trunk (each trunk node has one child), and below
  the branch node the law of the lexicographic maximum of K i.i.d. q-paths given its prefix, in the
  scaled form of section 3.3: rho = 1 at the branch node,
  ``q~(t) = q(t) sum_{i<K} G^i F^(K-1-i) / sum_{i<K} (1-rho)^i``, then ``rho <- rho q(t*) / G(t*)``.
- GBV verifies the greedy path as ONE block: Block Verification (traversal.py on a chain) of trunk +
  greedy rollout against p, with q~ as the draft law at every path node.

Why trunk and branch combine losslessly: drafting the delayed tree and keeping its greedy path is
one way of drafting a single path, and that path's law is autoregressive with conditionals q~ (the
trunk is drawn from q first; the order at a node depends only on p, q at that prefix, fixed by the
context; and the lexicographic maximum of K i.i.d. paths is built prefix by prefix with exactly the
conditionals above). Block Verification is lossless for any draft path drawn from an autoregressive
law that it is given row by row, so verifying trunk + rollout as one block against q~ emits exactly
p's law. With K = 1 (or L2 = 0) q~ = q bit for bit and GBV is ``bv``. Proven by exact enumeration
(tests/test_gbv.py).

Label: the greedy path and q~ are fixed by the tree, so GBV is a fixed test sequence like Traversal
and its block efficiency is exact. On a union tree (``gbv_union_labels``) the greedy path of a
branch depth L1 and a K serves every L2 (the lexicographic maximum of truncated rollouts is the
truncation of the maximum), and BV's expectation on a chain is a recursion:
``E(n) = w_n (n + 1) + (1 - w_n) R_{n-1}``, ``R_i = h_i (i + 1) + (1 - h_i) R_{i-1}``, ``R_0 = 1``, with
w the forward weights ``w_i = min(w_{i-1} p(x_i)/q~(x_i), 1)`` and ``h_i = S_i / (S_i + 1 - w_i)``,
``S_i = sum (w_i p_i - q~_i)+`` (gbv_numerics.excess, no sort of the vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from decoding.actions import Action
from decoding.probability import as_float64
from decoding.tree import DraftTree

from .gbv_numerics import NodeBuffers, excess, lexmax_at, ratio
from .traversal import (
    traversal_expected_block_efficiency,
    traversal_expected_block_efficiency_mc,
    traversal_outcome_distribution,
    traversal_verify,
)
from .traversal_union import delayed_traversal_labels, trunk_weights
from .union_context import UnionContext, per_action_labels


def ratio_keys(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``[V]`` unclipped ratios p/q in float64 (inf where q = 0: such tokens are never drawn)."""
    p64, q64 = as_float64(p), as_float64(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q64 > 0, p64 / np.where(q64 > 0, q64, 1.0), np.inf)


def greater(s: np.ndarray, a: int, b: int) -> bool:
    """Whether token a ranks above token b in the node's order (ratio, then the smaller id)."""
    return bool(s[a] > s[b] or (s[a] == s[b] and a < b))


def lexmax_row(p: np.ndarray, q: np.ndarray, rho: float, k: int) -> np.ndarray:
    """``[V]`` law of the next token of the lexicographic maximum of k i.i.d. paths (reference: sorts
    the vocabulary). rho in (0, 1]; k = 1 returns q itself."""
    q64 = as_float64(q)
    if k == 1:
        return q64
    s = ratio_keys(p, q)
    order = np.lexsort((-np.arange(s.shape[0]), s))  # ascending: ratio, then id descending
    qs = q64[order]
    c_lt = np.concatenate([[0.0], np.cumsum(qs)[:-1]])  # [V] q-mass below each token
    f = (1.0 - rho) + rho * c_lt
    g = f + rho * qs
    m = sum(g**i * f ** (k - 1 - i) for i in range(k)) / sum((1.0 - rho) ** i for i in range(k))
    out = np.zeros_like(q64)
    out[order] = qs * m
    return out


def _g_at(q: np.ndarray, s: np.ndarray, t: int, rho: float) -> float:
    """G(t) = (1 - rho) + rho * (q-mass of the tokens up to and including t in the order)."""
    below = (s < s[t]) | ((s == s[t]) & (np.arange(s.shape[0]) >= t))
    return (1.0 - rho) + rho * float(as_float64(q)[below].sum())


@dataclass(frozen=True)
class GreedyChain:
    """The greedy path of a delayed tree as a chain for traversal.py: chain node i = ``nodes[i]``."""

    nodes: np.ndarray  # [n] tree node indices (root first)
    tokens: np.ndarray  # [n] (tokens[0] = -1)
    parents: np.ndarray  # [n]
    depths: np.ndarray  # [n]
    children: list[list[int]]
    q_rows: np.ndarray  # [n, V] proposal law q~ of each node's child (zeros at the leaf)


def is_delayed(tree: DraftTree) -> bool:
    """At most one node has several children, and all leaves are at one depth (equal rollouts)."""
    leaves = {int(tree.depths[i]) for i, c in enumerate(tree.children) if not c}
    return sum(len(c) > 1 for c in tree.children) <= 1 and len(leaves) == 1


def greedy_chain(tree: DraftTree, p_rows: np.ndarray) -> GreedyChain:
    """Greedy path of a delayed tree and its proposal rows q~ (reference: full rows, sorted)."""
    path, rows = [0], []
    node = 0
    while len(tree.children[node]) == 1:  # trunk
        rows.append(as_float64(tree.q_rows[node]))
        node = tree.children[node][0]
        path.append(node)
    cands = list(tree.children[node])  # rollouts still tied with the maximum (their node at this depth)
    k, rho = len(cands), 1.0
    while cands:
        s = ratio_keys(p_rows[node], tree.q_rows[node])
        best = int(tree.tokens[cands[0]])
        for c in cands[1:]:
            if greater(s, int(tree.tokens[c]), best):
                best = int(tree.tokens[c])
        rows.append(lexmax_row(p_rows[node], tree.q_rows[node], rho, k))
        if k > 1:
            rho = rho * float(tree.q_rows[node][best]) / _g_at(tree.q_rows[node], s, best, rho)
        tied = [c for c in cands if int(tree.tokens[c]) == best]
        node = tied[0]
        path.append(node)
        cands = [tree.children[c][0] for c in tied if tree.children[c]]
    rows.append(np.zeros(tree.q_rows.shape[1]))
    n = len(path)
    return GreedyChain(np.asarray(path, dtype=np.int64), tree.tokens[path], np.arange(-1, n - 1, dtype=np.int64),
                       np.arange(n, dtype=np.int64), [[i + 1] for i in range(n - 1)] + [[]], np.stack(rows))


def _chain_rows(tree: DraftTree, p_rows: np.ndarray) -> tuple[GreedyChain, np.ndarray]:
    chain = greedy_chain(tree, p_rows)
    return chain, p_rows[chain.nodes]


def gbv_verify(tree: DraftTree, p_rows: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
    """One verification: (accepted tree nodes in path order, emitted token)."""
    chain, p_chain = _chain_rows(tree, p_rows)
    accepted, token = traversal_verify(chain, p_chain, rng)
    return [int(chain.nodes[i]) for i in accepted], token


def gbv_outcome_distribution(tree: DraftTree, p_rows: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact law of (accepted tokens..., emitted token)."""
    return traversal_outcome_distribution(*_chain_rows(tree, p_rows))


def gbv_expected_block_efficiency(tree: DraftTree, p_rows: np.ndarray) -> float:
    """Exact E[accepted + 1] over the verification randomness."""
    return traversal_expected_block_efficiency(*_chain_rows(tree, p_rows))


def chain_expectations(w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """``[n+1]`` BV's E[accepted + 1] on the first m nodes of a path, m = 0..n, from the forward
    weights w ``[n+1]`` (w[0] = 1) and the rejection-updated weights h ``[n]`` (h[0] = 1: the root)."""
    r = np.empty(len(h))
    r[0] = 1.0
    for i in range(1, len(h)):
        r[i] = h[i] * (i + 1) + (1.0 - h[i]) * r[i - 1]
    e = np.empty(len(w))
    e[0] = 1.0
    e[1:] = w[1:] * np.arange(2, len(w) + 1) + (1.0 - w[1:]) * r[: len(w) - 1]
    return e


def _h(s_mass: float, w: float) -> float:
    """Weight of a node after its child's subtree was rejected (traversal.py; 0: node removed)."""
    return s_mass / (s_mass + 1.0 - w) if s_mass > 0.0 else 0.0


@dataclass
class _GreedyPath:
    """One K's greedy chain below the branch node, built depth by depth."""

    w: list[float]  # forward weights of the chain nodes so far (root first)
    h: list[float]  # weights after rejection of the chain nodes whose child is known
    node: int  # current chain node (union index)
    cands: list[int]  # rollouts still tied with the maximum
    rho: float = 1.0


def gbv_union_labels(ctx: UnionContext) -> np.ndarray:
    """``[len(space)]`` exact GBV labels of every action of a union tree (see the module docstring).
    K = 1 and L2 = 0 actions are Block Verification's labels (traversal_union.py, shared with ``bv``),
    and so is the trunk part of every greedy chain. The greedy chains of all K at one branch depth
    advance together, one depth at a time, so each node's ratio buckets are built once, into buffers
    reused for every node."""
    union, p_rows = ctx.union, ctx.p_rows
    tree, space = union.tree, union.space
    q_rows, tokens = tree.q_rows, tree.tokens
    out = delayed_traversal_labels(ctx, chains_only=True)  # K = 1, L2 = 0: GBV is BV
    ro = union.rollouts  # [J, Kmax, L2max]
    l2max, ks = ro.shape[2], [k for k in space.K if k > 1]
    if not l2max or not ks:
        return out
    w_t, h_t = trunk_weights(ctx)
    buf = NodeBuffers(tree.vocab_size)
    mem = buf.members_args()
    for row, j in enumerate(space.L1):
        paths = {k: _GreedyPath(list(w_t[: j + 1]), list(h_t[:j]), j, list(range(k))) for k in ks}
        for d in range(l2max):
            at: dict[int, list[int]] = {}
            for k, path in paths.items():
                at.setdefault(path.node, []).append(k)
            for node, group in at.items():
                p, q = as_float64(p_rows[node]), as_float64(q_rows[node])
                node_rows, p_free = buf.fill(p, q)
                for k in group:
                    path = paths[k]
                    toks = [int(tokens[ro[row, c, d]]) for c in path.cands]
                    best, s_best = toks[0], ratio(p, q, toks[0])
                    for t in toks[1:]:  # the largest token in the node's order (ratio, then the smaller id)
                        s_t = ratio(p, q, t)
                        if s_t > s_best or (s_t == s_best and t < best):
                            best, s_best = t, s_t
                    q_best, g = lexmax_at(node_rows, mem, best, path.rho, k)
                    w = path.w[-1]
                    if node == 0:
                        path.h.append(1.0)
                    elif w > 0.0:
                        path.h.append(_h(excess(node_rows, mem, p_free, w, path.rho, k), w))
                    else:
                        path.h.append(0.0)
                    path.rho = path.rho * float(q[best]) / g
                    path.w.append(min(w * float(p[best]) / q_best, 1.0))
                    path.cands = [c for c, t in zip(path.cands, toks, strict=True) if t == best]
                    path.node = int(ro[row, path.cands[0], d])
        for k, path in paths.items():
            e = chain_expectations(np.asarray(path.w), np.asarray(path.h[: len(path.w) - 1]))
            for l2 in space.L2:
                if l2 > 0:
                    out[space.index(Action(k, j, l2))] = e[j + l2]
    return out


@dataclass
class GBVMethod:
    """Registry entry ``gbv``: greedy multi-path Block Verification on delayed trees."""

    name: str = "gbv"
    description: str = "greedy multi-path Block Verification (lexicographic-max rollout, BV against its law)"
    chains_only: ClassVar[bool] = False
    exact_block_efficiency: ClassVar[bool] = True

    def supports(self, tree: DraftTree) -> bool:
        return is_delayed(tree)

    def _check(self, tree: DraftTree) -> None:
        if not is_delayed(tree):
            raise ValueError(f"method {self.name!r} is defined on delayed trees (one branch node, rollouts of "
                             f"equal length), got a tree of action {tree.action}; use 'traversal'")

    def verify(self, tree, p_rows, rng):
        self._check(tree)
        return gbv_verify(tree, p_rows, rng)

    def outcome_distribution(self, tree, p_rows):
        self._check(tree)
        return gbv_outcome_distribution(tree, p_rows)

    def expected_block_efficiency(self, tree, p_rows):
        self._check(tree)
        return gbv_expected_block_efficiency(tree, p_rows)

    def union_block_efficiency(self, ctx: UnionContext) -> np.ndarray:
        return gbv_union_labels(ctx)

    def estimate_union_block_efficiency(self, ctx, repeats, rng):
        """Repeated verification of each action's greedy chain (the reference path: it sorts rows)."""
        if rng is None:
            raise ValueError(f"{self.name}: estimating labels by repeated verification needs an rng")

        def one(a: Action, nodes: np.ndarray) -> tuple[float, float]:
            chain, p_chain = _chain_rows(ctx.union.subtree(a), ctx.p_rows[nodes])
            return traversal_expected_block_efficiency_mc(chain, p_chain, repeats, rng)

        return per_action_labels(ctx, one, False)
