"""Traversal Verification (Weng et al. 2025, arXiv 2505.12398), bottom-up, for i.i.d. draft trees.

Terms (ALGORITHMS.md section 3.2). Each node n carries a target law M_b(.|n) (starts as p), a draft
law M_s(.|n) (starts as q) and a weight w(n): w(root) = 1, and for a child x of n
`w(x) = min(w(n) M_b(x|n) / M_s(x|n), 1)`. Leaves are tested in post-order DFS: with eta ~ U(0, 1),
`eta < w(leaf)` accepts the whole root-to-leaf path; otherwise the leaf is deleted and its parent A is
updated: `S = sum_x (w(A) M_b(x|A) - M_s(x|A))+`, `M_b(.|A) <- norm((w(A) M_b(.|A) - M_s(.|A))+)`,
`w(A) <- S / (S + 1 - w(A))`, and the w of A's remaining descendants is recomputed by the init rule.
A node left without children is tested in turn; a node whose w drops to 0 is removed (it and its
subtree are rejected surely). The step emits the accepted path, then one token ~ M_b(.|end): the
residual if the end node lost children, else p. With one child per node (K = 1) this is Block
Verification (`bv`, Sun et al. 2024).

Drafting WITH replacement (our i.i.d. rollouts): M_s(.|A) stays q(.|A) after a rejection. Proof that
this is lossless. Claim: for a node A in state (w, b, q) whose remaining children are i.i.d. draws from
q (each with an independently drafted subtree), processing A's remaining subtree, A's own test
included, accepts a path through A with probability w, and given that, the emitted continuation after
A has law b(y1) p(y2|A y1) p(y3|A y1 y2) ... (the target's, with b in place of p(.|A)). Induction on
the subtree: a leaf is accepted with probability w and emits y ~ b. Otherwise take the first child
x ~ q; by induction on x's subtree (state w(x) = min(w b(x)/q(x), 1), b = p(.|A x)) it accepts a path
through x with probability w(x), so P(accept through x, next token y) = q(y) min(w b(y)/q(y), 1) =
min(w b(y), q(y)), continuation then p. With m = sum_y min(w b(y), q(y)) = w - S, x's subtree is
rejected with probability 1 - m, and this event depends only on x, its subtree and their tests, so the
remaining children are still i.i.d. q: M_s unchanged is exactly right. A's new state is
b' = (w b - q)+ / S, w' = S / (S + 1 - w) = S / (1 - m), and by induction (one child fewer) the rest
accepts with probability w' emitting b'. Total: min(w b(y), q(y)) + (1 - m) w' b'(y)
= min(w b(y), q(y)) + (w b(y) - q(y))+ = w b(y). At the root (w = 1, b = p) the step emits exactly
the target's law. (If S = 0 then w' = 0: A is removed, matching the zero term.)

Consequence used here: the update at A does not depend on WHICH child was rejected, so conditional
on all earlier tests rejecting, every later state is fixed by the tree. Verification is therefore a
fixed sequence of tests (the nodes in post-order, the root last with w = 1) with deterministic
acceptance probabilities a_t; it stops at the first success. `traversal_schedule` computes that
sequence once; sampling, the exact outcome law and the expected block efficiency all read from it.
The residual after j rejections is kept in closed form: b = (p - r q)+ / Z(r), Z(r) = sum (p - r q)+,
with r <- r + Z(r)/w per rejection (since ((w/Z)(p - r q)+ - q)+ = (w/Z)(p - (r + Z/w) q)+), so a
node costs one O(V) pass per rejected child and O(1) per child weight.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from decoding.probability import categorical

from .mass_numerics import residual_mass


@dataclass(frozen=True)
class TraversalSchedule:
    """The fixed test sequence of one verification: test t stops the step with probability accept[t]."""

    nodes: np.ndarray  # [T] int64 node tested at t, in post-order (root last); removed nodes omitted
    accept: np.ndarray  # [T] float64 w(node) when tested = P(accept | all earlier tests rejected)
    r: np.ndarray  # [T] float64 residual shift: M_b(.|node) = (p - r q)+ / z  (r = 0: p itself)
    z: np.ndarray  # [T] float64 normalizer Z(r) of that residual

    def stop_probabilities(self) -> np.ndarray:
        """[T] P(the step ends at test t) = a_t prod_{u<t} (1 - a_u)."""
        survive = np.concatenate([[1.0], np.cumprod(1.0 - self.accept)[:-1]])
        return self.accept * survive


def child_weight(p_row: np.ndarray, q_row: np.ndarray, token: int, w: float, r: float = 0.0, z: float = 1.0) -> float:
    """Initial weight ``min(w M_b(x) / M_s(x), 1)`` of a child with ``token`` under a node of weight w
    whose target law is the residual (p - r q)+ / z (r = 0, z = 1: p itself) and draft law q."""
    qx = float(q_row[token])
    if not qx > 0.0:
        raise ValueError(f"traversal: a child has token {token} with q = {qx} under its node; "
                         "children must be draws from q(.|node)")
    bx = max(float(p_row[token]) - r * qx, 0.0) / z
    return min(w * bx / qx, 1.0)


def _check(tree, p_rows: np.ndarray) -> None:
    n = len(tree.tokens)
    if p_rows.ndim != 2 or p_rows.shape[0] != n or p_rows.shape[1] != tree.q_rows.shape[1]:
        raise ValueError(f"traversal: p_rows must have shape [n_nodes={n}, V={tree.q_rows.shape[1]}] "
                         f"(one target row per tree node), got {p_rows.shape}")
    if len(tree.children) != n or tree.parents[0] != -1:
        raise ValueError("traversal: tree.children must list every node and node 0 must be the root")


def traversal_schedule(tree, p_rows: np.ndarray, nodes: Iterable[int] | None = None,
                       mass_cache: dict | None = None) -> TraversalSchedule:
    """Test sequence of Traversal Verification on `tree` (or on the sub-tree induced by `nodes`).

    nodes: optional node indices of a sub-tree (must contain the root and every listed node's parent);
        children outside it are ignored, so the sub-trees of a union tree need no copies.
    mass_cache: optional dict shared between calls on the same (tree, p_rows); memoizes Z(r) per node.
    """
    _check(tree, p_rows)
    keep = None
    if nodes is not None:
        keep = np.zeros(len(tree.tokens), dtype=bool)
        keep[np.fromiter(nodes, dtype=np.int64)] = True
        if not keep[0] or np.any(~keep[np.asarray(tree.parents[1:])[keep[1:]]]):
            raise ValueError("traversal: `nodes` must contain the root and the parent of every node it lists")
    cache = {} if mass_cache is None else mass_cache
    out_nodes: list[int] = []
    out_acc: list[float] = []
    out_r: list[float] = []
    out_z: list[float] = []

    def mass(n: int, r: float) -> float:
        key = (n, r)
        if key not in cache:
            cache[key] = residual_mass(p_rows[n], tree.q_rows[n], r)
        return cache[key]

    def visit(n: int, w: float) -> None:
        r, z = 0.0, 1.0  # M_b(.|n) = (p - r q)+ / z; initially p
        kids = [c for c in tree.children[n] if keep is None or keep[c]]
        q_row, p_row = tree.q_rows[n], p_rows[n]
        for c in kids:
            if w <= 0.0:  # n is removed: its remaining subtree is rejected surely
                break
            visit(c, child_weight(p_row, q_row, int(tree.tokens[c]), w, r, z))
            # c's subtree was rejected: update n.
            r_new = r + z / w
            z_new = mass(n, r_new)
            s = (w / z) * z_new  # S = sum_x (w M_b(x|n) - M_s(x|n))+
            if n == 0:
                if z_new > 0.0:  # root keeps w = 1 (S = 0 at the root has probability 0)
                    r, z = r_new, z_new
            else:
                w = s / (s + 1.0 - w) if s > 0.0 else 0.0
                r, z = r_new, z_new
        if n == 0 or w > 0.0:
            out_nodes.append(n)
            out_acc.append(1.0 if n == 0 else w)
            out_r.append(r)
            out_z.append(z)

    visit(0, 1.0)
    return TraversalSchedule(nodes=np.array(out_nodes, dtype=np.int64), accept=np.array(out_acc),
                             r=np.array(out_r), z=np.array(out_z))


def emission_law(tree, p_rows: np.ndarray, schedule: TraversalSchedule, t: int) -> np.ndarray:
    """[V] law M_b(.|end) of the emitted token when the step ends at test t."""
    n, r = int(schedule.nodes[t]), float(schedule.r[t])
    if r == 0.0:
        return p_rows[n]
    return np.maximum(p_rows[n] - r * tree.q_rows[n], 0.0) / schedule.z[t]


def _path_nodes(tree, n: int) -> list[int]:
    path = []
    while n > 0:
        path.append(n)
        n = int(tree.parents[n])
    return path[::-1]


def traversal_verify(tree, p_rows: np.ndarray, rng: np.random.Generator) -> tuple[list[int], int]:
    """One verification step: (accepted node indices, root excluded, in path order; emitted token)."""
    sched = traversal_schedule(tree, p_rows)
    t = 0
    while rng.random() >= sched.accept[t]:  # eta < w(leaf) accepts; the root (last) has w = 1
        t += 1
    token = categorical(emission_law(tree, p_rows, sched, t), rng)
    return _path_nodes(tree, int(sched.nodes[t])), token


def traversal_outcome_distribution(tree, p_rows: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact law of (accepted tokens..., emitted token) over the verification randomness."""
    sched = traversal_schedule(tree, p_rows)
    out: dict[tuple[int, ...], float] = {}
    for t, prob in enumerate(sched.stop_probabilities()):
        if prob <= 0.0:
            continue
        path = tuple(int(tree.tokens[m]) for m in _path_nodes(tree, int(sched.nodes[t])))
        law = emission_law(tree, p_rows, sched, t)
        for y in np.flatnonzero(law):
            key = path + (int(y),)
            out[key] = out.get(key, 0.0) + float(prob * law[y])
    return out


def traversal_expected_block_efficiency(tree, p_rows: np.ndarray, nodes: Iterable[int] | None = None,
                                        mass_cache: dict | None = None) -> float:
    """Exact E[accepted draft tokens + 1] over the verification randomness on this fixed tree."""
    sched = traversal_schedule(tree, p_rows, nodes, mass_cache)
    depths = np.asarray(tree.depths)[sched.nodes]
    return float(np.dot(sched.stop_probabilities(), depths + 1.0))


def traversal_expected_block_efficiency_mc(tree, p_rows: np.ndarray, repeats: int, rng: np.random.Generator,
                                           nodes: Iterable[int] | None = None,
                                           mass_cache: dict | None = None) -> tuple[float, float]:
    """(mean, standard error) of block efficiency over `repeats` verifications of the same tree."""
    if repeats < 2:
        raise ValueError(f"traversal: repeats must be >= 2 to report a standard error, got {repeats}")
    sched = traversal_schedule(tree, p_rows, nodes, mass_cache)
    hits = rng.random((repeats, len(sched.nodes))) < sched.accept  # [repeats, T]; last column always
    first = hits.argmax(axis=1)  # [repeats] first accepted test
    eff = np.asarray(tree.depths)[sched.nodes[first]] + 1.0  # [repeats]
    return float(eff.mean()), float(eff.std(ddof=1) / np.sqrt(repeats))
