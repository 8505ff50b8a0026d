"""Diagnostic plots of a selector on held-out roots (PNG files for MLflow): predicted vs measured Ê, the
chosen-output histogram, and the realized-TPS gain per sampling setting and per prompt source."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import SelectorData
from .report import output_labels


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG, 100 dpi) and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _gain_bars(plt, groups: dict, title: str, path: Path) -> Path:
    names = list(groups)
    refs = [("selector_vs_best_static", "selector / best static"), ("selector_vs_oracle", "selector / oracle"),
            ("selector_vs_autoregressive", "selector / autoregressive")]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(names)), 3.5))
    for i, (key, label) in enumerate(refs):
        ax.bar(x + (i - 1) * 0.27, [groups[n].get(key, np.nan) for n in names], 0.27, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, [f"{n}\n({groups[n]['roots']} roots)" for n in names], fontsize=8)
    ax.set_ylabel("path TPS ratio")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def selector_plots(report: dict, pred: np.ndarray, data: SelectorData, valid: np.ndarray, folder: str | Path,
                   split: str = "test") -> list[Path]:
    """Write the four plots for ``report`` (`selector.report.selector_report` on ``data``) into ``folder``; returns
    their paths."""
    plt = _figure()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    # predicted vs measured Ê
    E = data.labels.astype(np.float64)
    mask = np.isfinite(E) & valid[None, :]
    p, e = pred[mask], E[mask]
    if p.size > 20000:
        keep = np.random.default_rng(0).choice(p.size, 20000, replace=False)
        p, e = p[keep], e[keep]
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(e, p, s=3, alpha=0.3)
    lo, hi = float(min(e.min(), p.min())), float(max(e.max(), p.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("measured Ê (label)")
    ax.set_ylabel("predicted Ê")
    ax.set_title(f"{split}: MAE {report['mae']:.3f}, Spearman {report['spearman']:.3f}")
    paths.append(_save(plt, fig, folder / f"{split}_pred_vs_measured.png"))
    # chosen outputs
    names = output_labels(data)
    counts = np.bincount(report["_choice"], minlength=len(names)) / max(1, len(data))
    used = np.flatnonzero(counts)
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(used)), 3.5))
    ax.bar(np.arange(used.size), counts[used])
    ax.set_xticks(np.arange(used.size), [names[o] for o in used], rotation=70, fontsize=7)
    ax.set_ylabel("fraction of roots")
    ax.set_title(f"{split}: chosen (method:)action, {used.size} in use; best static {report['best_static']}")
    paths.append(_save(plt, fig, folder / f"{split}_chosen_actions.png"))
    paths.append(_gain_bars(plt, report["by_sampling"], f"{split}: gain by sampling setting",
                            folder / f"{split}_gain_by_temperature.png"))
    paths.append(_gain_bars(plt, report["by_source"], f"{split}: gain by prompt source",
                            folder / f"{split}_gain_by_source.png"))
    return paths
