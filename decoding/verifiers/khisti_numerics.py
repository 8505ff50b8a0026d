"""Numerical kernels of the Khisti verifier (khisti.py): the exact pair-LP solver and the fast ranking.

- `solve_pair_lp`: the pairwise selection LP of ALGORITHMS.md section 3.1b, solved exactly as a
  maximum flow (scipy's linprog overhead dwarfed this tiny LP; tests compare the optimum with linprog).
- `full_order` / `fix_ties`: the rank order of all V tokens by key, ties by token id (exactly a stable
  argsort), computed with a packed float sort.
- `StageBuffers`: reusable [V] arrays, so tournament stages do not allocate fresh pages each call.
"""

from __future__ import annotations

import numpy as np


class StageBuffers:
    """Reusable [V] arrays for the tournament stages (numpy would otherwise allocate, and the OS
    zero-fill, fresh pages for every temporary; at V ~ 50k that costs more than the arithmetic).
    ``out(m)``: the output set of stage m (two sets, alternating, so a stage never overwrites the
    stage it reads); the rest is scratch. Used by one call at a time (KhistiSolver keeps one per thread)."""

    def __init__(self, V: int):
        self.V = V
        self.sets = [{name: np.empty(V, dtype=np.int64 if name == "order" else np.float64)
                      for name in ("order", "key", "p", "q1", "q2", "q_I")} for _ in range(2)]
        self.neg, self.prod = np.empty(V), np.empty(V)
        self.t1, self.t2 = np.empty(max(V - 1, 0)), np.empty(max(V - 1, 0))
        self.u1, self.u2 = np.empty(V, dtype=np.uint64), np.empty(V, dtype=np.uint64)
        self.index = np.arange(V, dtype=np.uint64)
        self.flags = np.empty(max(V - 1, 0), dtype=bool)
        self.moved = np.empty(V, dtype=bool)
        self.c1, self.c2 = np.empty(max(V - 1, 0), dtype=np.complex128), np.empty(max(V - 1, 0), dtype=np.complex128)
        self.arange = np.arange(V)

    def out(self, m: int) -> dict[str, np.ndarray]:
        return self.sets[m % 2]


def full_order(neg: np.ndarray, order: np.ndarray, buf: StageBuffers) -> np.ndarray:
    """Write into ``order`` [V] int64 the argsort of ``neg`` ascending, ties by index (the result of a
    stable argsort). ``neg``'s -0.0 entries become 0.0 (equal keys either way).

    Speed: each key keeps its sign, exponent and leading mantissa bits; its low b bits are replaced
    by the index (b = bits of V - 1; for a negative key by the complement low - index, so that a
    smaller index still gives the smaller number), and numpy's vectorized float sort orders these
    numbers. Keys that agree in all kept bits are then ordered by full value and index explicitly."""
    V = neg.shape[0]
    b = max(1, (V - 1).bit_length())
    low = np.uint64((1 << b) - 1)
    neg += 0.0  # -0.0 -> 0.0
    bits = neg.view(np.uint64)
    packed, tmp = buf.u1, buf.u2
    np.right_shift(neg.view(np.int64), 63, out=tmp.view(np.int64))  # all ones for negative keys
    tmp &= low
    tmp ^= buf.index  # index, or low - index for negative keys
    np.bitwise_and(bits, ~low, out=packed)
    packed |= tmp
    packed.view(np.float64).sort()
    o = order.view(np.uint64)
    np.right_shift(packed.view(np.int64), 63, out=order)
    o &= low
    np.bitwise_and(packed, low, out=tmp)
    o ^= tmp  # the index back
    np.bitwise_and(packed, ~low, out=tmp)
    kept = tmp.view(np.float64)  # kept part of each sorted key
    clash = np.equal(kept[1:], kept[:-1], out=buf.flags)
    if clash.any():
        pos = np.flatnonzero(np.concatenate(([False], clash)) | np.concatenate((clash, [False])))
        sub = order[pos]
        order[pos] = sub[np.lexsort((sub, neg[sub]))]
    return order


def fix_ties(order: np.ndarray, key_sorted: np.ndarray, flags: np.ndarray) -> np.ndarray | None:
    """Permutation of rank positions that puts runs of equal keys in token-id order (None: no ties)."""
    tie = np.equal(key_sorted[1:], key_sorted[:-1], out=flags)
    if not tie.any():
        return None
    run = np.cumsum(np.concatenate(([True], ~tie)))  # [V] id of each run of equal keys
    pos = np.flatnonzero(np.concatenate(([False], tie)) | np.concatenate((tie, [False])))
    fix = np.arange(order.shape[0])
    fix[pos] = pos[np.lexsort((order[pos], run[pos]))]
    return fix


def solve_pair_lp(base: np.ndarray, p_top: np.ndarray, mass: np.ndarray) -> np.ndarray | None:
    """Optimal moved fractions v [s, s] (v[i, j], i < j: 1 - w[i, j]) of the pair LP; None on failure.

    The LP (module docstring) in flow form: moving v[i, j] * mass[i, j] from the better token i to the
    worse token j is a flow on the arc i -> j (capacity mass[i, j], i < j). With c_i = base_i + inflow_i
    - outflow_i (>= 0 always, since outflow_i <= sum_{j>i} mass[i, j] <= base_i), the LP value is
    sum_i min(p_i, c_i). Flow out of a token above p (surplus base_i - p_i) into a token below p
    (deficit p_j - base_j), possibly through other tokens, raises the value by the amount moved; any
    other net change cannot raise it. So the optimum is sum_i min(p_i, base_i) + the maximum flow from a
    source (arcs to i of capacity surplus_i) to a sink (arcs from j of capacity deficit_j), found by
    shortest augmenting paths (Edmonds-Karp; s <= 15, so at most s + 2 nodes; each augmentation zeroes
    its bottleneck arc exactly, so the usual bound on their number holds in floating point). Tests check
    the value against scipy's linprog (HiGHS) and the max-flow/min-cut certificate."""
    s = base.shape[0]
    if not (np.all(np.isfinite(base)) and np.all(np.isfinite(p_top)) and np.all(np.isfinite(mass))):
        return None
    src, snk, n = s, s + 1, s + 2
    cap = [[0.0] * n for _ in range(n)]  # residual capacities
    for i in range(s):
        cap[src][i] = max(float(base[i] - p_top[i]), 0.0)
        cap[i][snk] = max(float(p_top[i] - base[i]), 0.0)
        for j in range(i + 1, s):
            cap[i][j] = max(float(mass[i, j]), 0.0)
    orig = [row[:] for row in cap]
    for _ in range(n * n * n):  # Edmonds-Karp: at most (nodes * arcs) / 2 augmentations
        parent = [-1] * n
        parent[src] = src
        queue = [src]
        for u in queue:
            row = cap[u]
            for v in range(n):
                if parent[v] < 0 and row[v] > 0.0:
                    parent[v] = u
                    queue.append(v)
            if parent[snk] >= 0:
                break
        if parent[snk] < 0:
            break
        bottleneck, v = np.inf, snk
        while v != src:
            bottleneck = min(bottleneck, cap[parent[v]][v])
            v = parent[v]
        v = snk
        while v != src:
            u = parent[v]
            cap[u][v] = 0.0 if cap[u][v] == bottleneck else cap[u][v] - bottleneck
            cap[v][u] += bottleneck
            v = u
    else:
        return None
    v_out = np.zeros((s, s))
    for i in range(s):
        for j in range(i + 1, s):
            if orig[i][j] > 0.0:
                v_out[i, j] = min(max((orig[i][j] - cap[i][j]) / orig[i][j], 0.0), 1.0)
    return v_out
