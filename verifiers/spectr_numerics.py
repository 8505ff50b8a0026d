"""Numerical kernel of SpecTr's k-SEQ (ot.SpecTrSolver): rho* and the residual's (c, mass) for every
k = 1..kmax from one node's ratio table (ratios.RatioTable), in three compiled passes over its tokens.

rho* in [1, k] solves ``c(beta(rho)) = rho`` with ``beta(rho) = sum_x min(q, p/rho)`` and
``c(beta) = (1 - (1 - beta)^k) / beta``, computed as ``sum_{i<k} (1 - beta)^i`` (stable at beta = 0).
With A(rho) = q-mass of ratios s = p/q >= rho and P(rho) = p-mass of ratios < rho, beta = A + P/rho,
and g(rho) = c(beta(rho)) - rho has g(1) >= 0 >= g(k). ``spectr_solve``:
1. one pass: the ratios > 1 go into buckets of width 1/BINS_PER_UNIT over (1, max(kmax, BUCKET_K))
   (the last bucket takes the rest, inf included); q- and p-mass per bucket give A and P on the edges;
2. per k: the first edge with g <= 0 closes the bucket holding the root (one pass gathers the
   ratios of these buckets for all k); that bucket's ratios, sorted, split it into pieces with A
   and P constant, and the first ratio with g <= 0 closes the piece; on it ``c(A + P/rho) = rho`` is solved by regula falsi with the Illinois modification, keeping
   g(hi) <= 0 and returning hi. beta(rho*) = A + P/rho* of that piece;
3. one pass for every k: the residual ``(p - c min(q, p/rho))+`` with c = c(beta(rho*)) is
   ``(1 - c/rho)+ p`` on ratios < rho (P in all) and ``(p - c q)+`` on the others; mass = its sum.

Any rho with c(beta(rho)) <= rho makes the k-SEQ residual non-negative, so the solver is exactly
lossless whichever root the search approaches. The bucket layout is the same for every kmax <= BUCKET_K,
so rho* of one k does not depend on which other k are solved.

In numpy this took ~40 array calls per (node, k) and six passes for each residual; the label path
solves k = 2..4 at 9 branch rows per union tree. ``cache=True``: compiled on the first call on a
machine, then loaded from ``__pycache__``. Tests compare with a direct evaluation of the definitions
(``tests/test_verifiers_exact.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

BINS_PER_UNIT = 16  # ratio buckets of width 1/16
BUCKET_K = 8  # buckets over (1, 8) for every kmax <= 8


@njit(cache=True)
def c_of_beta(beta: float, k: int) -> float:
    """``(1 - (1 - beta)^k) / beta`` in the stable form ``sum_{i<k} (1 - beta)^i`` (= k at beta 0)."""
    one_minus = 1.0 - beta
    total, term = 1.0, 1.0
    for _ in range(k - 1):
        term = term * one_minus
        total = total + term
    return total


@njit(cache=True)
def _g(a_mass: float, p_mass: float, k: int, rho: float) -> float:
    """g(rho) = c(a_mass + p_mass / rho) - rho where A(rho) = a_mass and P(rho) = p_mass."""
    return c_of_beta(a_mass + p_mass / rho, k) - rho


@njit(cache=True)
def bracketed_root(a_mass: float, p_mass: float, k: int, lo: float, hi: float) -> float:
    """Root of g in [lo, hi] (g(lo) > 0 >= g(hi)) by regula falsi with the Illinois modification
    (superlinear, keeps the bracket). Returns the upper end, so g(result) <= 0 always holds."""
    g_lo, g_hi = _g(a_mass, p_mass, k, lo), _g(a_mass, p_mass, k, hi)
    if g_lo <= 0.0:  # rounding put the root at lo: lo is then a valid answer
        return lo
    if g_hi >= 0.0:  # rounding: g is within float noise of 0 over the whole bracket (p ~ q)
        return hi
    side = 0
    for _ in range(200):
        if hi - lo <= 4e-16 * hi or g_hi == 0.0:
            break
        den = g_hi - g_lo
        x = hi - g_hi * (hi - lo) / den if den != 0.0 else 0.5 * (lo + hi)
        if not lo < x < hi:
            x = 0.5 * (lo + hi)
            if not lo < x < hi:
                break
        g_x = _g(a_mass, p_mass, k, x)
        if g_x <= 0.0:
            hi, g_hi = x, g_x
            if side == -1:
                g_lo *= 0.5
            side = -1
        else:
            lo, g_lo = x, g_x
            if side == 1:
                g_hi *= 0.5
            side = 1
    return hi


@njit(cache=True)
def _edge(b: int) -> float:
    return 1.0 + b / BINS_PER_UNIT


@njit(cache=True)
def _bucket(s: float, n_bins: int) -> int:
    """Bucket of a ratio s > 1: b < n_bins holds [edge b, edge b+1), n_bins the rest (inf included)."""
    x = (s - 1.0) * BINS_PER_UNIT
    return n_bins if x >= n_bins else int(x)


@njit(cache=True)
def _buckets(s, p, q, p_low, n_bins):
    """Step 1: (count [B+1]: ratios per bucket, a_edge [B+1]: q-mass of ratios >= edge b,
    p_edge [B+1]: p-mass of ratios < edge b, p_low included)."""
    count = np.zeros(n_bins + 1, np.int64)
    q_hist, p_hist = np.zeros(n_bins + 1), np.zeros(n_bins + 1)
    for i in range(s.shape[0]):
        b = _bucket(s[i], n_bins)
        count[b] += 1
        q_hist[b] += q[i]
        p_hist[b] += p[i]
    a_edge, p_edge = np.empty(n_bins + 1), np.empty(n_bins + 1)
    a_run, p_run = 0.0, 0.0
    for b in range(n_bins, -1, -1):
        a_run += q_hist[b]
        a_edge[b] = a_run
    for b in range(n_bins + 1):
        p_edge[b] = p_low + p_run
        p_run += p_hist[b]
    return count, a_edge, p_edge


@njit(cache=True)
def _root_edge(k, a_edge, p_edge) -> int:
    """Step 2a: the first edge j >= 1 with g <= 0 (the edge at k if none before): the root of g
    lies in bucket j-1."""
    top = (k - 1) * BINS_PER_UNIT  # the edge at k, where g <= 0 always
    for e in range(1, top):
        if _g(a_edge[e], p_edge[e], k, _edge(e)) <= 0.0:
            return e
    return top


@njit(cache=True)
def _sort_by_ratio(s, idx) -> None:
    """Sort the indices ``idx`` in place by increasing ``s[idx]`` (Shell sort, gaps growing ~2.25x: a
    bucket holds a few hundred ratios, and numba's argsort costs seconds of compile time)."""
    n = idx.shape[0]
    gaps = np.ones(64, np.int64)  # 1, 3, 7, 16, 37, 84, ... (x 2.25), the largest below n last
    top = 0
    while gaps[top] * 9 // 4 + 1 < n:
        gaps[top + 1] = gaps[top] * 9 // 4 + 1
        top += 1
    for g in range(top, -1, -1):
        gap = gaps[g]
        for i in range(gap, n):
            item, key = idx[i], s[idx[i]]
            j = i
            while j >= gap and s[idx[j - gap]] > key:
                idx[j] = idx[j - gap]
                j -= gap
            idx[j] = item


@njit(cache=True)
def _members(s, n_bins, buckets, count):
    """(members, start, slot): the indices of the ratios in each of ``buckets`` (repeats allowed),
    bucket b's in ``members[start[slot[b]]:start[slot[b] + 1]]`` in increasing ratio order (one pass
    over the ratios)."""
    slot = np.full(n_bins + 1, -1, np.int64)
    start = np.zeros(buckets.shape[0] + 1, np.int64)
    groups = 0
    for b in buckets:
        if slot[b] < 0:
            slot[b] = groups
            start[groups + 1] = start[groups] + count[b]
            groups += 1
    fill = start[:groups].copy()
    members = np.empty(start[groups], np.int64)
    for i in range(s.shape[0]):
        t = slot[_bucket(s[i], n_bins)]
        if t >= 0:
            members[fill[t]] = i
            fill[t] += 1
    for t in range(groups):
        _sort_by_ratio(s, members[start[t]:start[t + 1]])
    return members, start, slot


@njit(cache=True)
def _solve_in_bucket(table, k, j, inside, edges):
    """Step 2b: (rho*, A(rho*), P(rho*)) given the root's bucket j-1 and its ratios ``inside`` in
    increasing order (``table = (s, p, q)``, ``edges = (a_edge, p_edge)``). Piece i = 0..n lies between grid i
    and grid i+1 (grid: edge j-1, the sorted ratios, edge j); on it the ratios >= its right end count in
    A = a_seg[i], the others in P = p_seg[i]."""
    s, p, q = table
    a_edge, p_edge = edges
    n = inside.shape[0]
    grid = np.empty(n + 2)
    grid[0], grid[n + 1] = _edge(j - 1), _edge(j)
    for i in range(n):
        grid[i + 1] = s[inside[i]]
    a_seg, p_seg = np.empty(n + 1), np.empty(n + 1)
    a_run, p_run = 0.0, 0.0
    a_seg[n] = a_edge[j]
    for i in range(n - 1, -1, -1):
        a_run += q[inside[i]]
        a_seg[i] = a_edge[j] + a_run
    p_seg[0] = p_edge[j - 1]
    for i in range(n):
        p_run += p[inside[i]]
        p_seg[i + 1] = p_edge[j - 1] + p_run
    piece = n  # first piece whose right end has g <= 0 (g is continuous: evaluated on the next piece)
    for i in range(n):
        if _g(a_seg[i + 1], p_seg[i + 1], k, grid[i + 1]) <= 0.0:
            piece = i
            break
    rho = bracketed_root(a_seg[piece], p_seg[piece], k, grid[piece], grid[piece + 1])
    return rho, a_seg[piece], p_seg[piece]


@njit(cache=True)
def spectr_solve(s, p, q, p_low, beta1, kmax):
    """``(rho, c, mass)``, each [kmax]; entry k-1 is for a node with k children: rho*, and the residual
    ``(p - c min(q, p/rho*))+ / mass``. ``s, p, q`` [m]: the table's ratios > 1 (inf where q = 0) and
    their p, q; ``p_low``: the p-mass of the other tokens; ``beta1`` = sum min(p, q).
    rho* = 1 for k = 1 or when c(beta1) <= 1 (p == q on q's support); k when beta = 0."""
    rho, beta, p_mass = np.ones(kmax), np.full(kmax, beta1), np.full(kmax, p_low)  # rho = 1: beta1, P = p_low
    solve = np.zeros(kmax, np.bool_)
    for k in range(2, kmax + 1):
        solve[k - 1] = c_of_beta(beta1, k) > 1.0
    if solve.any():
        n_bins = (max(kmax, BUCKET_K) - 1) * BINS_PER_UNIT
        count, a_edge, p_edge = _buckets(s, p, q, p_low, n_bins)
        root = np.zeros(kmax, np.int64)  # per k: the edge closing the bucket that holds rho*
        wanted, n_wanted = np.empty(kmax, np.int64), 0  # those buckets
        for k in range(2, kmax + 1):
            if solve[k - 1]:
                root[k - 1] = _root_edge(k, a_edge, p_edge)
                wanted[n_wanted] = root[k - 1] - 1
                n_wanted += 1
        members, start, slot = _members(s, n_bins, wanted[:n_wanted], count)
        for k in range(2, kmax + 1):
            if solve[k - 1]:
                t = slot[root[k - 1] - 1]
                inside = members[start[t]:start[t + 1]]
                r, a_r, p_r = _solve_in_bucket((s, p, q), k, root[k - 1], inside, (a_edge, p_edge))
                rho[k - 1], beta[k - 1], p_mass[k - 1] = r, a_r + p_r / r, p_r
    c = np.empty(kmax)
    for k in range(1, kmax + 1):
        c[k - 1] = c_of_beta(beta[k - 1], k)
    high = np.zeros(kmax)  # sum of (p - c q)+ over ratios >= rho, per k
    for i in range(s.shape[0]):
        for t in range(kmax):
            d = p[i] - c[t] * q[i]
            high[t] += d if s[i] >= rho[t] and d > 0.0 else 0.0  # a select, not a branch
    mass = np.empty(kmax)
    for t in range(kmax):
        mass[t] = max(1.0 - c[t] / rho[t], 0.0) * p_mass[t] + high[t]
    return rho, c, mass
