"""Likelihood-ratio table of one node: the shared numerics of naive_tree, specinfer and spectr.

Every residual these solvers draw from is a function of the ratios ``s(x) = p(x)/q(x)``:
- rejection residuals ``norm((p - c q)+)``, c >= 1: only tokens with s > 1 can be positive;
- SpecTr's ``beta(rho) = sum_x min(q, p/rho)`` and its residual mass.
``RatioTable`` keeps the tokens with s > 1 (q = 0 < p counts as s = inf) plus the p-mass of the
rest, so each such quantity is one pass over that subset instead of the vocabulary; SpecTr's
rho* and residual for every k come from one compiled kernel (spectr_numerics.py). The reference
solvers (``output_distribution``/``sample``) and the batched label path use the SAME functions,
so they agree to the last bit; K = 1 reductions (naive_tree = specinfer = spectr) agree exactly for
naive_tree and specinfer and to rounding for spectr (its residual mass is the kernel's sum).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spectr_numerics import spectr_solve


@dataclass
class RatioTable:
    """Ratios of one node's rows p, q ``[V]`` (float64)."""

    s_sub: np.ndarray  # [m] ratios > 1 (inf where q = 0 < p)
    p_sub: np.ndarray  # [m]
    q_sub: np.ndarray  # [m]
    p_low: float  # p-mass of tokens with ratio <= 1
    beta1: float  # sum_x min(p, q)

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

    def spectr(self, kmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SpecTr k-SEQ for k = 1..kmax children: ``(rho, c, mass)``, each ``[kmax]``; rho* in [1, k]
        solves ``1 - (1 - beta)^k = rho beta`` with ``beta(rho) = sum_x min(q, p/rho)``, and the residual
        is ``(p - c min(q, p/rho*))+ / mass`` (p if mass = 0), c = c(beta(rho*)). See spectr_numerics.
        k = 1 or p == q on q's support -> rho* = 1; disjoint supports (beta = 0) -> k."""
        return spectr_solve(self.s_sub, self.p_sub, self.q_sub, self.p_low, self.beta1, kmax)
