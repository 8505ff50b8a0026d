"""Numerics of GBV (gbv.py): the law of the lexicographic maximum of K i.i.d. draws at one node, and
Block Verification's residual mass against it, without sorting the vocabulary.

Order at a node (ALGORITHMS.md 3.3): tokens ascending by the unclipped ratio ``s = p/q`` (float64),
ties by token id DESCENDING, so the "largest" token has the largest ratio and, among equal ratios,
the smallest id. Tokens with q = 0 are never drawn: they carry no q-mass and get q~ = 0.

Lexicographic-maximum law, scaled form (rho in (0, 1], K >= 1; C< = q-mass of tokens below t):
``F = (1 - rho) + rho C<(t)``, ``G = F + rho q(t)``, ``q~(t) = q(t) m(t)``,
``m(t) = sum_{i<K} G^i F^(K-1-i) / Z``, ``Z = sum_{i<K} (1 - rho)^i``.

``excess(w)`` = sum_t (w p(t) - q~(t))+ (Block Verification's S at a path node) needs C<(t) for every
token, i.e. the order. Instead of sorting, ``node_buckets`` groups tokens by ratio into NB buckets
(monotone in s: the float's exponent and top 5 mantissa bits). Within bucket b, F and G lie in
``[F_lo, F_hi]`` (its q-mass range), so ``K F_lo^(K-1) / Z <= m(t) <= K F_hi^(K-1) / Z``: if
``w s_min >= K F_hi^(K-1) / Z`` every term is >= 0 and the bucket contributes
``w P_b - Q_b sum_i F_hi^i F_lo^(K-1-i) / Z`` (its exact q~-mass, in closed form); if
``w s_max <= K F_lo^(K-1) / Z`` it contributes 0; only the remaining (mixed) buckets are sorted and
summed token by token. The result equals the sorted sum up to rounding (tests compare them).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

E0, MANT_BITS = 40, 5  # exponents -E0..E0-1 (ratios 2^-40 .. 2^40; beyond: first / last bucket), 32 sub-buckets
NB = 2 * E0 << MANT_BITS
_BASE = (1023 - E0) << MANT_BITS


@njit(cache=True)
def node_buckets(p: np.ndarray, q: np.ndarray):
    """Ratio buckets of one node's rows p, q ``[V]`` (float64). Returns (s [V] ratios (inf where q = 0),
    bk [V] bucket of each token (-1 where q = 0), perm [V'] tokens with q > 0 grouped by bucket
    (ascending id inside), off [NB+1], P [NB], Q [NB], smin [NB], smax [NB], p_free = p-mass of
    tokens with q = 0). A bucket is the float's exponent and top 5 mantissa bits (monotone in s)."""
    V = p.shape[0]
    s = np.empty(V)
    for t in range(V):
        s[t] = p[t] / q[t] if q[t] > 0.0 else math.inf
    bits = s.view(np.int64)
    bk = np.empty(V, dtype=np.int64)
    count = np.zeros(NB + 1, dtype=np.int64)
    P, Q = np.zeros(NB), np.zeros(NB)
    smin, smax = np.full(NB, np.inf), np.zeros(NB)
    p_free = 0.0
    for t in range(V):
        if q[t] > 0.0:
            b = min(max((bits[t] >> (52 - MANT_BITS)) - _BASE, 0), NB - 1)
            bk[t] = b
            count[b + 1] += 1
            P[b] += p[t]
            Q[b] += q[t]
            smin[b] = min(smin[b], s[t])
            smax[b] = max(smax[b], s[t])
        else:
            bk[t] = -1
            p_free += p[t]
    off = np.cumsum(count)
    fill = off[:-1].copy()
    perm = np.empty(off[-1], dtype=np.int64)
    for t in range(V):
        b = bk[t]
        if b >= 0:
            perm[fill[b]] = t
            fill[b] += 1
    return s, bk, perm, off, P, Q, smin, smax, p_free


@njit(cache=True)
def plain_excess(p: np.ndarray, q: np.ndarray, w: float) -> float:
    """sum_t (w p(t) - q(t))+ (K = 1: q~ = q)."""
    total = 0.0
    for t in range(p.shape[0]):
        d = w * p[t] - q[t]
        if d > 0.0:
            total += d
    return total


@njit(cache=True)
def _m(F: float, G: float, K: int, Z: float) -> float:
    acc, gi = 0.0, 1.0
    for i in range(K):
        acc += gi * F ** (K - 1 - i)
        gi *= G
    return acc / Z


@njit(cache=True)
def norm_z(rho: float, K: int) -> float:
    """Z = sum_{i<K} (1 - rho)^i."""
    z, x = 0.0, 1.0
    for _ in range(K):
        z += x
        x *= 1.0 - rho
    return z


@njit(cache=True)
def _sorted_bucket(s: np.ndarray, toks: np.ndarray) -> np.ndarray:
    """The bucket's tokens (ascending id) in the node's order: s ascending, ties by id descending."""
    rev = toks[::-1].copy()
    return rev[np.argsort(s[rev], kind="mergesort")]


@njit(cache=True)
def excess(p, q, s, bk, perm, off, P, Q, smin, smax, p_free, w: float, rho: float, K: int) -> float:
    """sum_t (w p(t) - q~(t))+ for the lexicographic-maximum law q~ of (rho, K) (module docstring)."""
    Z = norm_z(rho, K)
    total = w * p_free
    C = 0.0
    for b in range(NB):
        if off[b + 1] == off[b]:
            continue
        f_lo = (1.0 - rho) + rho * C
        f_hi = (1.0 - rho) + rho * (C + Q[b])
        if w * smin[b] >= K * f_hi ** (K - 1) / Z:
            total += w * P[b] - Q[b] * _m(f_lo, f_hi, K, Z)
        elif w * smax[b] > K * f_lo ** (K - 1) / Z:
            run = C
            for t in _sorted_bucket(s, perm[off[b]:off[b + 1]]):
                F = (1.0 - rho) + rho * run
                total += max(w * p[t] - q[t] * _m(F, F + rho * q[t], K, Z), 0.0)
                run += q[t]
        C += Q[b]
    return total


@njit(cache=True)
def lexmax_at(q, s, bk, perm, off, Q, t: int, rho: float, K: int):
    """(q~(t), G(t)) of the lexicographic-maximum law of (rho, K) at token t (q(t) > 0)."""
    b = bk[t]
    C = 0.0
    for c in range(b):
        C += Q[c]
    for u in perm[off[b]:off[b + 1]]:
        if s[u] < s[t] or (s[u] == s[t] and u > t):
            C += q[u]
    F = (1.0 - rho) + rho * C
    G = F + rho * q[t]
    return q[t] * _m(F, G, K, norm_z(rho, K)), G
