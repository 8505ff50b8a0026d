"""Small probability helpers shared by draft trees, verifiers and labels (pure numpy).

Vocabulary:
- a *distribution row* is a 1-D float array over the vocabulary that is finite, non-negative and
  sums to 1 (within ``ROW_SUM_ATOL``);
- the *residual* of two distributions is ``norm((a - b)+)``, the law a rejection step samples from;
- the *acceptance* of a draft token x is ``min(1, p(x) / q(x))`` (standard speculative sampling).
"""

from __future__ import annotations

import numpy as np

ROW_SUM_ATOL = 1e-5  # float32 softmax over 49k tokens sums to 1 within ~1e-6


def as_float64(a: np.ndarray) -> np.ndarray:
    """``a`` as a float64 array (no copy when it already is one)."""
    return np.asarray(a, dtype=np.float64)


def check_distribution(row: np.ndarray, name: str) -> np.ndarray:
    """Return ``row`` as a float64 1-D array, or raise ValueError saying what is wrong with it."""
    arr = np.asarray(row)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"{name}: expected a 1-D distribution over the vocabulary, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or inf")
    if np.any(arr < 0):
        raise ValueError(f"{name}: has negative entries (min {arr.min():.3g})")
    total = float(arr.sum())
    if abs(total - 1.0) > ROW_SUM_ATOL:
        raise ValueError(f"{name}: sums to {total:.8g}, not 1; pass probabilities, not logits")
    return arr


def check_rows(rows: np.ndarray, name: str, n: int, vocab_size: int | None = None,
               required: np.ndarray | None = None) -> np.ndarray:
    """Validate a ``[n, V]`` array of distribution rows; only rows where ``required`` is True must
    sum to 1 (e.g. leaves of a draft tree may carry zero q rows). Returns it as given (no copy)."""
    arr = np.asarray(rows)
    if arr.ndim != 2 or arr.shape[0] != n or (vocab_size is not None and arr.shape[1] != vocab_size):
        want = f"[{n}, {vocab_size if vocab_size is not None else 'V'}]"
        raise ValueError(f"{name}: expected shape {want}, got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name}: expected a float array, got dtype {arr.dtype}")
    sums = arr.sum(axis=1, dtype=np.float64)  # [n]; NaN / inf propagate into the sums
    if not np.all(np.isfinite(sums)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"{name}: NaN or inf at row {bad[0]}, token {bad[1]}")
    if arr.size and arr.min() < 0:
        bad = np.argwhere(arr < 0)[0]
        raise ValueError(f"{name}: negative probability at row {bad[0]}, token {bad[1]}")
    mask = np.ones(n, dtype=bool) if required is None else np.asarray(required, dtype=bool)
    off = np.flatnonzero(mask & (np.abs(sums - 1.0) > ROW_SUM_ATOL))
    if off.size:
        raise ValueError(f"{name}: row {off[0]} sums to {sums[off[0]]:.8g}, not 1 "
                         f"({off.size} bad rows); pass probabilities, not logits")
    return arr


def categorical(weights: np.ndarray, rng: np.random.Generator) -> int:
    """Draw an index with probability proportional to the non-negative ``weights`` (inverse CDF).

    Zero-weight indices are never returned, also at the float edge ``u * total == total``."""
    cdf = np.cumsum(weights, dtype=np.float64)  # [V]
    total = cdf[-1]
    if not total > 0:
        raise ValueError("categorical: all weights are zero")
    i = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    if i >= cdf.shape[0]:  # u * total rounded up to total: take the last index with positive weight
        i = int(np.flatnonzero(np.asarray(weights) > 0)[-1])
    return i


def residual(a: np.ndarray, b: np.ndarray, fallback: np.ndarray | None = None) -> np.ndarray:
    """``norm((a - b)+)`` along the last axis. Where the positive part has zero mass (a <= b, i.e.
    a == b for two distributions; a rejection then has probability 0), return ``fallback``
    (default ``a``) so the result is always a distribution."""
    diff = np.maximum(a - b, 0.0)
    mass = diff.sum(axis=-1, keepdims=True)
    fb = a if fallback is None else fallback
    safe = np.where(mass > 0, mass, 1.0)
    return np.where(mass > 0, diff / safe, fb)


def acceptance(p_x: np.ndarray | float, q_x: np.ndarray | float) -> np.ndarray:
    """Standard speculative-sampling acceptance ``min(1, p(x)/q(x))`` of a token drawn from q.

    ``q(x) = 0`` cannot occur for a drawn token; it is mapped to 1 if ``p(x) > 0`` else 0."""
    p_x = np.asarray(p_x, dtype=np.float64)
    q_x = np.asarray(q_x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q_x > 0, p_x / np.where(q_x > 0, q_x, 1.0), np.where(p_x > 0, 1.0, 0.0))
    return np.minimum(ratio, 1.0)


def shifted_mass(p: np.ndarray, q: np.ndarray, shift: np.ndarray | float) -> np.ndarray:
    """``sum_x (p(x) - shift * q(x))+`` along the last axis (``shift`` broadcasts over leading axes).

    Repeated rejection residuals have the closed form ``norm((p - c q)+)``: norm((norm((p - c q)+) - q)+)
    = norm((p - (c + m) q)+) with ``m = shifted_mass(p, q, c)``, so a chain of residuals costs one
    pass over the vocabulary per step and its values at single tokens are scalars."""
    d = p - np.asarray(shift, dtype=np.float64)[..., None] * q
    np.maximum(d, 0.0, out=d)
    return d.sum(axis=-1)
