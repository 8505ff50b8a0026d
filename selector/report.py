"""Quality of a selector on held-out roots, from labels and the latency model (ALGORITHMS.md section 6).

No decoding is needed: a selector's predictions ``pred`` ``[n, O]`` give its choice at each root by the
decision rule ``argmax_o pred / cost`` (`decoding.pricing.decide`, over the valid outputs), and

    path TPS = n / sum_c T(c, a*(c)) / Ê(c, a*(c))      (`decoding.throughput`: tokens per second along the decode path)

where the selector pays ``cost`` (its features and inference) and static policies and the oracle pay
``cost_static``. `selector_report` compares the selector with:
- ``best_static``: the output with the best path TPS on the FIT (train) roots, measured here;
- ``best_static_per_sampling``: the same, chosen per sampling setting (a lookup table on T and top-p);
- ``oracle``: the per-root ``argmax Ê / T`` (what label-perfect predictions would give, free features);
- ``traversal_best_static``: Traversal's best static action (when Traversal's labels were collected);
- ``autoregressive``: one target step per token.
plus ``regret = 1 - TPS_selector / TPS_oracle``, the mean per-root regret of the rate Ê/T, and the
MAE and Spearman correlation of the predicted Ê per output. `selector_report` returns all of this overall,
per sampling setting, per prompt source and (``method: auto``) per method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decoding import pricing, throughput

from .data import SelectorData


def output_labels(data: SelectorData) -> list[str]:
    lay = data.layout
    return [f"{m}:{a}" if lay.auto else str(a) for m in lay.methods for a in lay.actions]


def _tps(E: np.ndarray, T: np.ndarray, choice: np.ndarray) -> float:
    return throughput.path_tps(E, T, choice)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import rankdata

    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def prediction_quality(pred: np.ndarray, E: np.ndarray, valid: np.ndarray) -> dict:
    """MAE and Spearman of the predicted Ê per output (valid outputs only) and their means."""
    mae = np.where(valid, np.nanmean(np.abs(pred - E), axis=0), np.nan)
    rho = np.array([_spearman(pred[:, o], E[:, o]) if valid[o] else np.nan for o in range(E.shape[1])])
    return {"mae": float(np.nanmean(mae)), "spearman": float(np.nanmean(rho)) if np.isfinite(rho).any() else
            float("nan"), "mae_per_output": mae.tolist(), "spearman_per_output": rho.tolist()}


def _ratios(tps: dict) -> dict:
    sel = tps["selector"]
    return {f"selector_vs_{k}": sel / v for k, v in tps.items() if k != "selector" and v > 0}


@dataclass(frozen=True)
class _Picks:
    """What each policy picks at every root of the report's data: the selector's output ``[n]``, the best static
    output (one, and per root its sampling's ``[n]``), Traversal's best static (None without Traversal labels)."""

    selector: np.ndarray
    static: int
    static_by_sampling: np.ndarray
    traversal_static: int | None


def _compare(E: np.ndarray, data: SelectorData, rows: np.ndarray, picks: _Picks) -> dict:
    """TPS of the selector and of each reference on ``rows`` of ``data`` (``E``: its labels, NaN where invalid)."""
    E, cost, cost_static = E[rows], data.cost[rows], data.cost_static[rows]
    choice, n = picks.selector[rows], len(rows)
    tps = {"selector": _tps(E, cost, choice),
           "best_static": _tps(E, cost_static, np.full(n, picks.static)),
           "best_static_per_sampling": _tps(E, cost_static, picks.static_by_sampling[rows]),
           "oracle": _tps(E, cost_static, throughput.oracle_choice(E, cost_static)),
           "autoregressive": float(n / data.cost_ar[rows].sum())}
    if data.traversal is not None:
        trav = data.traversal[rows].astype(np.float64)
        tps["traversal_best_static"] = _tps(trav, cost_static[:, : trav.shape[1]], np.full(n, picks.traversal_static))
    rate = E[np.arange(n), choice] / cost[np.arange(n), choice]
    best = np.max(np.where(np.isfinite(E), E, -np.inf) / cost_static, axis=1)
    return {"roots": int(n), "tps": tps, **_ratios(tps), "regret": 1.0 - tps["selector"] / tps["oracle"],
            "per_root_regret": float(np.mean(1.0 - rate / best))}


def selector_report(pred: np.ndarray, data: SelectorData, fit: SelectorData, valid: np.ndarray | None = None) -> dict:
    """The selector's report on ``data``'s roots (see module docstring); statics chosen on ``fit``."""
    valid = fit.valid_outputs() if valid is None else np.asarray(valid, bool)
    E = np.where(valid, data.labels.astype(np.float64), np.nan)  # [n, O]
    E_fit = np.where(valid, fit.labels.astype(np.float64), np.nan)
    choice = pricing.decide(pred, data.cost, valid)
    a_static = throughput.best_static(E_fit, fit.cost_static)
    keys, fit_keys = data.sampling(), fit.sampling()
    a_by_key = throughput.best_static_by_group(E_fit, fit.cost_static, fit_keys, keys, a_static)
    a_group = np.array([a_by_key[k] for k in keys], dtype=np.int64)
    a_trav = (throughput.best_static(fit.traversal.astype(np.float64), fit.cost_static[:, : fit.traversal.shape[1]])
              if fit.traversal is not None else None)

    picks = _Picks(choice, a_static, a_group, a_trav)

    def on(rows: np.ndarray) -> dict:
        return _compare(E, data, rows, picks)

    names = output_labels(data)
    report = on(np.arange(len(data)))
    report.update({k: v for k, v in prediction_quality(pred, E, valid).items() if not k.endswith("per_output")})
    report["best_static"] = names[a_static]
    counts = np.bincount(choice, minlength=len(names))
    report["chosen"] = {names[o]: float(c / len(data)) for o, c in enumerate(counts) if c}
    report["by_sampling"] = {k: {**on(np.flatnonzero(keys == k)), "best_static": names[a_by_key[k]]}
                             for k in np.unique(keys)}
    report["by_source"] = {s: on(np.flatnonzero(data.source == s)) for s in np.unique(data.source)}
    if data.layout.auto:
        report["by_method"] = {}
        for m in data.layout.methods:
            sl = data.layout.method_outputs(m)
            only = np.zeros_like(valid)
            only[sl] = valid[sl]
            c_m = pricing.decide(pred, data.cost, only)
            a_m = throughput.best_static(np.where(only, E_fit, np.nan), fit.cost_static)
            n = len(data)
            report["by_method"][m] = {
                "tps_selector_this_method": _tps(E, data.cost, c_m),
                "tps_best_static": _tps(E, data.cost_static, np.full(n, a_m)),
                "tps_oracle": _tps(E, data.cost_static,
                                   throughput.oracle_choice(np.where(only, E, np.nan), data.cost_static)),
                "best_static": names[a_m], "chosen_fraction": float(np.mean((choice >= sl.start) & (choice < sl.stop))),
            }
    report["_choice"] = choice  # popped by callers that serialize
    return report


def flat_metrics(report: dict, prefix: str) -> dict[str, float]:
    """The report's numbers as MLflow metric names ``<prefix>/...`` (groups as ``<prefix>/by_sampling/<key>/...``)."""
    out: dict[str, float] = {}

    def put(d: dict, p: str) -> None:
        for k, v in d.items():
            if k.startswith("_") or k in ("chosen", "best_static"):
                continue
            if isinstance(v, dict):
                put(v, f"{p}/{k}")
            elif isinstance(v, (int, float)) and np.isfinite(v):
                out[f"{p}/{k}".replace("=", "").replace(",", "_")] = float(v)

    put(report, prefix)
    return out


def serializable(report: dict) -> dict:
    return {k: v for k, v in report.items() if not k.startswith("_")}
