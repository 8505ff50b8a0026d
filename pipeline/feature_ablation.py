"""Which target-side features carry the selector: ``python -m pipeline.feature_ablation --help`` (a study, not a
dvc stage).

Trains ``target_only`` selectors (the stage's ``train.*`` settings; the last epoch is kept, as in
`pipeline.study`) on the collected dataset, once with every input and once per hidden-state input with that input
*removed*: replaced by zeros on every root, so it carries no information while the network keeps its shape. Each
selector is scored on the VAL and TEST roots (`selector.report.selector_report`: realized tokens/s from the labels
and the latency profile, / autoregressive, / best static, / per-root oracle, regret, MAE and Spearman of Ê),
for every ``--seeds`` (the seed of the network's initialization and of the batch order).

This is how the root token's embedding (``e_root``, `decoding.features`) was found to matter: ``h_p_prev``
describes the context before the root, so without ``e_root`` the selector does not know which token the
target just sampled. Writes ``--out`` (JSON, default metrics/study_feature_ablation.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from decoding.files import write_json_atomic

FEATURE_SET = "target_only"
KEYS = ("selector_vs_autoregressive", "selector_vs_best_static", "selector_vs_oracle", "regret", "mae", "spearman")


def without(data, name: str | None):
    """``data`` with the hidden-state input ``name`` set to zeros on every root (None: unchanged)."""
    if name is None:
        return data
    inputs = {k: (np.zeros_like(v) if k == name else v) for k, v in data.inputs.items()}
    return dataclasses.replace(data, inputs=inputs)


def scores(net, data) -> dict[str, dict[str, float]]:
    """``{split: {KEY: value}}`` of ``net`` on the VAL and TEST roots (chosen among TRAIN's valid outputs)."""
    from selector.report import selector_report
    from selector.training import predict

    fit = data.subset(data.rows("train"))
    out = {}
    for split in ("val", "test"):
        part = data.subset(data.rows(split))
        if len(part):
            report = selector_report(predict(net, part), part, fit, fit.valid_outputs())
            out[split] = {k: float(report[k]) for k in KEYS}
    return out


def ablation(cfg, seeds: list[int]) -> dict:
    from pipeline.study import fit_net
    from pipeline.training_data import training_data

    c = cfg.replace(train=dataclasses.replace(cfg.train, feature_set=FEATURE_SET))
    td = training_data(c)
    data = td.data
    variants = {"all inputs": None, **{f"without {h}": h for h in td.schema.hidden}}
    runs = []
    for seed in seeds:
        cs = c.replace(train=dataclasses.replace(c.train, seed=seed))
        for label, name in variants.items():
            d = without(data, name)
            run = {"variant": label, "seed": seed, **scores(fit_net(cs, d, td), d)}
            runs.append(run)
            print(f"feature ablation: seed {seed}, {label}: " + "; ".join(
                f"{s} " + ", ".join(f"{k} {v:.3f}" for k, v in run[s].items()) for s in ("val", "test") if s in run),
                flush=True)
    mean = {}
    for label in variants:
        mine = [r for r in runs if r["variant"] == label]
        mean[label] = {s: {k: float(np.mean([r[s][k] for r in mine])) for k in KEYS} for s in ("val", "test")
                       if s in mine[0]}
    return {"study": "feature-ablation", "feature_set": FEATURE_SET, "objective": cfg.train.objective,
            "method": cfg.train.method, "seeds": seeds, "dataset": cfg.collect.out, "runs": runs, "mean": mean,
            "note": "each variant: a target_only selector with that hidden-state input zeroed on every root, "
                    "scored offline on VAL and TEST roots; mean over seeds"}


def main(argv: list[str] | None = None) -> int:
    from pipeline.study import add_config_arguments, study_config

    parser = argparse.ArgumentParser(prog="python -m pipeline.feature_ablation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one selector per seed and variant")
    parser.add_argument("--out", default="metrics/study_feature_ablation.json")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    cfg = study_config(args)
    result = ablation(cfg, args.seeds)
    out = Path(args.out)
    write_json_atomic(out, result)
    print(json.dumps({"out": str(out), "mean": result["mean"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
