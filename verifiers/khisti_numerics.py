"""Numerical kernels of the Khisti verifier (khisti.py): the exact pair-LP solver, the rank order of the
vocabulary and the per-stage pass over it.

- `solve_pair_lp`: the pairwise selection LP of ALGORITHMS.md section 3.1b, solved exactly as a
  maximum flow (scipy's linprog overhead dwarfed this tiny LP; tests compare the optimum with linprog).
- `full_order` / `hinted_sort`: the rank order of all V tokens by key, ties by token id (exactly a
  stable argsort): a radix sort for a tournament's first stage; an insertion sort starting
  from the previous stage's order for later ones (the new keys put only a few thousand pairs of
  tokens out of order there).
- `selection_pass`: given the stage's arrays in rank order, the law of the better-ranked candidate,
  the residual mass and the next stage's keys in one loop over the ranks.
- `StageBuffers`: reusable [V] arrays, so tournament stages do not allocate fresh pages each call.

The loops are compiled with numba (``cache=True``: compiled on the first call on a machine, then
loaded from ``__pycache__``); in numpy a stage took ~20 passes over [V] arrays, two cumulative sums
and a gather per array, which cost more than the arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

STAGE_ARRAYS = ("order", "key", "p", "q1", "q2", "q_I", "next_keys")  # one stage's [V] arrays, rank order


class StageBuffers:
    """Reusable [V] arrays for the tournament stages (numpy would otherwise allocate, and the OS
    zero-fill, fresh pages for every temporary; at V ~ 50k that costs more than the arithmetic).
    ``stage``: the arrays of a first stage (STAGE_ARRAYS; later stages reuse them in place, see
    khisti.next_stage); the rest is scratch. Used by one call at a time (KhistiSolver keeps one per
    thread)."""

    def __init__(self, V: int):
        self.V = V
        self.stage = {name: np.empty(V, dtype=np.int64 if name == "order" else np.float64) for name in STAGE_ARRAYS}
        self.neg = np.empty(V)
        self.u1, self.u2 = np.empty(V, dtype=np.uint64), np.empty(V, dtype=np.uint64)
        self.o2 = np.empty(V, dtype=np.int64)


def full_order(neg: np.ndarray, order: np.ndarray, buf: StageBuffers | None = None) -> np.ndarray:
    """Write into ``order`` [V] int64 the argsort of ``neg`` ascending, ties by index (the result of a
    stable argsort). ``neg``'s -0.0 entries become 0.0 (equal keys either way). ``buf``: the scratch
    arrays (fresh ones when None).

    Speed: a least-significant-digit radix sort (numpy's comparison sort of 49k floats took ~1.7 ms
    here, the radix sort ~0.7 ms). Each key becomes an unsigned integer in the same order (a positive
    float's bits with the sign bit set; a negative float's bits inverted), and six stable counting
    passes over 11-bit digits sort the (key, index) pairs; starting from index order, equal keys stay
    in index order."""
    neg += 0.0  # -0.0 -> 0.0
    V = neg.shape[0]
    u1, u2, o2 = ((buf.u1, buf.u2, buf.o2) if buf is not None else
                  (np.empty(V, dtype=np.uint64), np.empty(V, dtype=np.uint64), np.empty(V, dtype=np.int64)))
    _radix_argsort(neg.view(np.uint64), order, u1, u2, o2)
    return order


_DIGIT = 11  # bits per radix pass (2048 counters: they stay in the L1 cache)
_PASSES = 6  # 6 * 11 >= 64


@njit(cache=True)
def _radix_argsort(bits, order, keys, tmp_keys, tmp_order):
    """order = stable argsort of the float64 values whose bits are ``bits`` [V] (no NaN, no -0.0);
    keys, tmp_keys [V] uint64 and tmp_order [V] int64 are scratch."""
    V = bits.shape[0]
    top = np.uint64(1) << np.uint64(63)
    for i in range(V):
        x = bits[i]
        keys[i] = ~x if x & top else x | top
        order[i] = i
    width = 1 << _DIGIT
    mask = np.uint64(width - 1)
    hist = np.zeros((_PASSES, width), dtype=np.int64)
    for i in range(V):
        x = keys[i]
        for d in range(_PASSES):
            hist[d, np.int64((x >> np.uint64(_DIGIT * d)) & mask)] += 1
    src_k, src_o, dst_k, dst_o = keys, order, tmp_keys, tmp_order
    swapped = False
    pos = np.empty(width, dtype=np.int64)
    for d in range(_PASSES):
        if hist[d].max() == V:  # every key has the same digit here: the pass would change nothing
            continue
        acc = 0
        for b in range(width):
            pos[b] = acc
            acc += hist[d, b]
        shift = np.uint64(_DIGIT * d)
        for i in range(V):
            x = src_k[i]
            b = np.int64((x >> shift) & mask)
            dst_k[pos[b]] = x
            dst_o[pos[b]] = src_o[i]
            pos[b] += 1
        src_k, src_o, dst_k, dst_o = dst_k, dst_o, src_k, src_o
        swapped = not swapped
    if swapped:
        order[:] = src_o


def hinted_sort(st: dict[str, np.ndarray]) -> None:
    """Sort the tokens ``st["order"]`` (a permutation of the V token ids) by ``st["key"]``, ties by token id,
    carrying ``st``'s "p", "q1", "q2" along (all [V], in place). The given order should be nearly sorted (the
    previous stage's): an insertion sort then moves each misplaced token past a few neighbours. If that takes
    more than 4 V moves, a full sort finishes the job (same result): the records in token-id order, then the
    stable radix argsort of their keys (ties stay in token order; ~5x faster than ``np.lexsort`` at V = 49k,
    where the collect stage's Khisti labels spent most of their time)."""
    arrays = [st[name] for name in ("key", "order", "p", "q1", "q2")]
    V = arrays[0].shape[0]
    if not _insertion_sort(*arrays, 4 * V):
        by_token = np.empty(V, dtype=np.int64)
        by_token[arrays[1]] = np.arange(V)  # the record of each token id
        keys = arrays[0][by_token]  # in token-id order (a copy: full_order may rewrite -0.0 in it)
        perm = by_token[full_order(keys, np.empty(V, dtype=np.int64))]
        for a in arrays:
            a[:] = a[perm]


@njit(cache=True)
def _insertion_sort(key, order, p, q1, q2, budget):
    """Sort the records (key, order, p, q1, q2) in place by (key, order); False once more than
    ``budget`` moves were needed (the arrays are then a permutation of the records, unsorted)."""
    moves = 0
    for i in range(1, key.shape[0]):
        k, t = key[i], order[i]
        j = i - 1
        if key[j] < k or (key[j] == k and order[j] < t):
            continue  # already in place: the usual case
        pv, a, b = p[i], q1[i], q2[i]
        while j >= 0 and (key[j] > k or (key[j] == k and order[j] > t)):
            key[j + 1], order[j + 1], p[j + 1], q1[j + 1], q2[j + 1] = key[j], order[j], p[j], q1[j], q2[j]
            j -= 1
        moves += i - 1 - j
        key[j + 1], order[j + 1], p[j + 1], q1[j + 1], q2[j + 1] = k, t, pv, a, b
        if moves > budget:
            return False
    return True


@njit(cache=True)
def selection_pass(rows, s, key, q_I, next_keys):
    """One pass over the ranks, worst first; ``rows = (p, q1, q2)``, each [V] in the stage's rank order. Writes,
    for each rank r (T_k = q_k-mass ranked worse than r):
      key[r] = q1 q2 - p                (the key the ranking sorted; full_order's 0.0 may be -0.0 here)
      q_I[r] = q1 q2 + q1 T2 + T1 q2   (law of the better-ranked candidate; for r < s the LP's base)
      next_keys[r] = q_I[r] q2 - p      (the next stage's key of this token)
    and returns (r1, r2, res): the q1- and q2-mass of ranks >= s and the sum over ranks >= s of
    (p - q_I)+. The caller replaces ranks < s once the LP is solved. T1, T2 are running sums from the
    worst rank (the same values as a cumulative sum of the reversed arrays)."""
    p, q1, q2 = rows
    t1 = 0.0
    t2 = 0.0
    r1 = 0.0
    r2 = 0.0
    res = 0.0
    for r in range(p.shape[0] - 1, -1, -1):
        a = q1[r]
        b = q2[r]
        key[r] = a * b - p[r]
        law = a * b + a * t2 + t1 * b
        q_I[r] = law
        next_keys[r] = law * b - p[r]
        if r >= s and p[r] > law:
            res += p[r] - law
        t1 += a
        t2 += b
        if r == s:
            r1 = t1
            r2 = t2
    return r1, r2, res


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
    base, p_top, mass = (np.ascontiguousarray(a, dtype=np.float64) for a in (base, p_top, mass))
    v = np.zeros(mass.shape)
    return v if _max_flow(base, p_top, mass, v) else None


@njit(cache=True)
def _max_flow(base, p_top, mass, v):
    """solve_pair_lp's flow; writes v, returns False on non-finite input (or no convergence)."""
    s = base.shape[0]
    for i in range(s):
        if not (np.isfinite(base[i]) and np.isfinite(p_top[i]) and np.all(np.isfinite(mass[i]))):
            return False
    src, snk, n = s, s + 1, s + 2
    cap = np.zeros((n, n))  # residual capacities
    for i in range(s):
        cap[src, i] = max(base[i] - p_top[i], 0.0)
        cap[i, snk] = max(p_top[i] - base[i], 0.0)
        for j in range(i + 1, s):
            cap[i, j] = max(mass[i, j], 0.0)
    orig = cap.copy()
    parent = np.empty(n, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    converged = False
    for _ in range(n * n * n):  # Edmonds-Karp: at most (nodes * arcs) / 2 augmentations
        parent[:] = -1  # breadth-first search for a shortest augmenting path
        parent[src] = src
        queue[0] = src
        head, tail = 0, 1
        while head < tail and parent[snk] < 0:
            u = queue[head]
            head += 1
            for w in range(n):
                if parent[w] < 0 and cap[u, w] > 0.0:
                    parent[w] = u
                    queue[tail] = w
                    tail += 1
        if parent[snk] < 0:
            converged = True
            break
        bottleneck, w = np.inf, snk
        while w != src:
            bottleneck = min(bottleneck, cap[parent[w], w])
            w = parent[w]
        w = snk
        while w != src:
            u = parent[w]
            cap[u, w] = 0.0 if cap[u, w] == bottleneck else cap[u, w] - bottleneck
            cap[w, u] += bottleneck
            w = u
    if not converged:
        return False
    for i in range(s):
        for j in range(i + 1, s):
            if orig[i, j] > 0.0:
                v[i, j] = min(max((orig[i, j] - cap[i, j]) / orig[i, j], 0.0), 1.0)
    return True
