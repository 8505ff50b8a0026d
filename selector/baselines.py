"""scikit-learn baselines of the selector, judged exactly like it (`selector.report.selector_report`).

- ``best_static``: the output with the best path TPS on the train roots, at every root (a static
  policy: it pays no feature cost);
- ``ridge``: one multi-output ridge regression of Ê per output on the feature set's standardized SCALAR
  features (no hidden states), deciding by ``argmax Ê_pred / T`` at the feature set's cost;
- ``hgb``: one `HistGradientBoostingRegressor` per output on the same scalars (outputs whose train labels
  are identical, e.g. the ``L2 = 0`` actions that differ only in K, share one model).
Both regressors' predictions take the known values as the selector does (`with_known_values`: the empty
tree's Ê is 1, tied outputs copy their twin).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from decoding import throughput

from .data import SelectorData

BASELINES = ("best_static", "ridge", "hgb")


class ScalarRegressor:
    """Ê per output from the scalar features: ``kind`` ridge (multi-output) or hgb (one model per output)."""

    def __init__(self, kind: str, seed: int = 0, hgb_iter: int = 60) -> None:
        if kind not in ("ridge", "hgb"):
            raise ValueError(f"unknown regressor {kind!r}")
        self.kind, self.seed, self.hgb_iter = kind, seed, hgb_iter

    def fit(self, X: np.ndarray, E: np.ndarray, valid: np.ndarray) -> ScalarRegressor:
        from sklearn.ensemble import HistGradientBoostingRegressor
        from sklearn.linear_model import Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        self.valid = np.asarray(valid, bool)
        self.num_outputs = E.shape[1]
        cols = np.flatnonzero(self.valid)
        uniq, inverse = np.unique(E[:, cols].T, axis=0, return_inverse=True)  # [U, N], [V]
        self.cols, self.inverse = cols, inverse.reshape(-1)
        if self.kind == "ridge":
            self.models = [make_pipeline(StandardScaler(), Ridge(alpha=1.0)).fit(X, uniq.T)]
            return self
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):  # OpenMP threads only fight each other on small, busy CPUs
            self.models = [HistGradientBoostingRegressor(max_iter=self.hgb_iter, max_leaf_nodes=15,
                                                         learning_rate=0.1, early_stopping=False,
                                                         random_state=self.seed).fit(X, y) for y in uniq]
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """``[n, O]`` predicted Ê (0 for invalid outputs, which a decision never picks)."""
        if self.kind == "ridge":
            u = self.models[0].predict(X).reshape(X.shape[0], -1)  # [n, U]
        else:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(1):
                u = np.stack([m.predict(X) for m in self.models], axis=1)
        out = np.zeros((X.shape[0], self.num_outputs))
        out[:, self.cols] = u[:, self.inverse]
        return out


def with_known_values(pred: np.ndarray, layout) -> np.ndarray:
    """``pred`` with the layout's known values (`OutputLayout.constraints`): tied outputs copied, fixed set."""
    tied, fixed = layout.constraints()
    out = np.asarray(pred, dtype=np.float64)[:, tied]
    for o, v in fixed.items():
        out[:, o] = v
    return out


def baseline_reports(fit: SelectorData, evals: dict[str, SelectorData], report, kinds=BASELINES,
                     seed: int = 0) -> dict[str, dict]:
    """``{baseline: {"fit_seconds", <eval name>: report}}``: each baseline fitted on ``fit`` and evaluated
    on every set of ``evals`` (e.g. val and test) by ``report(pred, data, fit, valid)``
    (`selector.report.selector_report`)."""
    valid = fit.valid_outputs()
    out: dict[str, dict] = {}
    for kind in kinds:
        start = time.perf_counter()
        if kind == "best_static":
            E_fit = np.where(valid, fit.labels.astype(np.float64), np.nan)
            a = throughput.best_static(E_fit, fit.cost_static)
            entry = {"fit_seconds": time.perf_counter() - start}
            for name, data in evals.items():
                onehot = np.zeros((len(data), data.layout.size))
                onehot[:, a] = 1.0
                entry[name] = report(onehot, replace(data, cost=data.cost_static), fit, valid)
        elif kind in ("ridge", "hgb"):
            model = ScalarRegressor(kind, seed).fit(fit.inputs["scalars"], fit.labels.astype(np.float64), valid)
            entry = {"fit_seconds": time.perf_counter() - start}
            for name, data in evals.items():
                pred = with_known_values(model.predict(data.inputs["scalars"]), data.layout)
                entry[name] = report(pred, data, fit, valid)
        else:
            raise ValueError(f"unknown baseline {kind!r}; known: {', '.join(BASELINES)}")
        out[kind] = entry
    return out
