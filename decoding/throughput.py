"""Offline throughput of a policy from labels and the latency model (ALGORITHMS.md section 6).

Over a set of roots c with labels ``E[c, a]`` (expected block efficiency, tokens per step) and step
times ``T[c, a]`` (seconds, `decoding.pricing.step_seconds`):

    realized TPS of a choice a(c) = sum_c E[c, a(c)] / sum_c T[c, a(c)]

- a *static* action uses the same a for every root; the *best static* maximises realized TPS (chosen
  on one set of roots, e.g. train, and measured on another);
- the per-root *oracle* picks ``argmax_a E[c, a] / T[c, a]`` (an upper bound for any selector that
  cannot see the future drafts, up to label noise);
- *autoregressive* is the action ``(1, 0, 0)``: E = 1, T = one target step.
NaN labels (a method that does not apply to an action, e.g. a chain-only method on K > 1) are never
chosen.

The *decision rule* of a selector is the oracle's with predicted labels (`decoding.pricing.decide`:
``argmax_a Ê_pred[c, a] / T[c, a]``, expected tokens per second), so a selector moved to another machine adapts by
re-profiling T. Numpy only.
"""

from __future__ import annotations

import numpy as np

from .pricing import decide


def realized_tps(E: np.ndarray, T: np.ndarray, choice: np.ndarray) -> float:
    """``sum_c E[c, choice[c]] / sum_c T[c, choice[c]]`` (tokens per second)."""
    rows = np.arange(E.shape[0])
    e, t = E[rows, choice], T[rows, choice]
    if not np.all(np.isfinite(e)):
        raise ValueError("realized_tps: a chosen action has no label (NaN) at some root")
    return float(e.sum() / t.sum())


def static_tps(E: np.ndarray, T: np.ndarray) -> np.ndarray:
    """``[A]`` realized TPS of every static action (-inf where an action has NaN labels)."""
    ok = np.all(np.isfinite(E), axis=0)
    with np.errstate(invalid="ignore"):
        tps = np.nansum(E, axis=0) / T.sum(axis=0)
    return np.where(ok, tps, -np.inf)


def best_static(E: np.ndarray, T: np.ndarray) -> int:
    """Index of the static action with the highest realized TPS on these roots."""
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
    """Best static (chosen on the fit roots) and oracle on the evaluation roots, as TPS and ratios."""
    a_static = best_static(E_fit, T_fit)
    n = E.shape[0]
    ar = realized_tps(E, T, np.full(n, ar_index))
    st = realized_tps(E, T, np.full(n, a_static))
    orc = realized_tps(E, T, oracle_choice(E, T))
    return {"best_static_index": a_static, "tps_autoregressive": ar, "tps_best_static": st, "tps_oracle": orc,
            "best_static_vs_ar": st / ar, "oracle_vs_ar": orc / ar, "oracle_vs_best_static": orc / st,
            "mean_label_best_static": float(np.mean(E[:, a_static]))}
