"""Offline throughput of a policy along the decode path, from labels and step prices (docs/throughput.md).

Over a set of roots c (positions drawn uniformly along target trajectories) with labels ``E[c, a]`` (expected
block efficiency: tokens per step) and step seconds ``T[c, a]`` (`decoding.pricing.step_seconds`), a policy that
chooses ``a(c)`` decodes, in the long run, at

    path TPS = n / sum_c T[c, a(c)] / E[c, a(c)]        (tokens per second)

A decoder does not start its steps at uniformly drawn positions: a step of E tokens skips the next E - 1 positions,
so steps start at a position with density about 1 / E there. The time spent around a position is then
``T / E`` (its step's time per token), and the time for n positions is the sum of those. Averaging E and T
separately (``sum E / sum T``, the estimator of earlier versions) weighs every position alike and overstates every
policy whose E varies over positions (`arithmetic_tps` keeps it, for comparison only). The derivation and its check
against a simulated decoder that walks labelled positions are in docs/throughput.md and tests/test_throughput.py.

- a *static* action uses the same a at every root; the *best static* maximises path TPS (chosen on one set of
  roots, e.g. train, and measured on another);
- the per-root *oracle* picks ``argmax_a E[c, a] / T[c, a]``: it minimises every term ``T / E`` of the sum, so it
  is the best any policy can do along the path with these labels (up to label noise; it cannot see future drafts);
- *autoregressive* is the action ``(1, 0, 0)``: E = 1, T = one plain step.
NaN labels (a method that does not apply to an action, e.g. a chain-only method on K > 1) are never chosen.

The decision rule of a selector is the oracle's with predicted labels (`decoding.pricing.decide`). Numpy only.
"""

from __future__ import annotations

import numpy as np

from .pricing import decide


def _chosen(E: np.ndarray, T: np.ndarray, choice: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(E.shape[0])
    e, t = E[rows, choice], T[rows, choice]
    if not np.all(np.isfinite(e)):
        raise ValueError("path_tps: a chosen action has no label (NaN) at some root")
    if np.any(e <= 0):
        raise ValueError("path_tps: a chosen label is not positive (a step emits at least one token)")
    return e, t


def path_tps(E: np.ndarray, T: np.ndarray, choice: np.ndarray) -> float:
    """``n / sum_c T[c, choice[c]] / E[c, choice[c]]``: tokens per second along the decode path."""
    e, t = _chosen(E, T, choice)
    return float(e.size / np.sum(t / e))


def arithmetic_tps(E: np.ndarray, T: np.ndarray, choice: np.ndarray) -> float:
    """``sum_c E / sum_c T`` over uniformly drawn roots: NOT what a decoder gets (module docstring); reported next to
    `path_tps` only to show how much a policy's varying E inflates it."""
    e, t = _chosen(E, T, choice)
    return float(e.sum() / t.sum())


def static_tps(E: np.ndarray, T: np.ndarray) -> np.ndarray:
    """``[A]`` path TPS of every static action (-inf where an action has a NaN label at some root)."""
    ok = np.all(np.isfinite(E), axis=0) & np.all(np.nan_to_num(E, nan=1.0) > 0, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tps = E.shape[0] / np.sum(T / E, axis=0)
    return np.where(ok, tps, -np.inf)


def best_static(E: np.ndarray, T: np.ndarray) -> int:
    """Index of the static action with the highest path TPS on these roots."""
    return int(np.argmax(static_tps(E, T)))


def best_static_by_group(E_fit: np.ndarray, T_fit: np.ndarray, fit_keys: np.ndarray, keys: np.ndarray,
                         fallback: int) -> dict:
    """Group key (e.g. the sampling setting) -> the best static action chosen on the fit roots of that key,
    for every key of ``keys``; ``fallback`` for a key without fit roots."""
    return {k: best_static(E_fit[fit_keys == k], T_fit[fit_keys == k]) if (fit_keys == k).any() else fallback
            for k in np.unique(keys)}


def oracle_choice(E: np.ndarray, T: np.ndarray) -> np.ndarray:
    """``[N]`` per-root ``argmax_a E[c, a] / T[c, a]`` (the decision rule with the true labels)."""
    return decide(E, T)


def summary(E_fit: np.ndarray, T_fit: np.ndarray, E: np.ndarray, T: np.ndarray, ar_index: int) -> dict:
    """Best static (chosen on the fit roots) and oracle on the evaluation roots, as path TPS and ratios."""
    a_static = best_static(E_fit, T_fit)
    n = E.shape[0]
    ar = path_tps(E, T, np.full(n, ar_index))
    st = path_tps(E, T, np.full(n, a_static))
    orc = path_tps(E, T, oracle_choice(E, T))
    return {"best_static_index": a_static, "tps_autoregressive": ar, "tps_best_static": st, "tps_oracle": orc,
            "best_static_vs_ar": st / ar, "oracle_vs_ar": orc / ar, "oracle_vs_best_static": orc / st,
            "mean_label_best_static": float(np.mean(E[:, a_static]))}
