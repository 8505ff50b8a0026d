"""Numerics of GBV (gbv.py): the law of the lexicographic maximum of K i.i.d. draws at one node, and
Block Verification's residual mass against it, without sorting the vocabulary.

Order at a node (ALGORITHMS.md 3.3): tokens ascending by the unclipped ratio ``s = p/q`` (float64),
ties by token id DESCENDING, so the "largest" token has the largest ratio and, among equal ratios,
the smallest id. Tokens with q = 0 are never drawn: they carry no q-mass and get q~ = 0.

Lexicographic-maximum law, scaled form (rho in (0, 1], K >= 1; C< = q-mass of tokens below t):
``F = (1 - rho) + rho C<(t)``, ``G = F + rho q(t)``, ``q~(t) = q(t) m(t)``,
``m(t) = sum_{i<K} G^i F^(K-1-i) / Z``, ``Z = sum_{i<K} (1 - rho)^i``.

``excess(w)`` = sum_t (w p(t) - q~(t))+ (Block Verification's S at a path node) needs C<(t) for every
token, i.e. the order. Instead of sorting, ``node_buckets`` makes one pass over the rows and groups
tokens by ratio into NB buckets (monotone in s: the float's exponent and top 7 mantissa bits, so
bucket b holds exactly the ratios in ``[LO[b], LO[b+1])``); it keeps each token's bucket (int16) and
each bucket's p- and q-mass. Within bucket b, F and G lie in ``[F_lo, F_hi]`` (its q-mass range), so
``K F_lo^(K-1) / Z <= m(t) <= K F_hi^(K-1) / Z``: if ``w LO[b] >= K F_hi^(K-1) / Z`` every term is >= 0
and the bucket contributes ``w P_b - Q_b sum_i F_hi^i F_lo^(K-1-i) / Z`` (its exact q~-mass, in
closed form); if ``w LO[b+1] <= K F_lo^(K-1) / Z`` it contributes 0; only the tokens of the remaining
(mixed) buckets are gathered, sorted and summed one by one. The result equals the sorted sum up to
rounding (tests compare them).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

E0, MANT_BITS = 40, 7  # exponents -E0..E0-1 (ratios 2^-40 .. 2^40; beyond: first / last bucket), 128 sub-buckets
NB = 2 * E0 << MANT_BITS
_SHIFT = 52 - MANT_BITS
_BASE = (1023 - E0) << MANT_BITS
# LO[b]: the smallest ratio of bucket b (LO[0] = 0, LO[NB] = inf): bucket b holds ratios in [LO[b], LO[b+1])
LO = np.concatenate([[0.0], ((np.arange(1, NB, dtype=np.int64) + _BASE) << _SHIFT).view(np.float64), [np.inf]])


@njit(cache=True)
def ratio(p, q, t: int) -> float:
    """s(t) = p(t) / q(t) in float64 (inf where q(t) = 0)."""
    return p[t] / q[t] if q[t] > 0.0 else math.inf


@njit(cache=True)
def node_buckets(p, q, scratch, bk, P, Q):
    """Ratio buckets of one node's rows p, q ``[V]`` (float64), in one pass over the rows. Fills
    bk [V] int16 (each token's bucket; -1 where q = 0: never drawn) and P, Q [NB] (p- and q-mass per
    bucket); ``scratch``: any float64 [V] (overwritten). Returns (nz: the non-empty buckets,
    ascending; p_free: the p-mass of the tokens with q = 0)."""
    V = p.shape[0]
    for t in range(V):
        scratch[t] = p[t] / q[t] if q[t] > 0.0 else math.inf
    bits = scratch.view(np.int64)
    for t in range(V):
        bk[t] = min(max((bits[t] >> _SHIFT) - _BASE, 0), NB - 1) if q[t] > 0.0 else -1
    P[:] = 0.0
    Q[:] = 0.0
    p_free = 0.0
    for t in range(V):
        b = bk[t]
        if b >= 0:
            P[b] += p[t]
            Q[b] += q[t]
        else:
            p_free += p[t]
    return np.flatnonzero(Q > 0.0), p_free  # a token with q > 0 adds q > 0 to its bucket


@njit(cache=True)
def _ipow(x: float, n: int) -> float:
    out = 1.0
    for _ in range(n):
        out *= x
    return out


@njit(cache=True)
def _m(F: float, G: float, K: int, Z: float) -> float:
    """sum_{i<K} G^i F^(K-1-i) / Z (Horner: S_1 = 1, S_(k+1) = F^k + G S_k)."""
    acc, fk = 1.0, 1.0
    for _ in range(1, K):
        fk *= F
        acc = fk + G * acc
    return acc / Z


@njit(cache=True)
def norm_z(rho: float, K: int) -> float:
    """Z = sum_{i<K} (1 - rho)^i."""
    z, x = 0.0, 1.0
    for _ in range(K):
        z += x
        x *= 1.0 - rho
    return z


class NodeBuffers:
    """Reusable arrays for one node's buckets (``node_buckets`` fills them; valid until the next node):
    scratch [V], bk [V] int16, P, Q [NB], and the sorted members of the buckets looked at so far
    (bucket b's tokens in the node's order are ``members[start[b] : start[b] + count[b]]``; start = -1:
    not gathered yet; ``used[0]``: entries of ``members`` in use)."""

    def __init__(self, V: int):
        self.scratch, self.bk = np.empty(V), np.empty(V, dtype=np.int16)
        self.P, self.Q = np.empty(NB), np.empty(NB)
        self.start, self.count = np.full(NB, -1, dtype=np.int64), np.zeros(NB, dtype=np.int64)
        self.members, self.used = np.empty(V, dtype=np.int64), np.zeros(1, dtype=np.int64)

    def fill(self, p: np.ndarray, q: np.ndarray) -> tuple[tuple, float]:
        """Bucket one node's rows. Returns (node, p_free): ``node = (p, q, bk, P, Q, nz)``, the tuple ``excess``,
        ``lexmax_at`` and ``sorted_members`` read (nz and p_free as ``node_buckets`` returns them)."""
        self.start[:] = -1
        self.used[0] = 0
        nz, p_free = node_buckets(p, q, self.scratch, self.bk, self.P, self.Q)
        return (p, q, self.bk, self.P, self.Q, nz), p_free

    def members_args(self) -> tuple:
        """The member cache ``(start, count, members, used)``, the tuple ``excess`` and ``lexmax_at`` take."""
        return self.start, self.count, self.members, self.used


@njit(cache=True)
def sorted_members(node, mem, b: int) -> np.ndarray:
    """The tokens of bucket b in the node's order (s ascending, ties by id descending), gathered by
    two vectorized scans of bk and sorted on the first request, then read from the member cache
    (``node``: `NodeBuffers.fill`'s tuple; ``mem``: `NodeBuffers.members_args`)."""
    p, q, bk = node[0], node[1], node[2]
    start, count, members, used = mem
    if start[b] < 0:
        n = 0
        for t in range(bk.shape[0]):
            n += bk[t] == b
        toks = np.empty(n, dtype=np.int64)
        i = n
        for t in range(bk.shape[0]):
            if bk[t] == b:
                i -= 1
                toks[i] = t  # descending id
        s = np.empty(n)
        for i in range(n):
            s[i] = p[toks[i]] / q[toks[i]]
        lo = used[0]
        members[lo:lo + n] = toks[np.argsort(s, kind="mergesort")]
        start[b], count[b] = lo, n
        used[0] = lo + n
    return members[start[b]:start[b] + count[b]]


@njit(cache=True)
def excess(node, mem, p_free: float, w: float, rho: float, K: int) -> float:
    """sum_t (w p(t) - q~(t))+ for the lexicographic-maximum law q~ of (rho, K) (module docstring); ``node`` and
    ``mem`` as `sorted_members` takes them, ``p_free`` from `NodeBuffers.fill`."""
    p, q, P, Q, nz = node[0], node[1], node[3], node[4], node[5]
    Z = norm_z(rho, K)
    total = w * p_free
    C = 0.0
    for b in nz:
        f_lo = (1.0 - rho) + rho * C
        f_hi = (1.0 - rho) + rho * (C + Q[b])
        if w * LO[b] >= K * _ipow(f_hi, K - 1) / Z:
            total += w * P[b] - Q[b] * _m(f_lo, f_hi, K, Z)
        elif w * LO[b + 1] > K * _ipow(f_lo, K - 1) / Z:
            run = C
            for t in sorted_members(node, mem, b):
                F = (1.0 - rho) + rho * run
                total += max(w * p[t] - q[t] * _m(F, F + rho * q[t], K, Z), 0.0)
                run += q[t]
        C += Q[b]
    return total


@njit(cache=True)
def lexmax_at(node, mem, t: int, rho: float, K: int):
    """(q~(t), G(t)) of the lexicographic-maximum law of (rho, K) at token t (q(t) > 0); ``node`` and ``mem`` as
    `sorted_members` takes them."""
    q, bk, Q, nz = node[1], node[2], node[4], node[5]
    b = bk[t]
    C = 0.0
    for c in nz:
        if c >= b:
            break
        C += Q[c]
    for u in sorted_members(node, mem, b):
        if u == t:
            break
        C += q[u]
    F = (1.0 - rho) + rho * C
    G = F + rho * q[t]
    return q[t] * _m(F, G, K, norm_z(rho, K)), G
