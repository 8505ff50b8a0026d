"""Likelihood-ratio table of one node: the shared numerics of naive_tree, specinfer and spectr.

Every residual these solvers draw from is a function of the ratios ``s(x) = p(x)/q(x)``:
- rejection residuals ``norm((p - c q)+)``, c >= 1: only tokens with s > 1 can be positive;
- SpecTr's ``beta(rho) = sum_x min(q, p/rho)`` and its residual mass.
``RatioTable`` keeps the tokens with s > 1 (q = 0 < p counts as s = inf) plus the p-mass of the
rest, so each such quantity is one pass over that subset instead of the vocabulary. The reference
solvers (``output_distribution``/``sample``) and the batched label path use the SAME functions,
so they agree to the last bit, and K = 1 reductions (naive_tree = specinfer = spectr) are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BINS_PER_UNIT = 16  # spectr bracket: ratio buckets of width 1/16 over (1, max(k, BUCKET_K))
BUCKET_K = 8  # fixed bucket layout for every k <= 8, so rho* does not depend on which k are solved


def c_of_beta(beta, k: int):
    """``(1 - (1 - beta)^k) / beta`` in the stable form ``sum_{i<k} (1 - beta)^i`` (= k at beta 0)."""
    one_minus = 1.0 - beta
    total, term = 1.0, 1.0
    for _ in range(k - 1):
        term = term * one_minus
        total = total + term
    return total


def _bracketed_root(a_c: float, p_c: float, k: int, lo: float, hi: float) -> float:
    """Root of g(rho) = c(a_c + p_c / rho) - rho in [lo, hi] (g(lo) > 0 >= g(hi)) by regula falsi
    with the Illinois modification (superlinear, keeps the bracket). Returns the upper end, so
    g(result) <= 0 always holds."""
    def g(rho: float) -> float:
        return c_of_beta(a_c + p_c / rho, k) - rho

    g_lo, g_hi = g(lo), g(hi)
    if g_lo <= 0.0:  # rounding put the root at lo: lo is then a valid answer
        return lo
    side = 0
    for _ in range(200):
        if hi - lo <= 4e-16 * hi or g_hi == 0.0:
            break
        x = hi - g_hi * (hi - lo) / (g_hi - g_lo)
        if not lo < x < hi:
            x = 0.5 * (lo + hi)
            if not lo < x < hi:
                break
        g_x = g(x)
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


@dataclass
class RatioTable:
    """Ratios of one node's rows p, q ``[V]`` (float64)."""

    s_sub: np.ndarray  # [m] ratios > 1 (inf where q = 0 < p)
    p_sub: np.ndarray  # [m]
    q_sub: np.ndarray  # [m]
    p_low: float  # p-mass of tokens with ratio <= 1
    beta1: float  # sum_x min(p, q)
    _bins: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, p: np.ndarray, q: np.ndarray) -> RatioTable:
        p = np.asarray(p, dtype=np.float64)
        q = np.asarray(q, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = p / q  # [V] inf where q = 0 < p, nan where both are 0
        idx = np.flatnonzero(s > 1.0)  # nan compares False: p = q = 0 tokens drop out
        p_sub, q_sub = p.take(idx), q.take(idx)
        p_low = float(p.sum() - p_sub.sum())
        return cls(s.take(idx), p_sub, q_sub, p_low, p_low + float(q_sub.sum()))

    def mass(self, c: float) -> float:
        """``sum_x (p - c q)+`` for a shift c >= 1."""
        return float(np.maximum(self.p_sub - c * self.q_sub, 0.0).sum())

    def _bucketed(self, kmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Ratio buckets over (1, kmax): (bucket of each token [m], edges [B+1], q-mass of ratios
        >= edge [B+1], p-mass of ratios < edge [B+1]); bucket i holds ratios in [edge_i, edge_i+1),
        bucket B ratios >= kmax."""
        if kmax not in self._bins:
            n_bins = (kmax - 1) * BINS_PER_UNIT
            b = np.minimum((self.s_sub - 1.0) * BINS_PER_UNIT, n_bins).astype(np.int64)  # inf -> B
            edges = 1.0 + np.arange(n_bins + 1) / BINS_PER_UNIT
            qh, ph = np.bincount(b, self.q_sub, n_bins + 1), np.bincount(b, self.p_sub, n_bins + 1)
            a_edge = np.cumsum(qh[::-1])[::-1]
            p_edge = self.p_low + np.concatenate([[0.0], np.cumsum(ph)[:-1]])
            self._bins[kmax] = (b, edges, a_edge, p_edge)
        return self._bins[kmax]

    def spectr_rho(self, k: int, kmax: int | None = None) -> float:
        """rho* in [1, k] with ``1 - (1 - beta)^k = rho beta``, ``beta(rho) = sum_x min(q, p/rho)``.

        With A(rho) = q-mass of ratios >= rho and P(rho) = p-mass of ratios < rho, beta = A + P/rho
        and g(rho) = c(beta) - rho satisfies g(1) >= 0 >= g(k). Bracket a sign change on the bucket
        edges, then on the sorted ratios of that bucket, then solve on the last piece (where A, P are
        constant) by bracketing regula falsi keeping g(hi) <= 0; return hi. Any rho with c(beta(rho)) <= rho makes the k-SEQ
        residual non-negative, so the solver is exactly lossless whichever root is found.
        k = 1 or p == q on q's support -> 1; disjoint supports (beta = 0) -> k."""
        if k <= 1 or c_of_beta(self.beta1, k) <= 1.0:
            return 1.0
        b, edges, a_edge, p_edge = self._bucketed(max(k, kmax or k, BUCKET_K))
        top = k * BINS_PER_UNIT - BINS_PER_UNIT  # index of edge == k
        e = edges[: top + 1]
        g = c_of_beta(a_edge[: top + 1] + p_edge[: top + 1] / e, k) - e
        j = int(np.argmax(g[1:] <= 0.0)) + 1 if np.any(g[1:] <= 0.0) else top  # g(k) <= 0 always
        # root in bucket j-1 = [edges[j-1], edges[j]]; sort that bucket's ratios
        inside = np.flatnonzero(b == j - 1)
        order = np.argsort(self.s_sub.take(inside), kind="stable")
        bs = self.s_sub.take(inside)[order]
        bq, bp = self.q_sub.take(inside)[order], self.p_sub.take(inside)[order]
        grid = np.concatenate([[edges[j - 1]], bs, [edges[j]]])
        a_seg = a_edge[j] + np.concatenate([np.cumsum(bq[::-1])[::-1], [0.0]])  # piece i: first i ratios below
        p_seg = p_edge[j - 1] + np.concatenate([[0.0], np.cumsum(bp)])
        at = np.minimum(np.arange(1, grid.shape[0]), a_seg.shape[0] - 1)  # piece whose left end is grid[i]
        g_in = c_of_beta(a_seg[at] + p_seg[at] / grid[1:], k) - grid[1:]
        lo_i = int(np.argmax(g_in <= 0.0)) if np.any(g_in <= 0.0) else grid.shape[0] - 2
        lo, hi = float(grid[lo_i]), float(grid[lo_i + 1])
        return _bracketed_root(float(a_seg[lo_i]), float(p_seg[lo_i]), k, lo, hi)

    def spectr_residual(self, rho: float, k: int) -> tuple[float, float]:
        """``(c, mass)``: the k-SEQ residual is ``(p - c min(q, p/rho))+ / mass`` (p if mass = 0),
        with c = c_of_beta(beta(rho)). Tokens with ratio <= 1 contribute ``p (1 - c/rho)``."""
        base = np.minimum(self.q_sub, self.p_sub / rho)  # [m]
        beta = self.p_low / rho + float(base.sum())
        c = float(c_of_beta(beta, k))
        mass = max(1.0 - c / rho, 0.0) * self.p_low + float(np.maximum(self.p_sub - c * base, 0.0).sum())
        return c, mass
