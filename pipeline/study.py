"""Selector studies on the collected data (not a dvc stage): ``python -m pipeline.study learning-curve --help``.

``learning-curve``: selector quality vs training roots. The TRAIN prompts are shuffled (``--seed``) and the
first 25 / 50 / 100 % of them (``--fractions``) train a selector each, with the stage's settings
(``train.*``: feature set, objective, epochs, ...; the last epoch is kept), and every selector is scored on the
same TEST roots (`selector.report.selector_report`): selector / oracle, / best static, / autoregressive,
regret, MAE and Spearman of Ê. Whole prompts are kept or dropped, so the splits stay by prompt. Writes JSON
(``--out``, default metrics/study_learning_curve.json) and a plot next to it (.png).

``objectives``: the training objectives (``--objectives``: regression, throughput), each trained with ``--seeds``
seeds on the same TRAIN roots and scored on the same TEST roots along the decode path (`decoding.throughput`):
selector / best static, / autoregressive, / oracle. Writes JSON (default metrics/study_objectives.json).

(The two-stage ``cascade`` study, the decision-focused ``path`` loss and the margin rule were removed when they did
not win; their numbers are in docs/selector.md and docs/history/.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from decoding.files import write_json_atomic

KEYS = ("selector_vs_oracle", "selector_vs_best_static", "selector_vs_autoregressive", "regret", "mae", "spearman")


def train_subset(data, keep_prompts: set[str]):
    """``data`` without the TRAIN roots of prompts outside ``keep_prompts`` (VAL and TEST untouched)."""
    keep = (data.split != "train") | np.isin(data.prompt_id, sorted(keep_prompts))
    return data.subset(np.flatnonzero(keep))


def fit_net(cfg, data, td):
    """A selector trained on ``data``'s TRAIN roots with ``train.*`` (the last epoch: no checkpoint); ``td``: the
    `pipeline.training_data.TrainingData` ``data`` was drawn from."""
    from pipeline.training_data import hparams
    from selector.data import SelectorDataModule
    from selector.training import fit_selector

    tc = cfg.train
    net = td.new_net(tc)
    fit_selector(net, SelectorDataModule(data, tc.batch_size, tc.seed), hparams(tc))
    return net


def score(net, data) -> dict:
    """``net``'s TEST report (KEYS, roots, prompts)."""
    from selector.training import predict

    fit, test = data.subset(data.rows("train")), data.subset(data.rows("test"))
    return {"train_roots": len(fit), "train_prompts": int(len(set(fit.prompt_id.tolist()))),
            "test_roots": len(test), **_test_row(predict(net, test), test, fit, fit.valid_outputs())}


def fit_and_score(cfg, data, td) -> dict:
    return score(fit_net(cfg, data, td), data)


def learning_curve(cfg, fractions: list[float], seed: int) -> dict:
    from pipeline.training_data import training_data

    td = training_data(cfg)
    data = td.data
    if not len(data.rows("test")):
        raise SystemExit("study: the collected dataset has no TEST roots to score on; collect with splits including test")
    prompts = sorted(set(data.prompt_id[data.rows("train")].tolist()))
    order = [prompts[i] for i in np.random.default_rng(seed).permutation(len(prompts))]
    points = []
    for f in fractions:
        n = max(1, int(round(f * len(order))))
        point = {"fraction": f, **fit_and_score(cfg, train_subset(data, set(order[:n])), td)}
        print(f"study learning-curve: {f:.0%} of TRAIN prompts ({point['train_roots']} roots): "
              + ", ".join(f"{k} {point[k]:.3f}" for k in KEYS), flush=True)
        points.append(point)
    return {"study": "learning-curve", "feature_set": cfg.train.feature_set, "objective": cfg.train.objective,
            "method": cfg.train.method, "seed": seed, "dataset": cfg.collect.out, "points": points,
            "note": "each point: a selector trained on the first fraction of the shuffled TRAIN prompts, "
                    "scored on all TEST roots (offline, labels + latency profile)"}


def _test_row(pred, data, fit, valid) -> dict:
    """`KEYS` of the selector's report on ``data`` (`selector.report.selector_report`)."""
    from selector.report import selector_report

    report = selector_report(pred, data, fit, valid)
    return {k: float(report[k]) for k in KEYS}


def objectives(cfg, names: list[str], seeds: list[int]) -> dict:
    """Each objective x seed trained on TRAIN and scored on TEST along the path. Returns per-run rows and, per
    objective, the mean and spread over seeds."""
    from dataclasses import replace

    from decoding import throughput
    from pipeline.training_data import training_data
    from selector.report import output_labels
    from selector.training import predict

    td = training_data(cfg)
    data = td.data
    fit, test = data.subset(data.rows("train")), data.subset(data.rows("test"))
    if not len(test):
        raise SystemExit("study objectives: the collected dataset needs TEST roots")
    valid = fit.valid_outputs()
    a_static = throughput.best_static(np.where(valid, fit.labels.astype(np.float64), np.nan), fit.cost_static)
    rows = []
    for name in names:
        for seed in seeds:
            c = cfg.replace(train=replace(cfg.train, objective=name, seed=seed))
            net = fit_net(c, data, td)
            rows.append({"variant": name, "seed": seed, **_test_row(predict(net, test), test, fit, valid)})
            print(f"study objectives: {rows[-1]['variant']} seed {seed}: selector / best static "
                  f"{rows[-1]['selector_vs_best_static']:.4f}", flush=True)
    summary = {}
    for v in dict.fromkeys(r["variant"] for r in rows):
        x = np.array([r["selector_vs_best_static"] for r in rows if r["variant"] == v])
        summary[v] = {"selector_vs_best_static_mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}
    return {"study": "objectives", "feature_set": cfg.train.feature_set, "method": cfg.train.method,
            "dataset": cfg.collect.out, "test_roots": len(test), "best_static": output_labels(fit)[a_static],
            "rows": rows, "summary": summary,
            "note": "path TPS (decoding.throughput) on TEST roots; selector priced with its decision cost"}


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result["points"]
    x = [p["train_roots"] for p in pts]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, keys in zip(axes, (("selector_vs_oracle", "selector_vs_best_static", "selector_vs_autoregressive"),
                               ("mae",), ("spearman",)), strict=True):
        for k in keys:
            ax.plot(x, [p[k] for p in pts], marker="o", label=k)
        ax.set_xlabel("training roots")
        ax.legend(fontsize=7)
    fig.suptitle(f"learning curve ({result['feature_set']}, {result['objective']}), TEST roots")
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Write a matplotlib figure to ``path`` (PNG) through a temp file and a rename, then close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--params`` and ``--set``: the configuration every study reads (`study_config`)."""
    parser.add_argument("--params", default="params.yaml", help="params file or preset (configs/quick.yaml, ...)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a parameter, e.g. --set train.epochs=10 (repeatable)")


def study_config(args: argparse.Namespace):
    """The configuration of `add_config_arguments`' flags (the built-in defaults when params.yaml is absent)."""
    from pipeline.config import load_config

    params = args.params if os.path.exists(args.params) or args.params != "params.yaml" else None
    return load_config(params, args.overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="study", required=True)
    lc = sub.add_parser("learning-curve", help="selector quality vs training roots (TEST roots, offline)")
    lc.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    lc.add_argument("--seed", type=int, default=0, help="shuffle of the TRAIN prompts")
    lc.add_argument("--out", default="metrics/study_learning_curve.json")
    add_config_arguments(lc)
    ob = sub.add_parser("objectives", help="the training objectives along the decode path (TEST roots)")
    ob.add_argument("--objectives", nargs="+", default=["regression", "throughput"],
                    choices=["regression", "throughput"])
    ob.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ob.add_argument("--out", default="metrics/study_objectives.json")
    add_config_arguments(ob)
    args = parser.parse_args(argv)
    if args.study == "learning-curve" and any(not 0 < f <= 1 for f in args.fractions):
        parser.error(f"--fractions must be in (0, 1], got {args.fractions}")
    cfg = study_config(args)
    out = Path(args.out)
    if args.study == "objectives":
        result = objectives(cfg, args.objectives, args.seeds)
    else:
        result = learning_curve(cfg, sorted(args.fractions), args.seed)
        result["plot"] = str(plot(result, out.with_suffix(".png")))
    write_json_atomic(out, result)
    print(json.dumps({"out": str(out), "plot": result.get("plot")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
