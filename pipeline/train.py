"""``branchpoint train``: stage train, the selector of ALGORITHMS.md section 6 on the collected dataset.

Reads: the collected dataset (``collect.out``: features + labels, splits by prompt), the latency profile
(``profile.out``), params ``train.*``. Writes: the selector folder ``train.out`` (`selector.network.save_selector`:
weights + meta; ``checkpoints/best.ckpt`` from Lightning's ModelCheckpoint) and ``train.metrics``
(metrics/train.json). Steps:

1. arrays of every root for the feature set and output layout (``train.method``: one method, or ``auto``:
   every (method, action)); step costs from `decoding.pricing`, the selector's including what deciding costs
   and (``charge_inference``) its own forward time measured here (`pipeline.training_data`);
2. Lightning fit (objective ``train.objective``), standardization fitted on TRAIN, validation on VAL each
   epoch (path TPS, regret, MAE, Spearman; MLflow ``val/...``), best epoch restored;
3. TEST report of the selector and of the scikit-learn baselines (``train.baselines``, each its own MLflow
   run in the same experiment), plots, the selector folder, the metrics file.

MLflow (`pipeline.tracking`: ``tracking.uri`` unless $MLFLOW_TRACKING_URI is set, experiment
``tracking.experiment``): one run per training tagged ``stage=train``, the git revision and the dataset's
config hash; the baselines are runs of their own with the same tags and metric names.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.training_data import TrainingData, hparams, training_data

SECTIONS = ("model", "tracking", "profile", "collect", "train")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true", help="show Lightning's progress bar")
    parser.add_argument("--run-name", default=None, help="MLflow run name (default: method/feature set/objective)")


def _summary(report: dict) -> dict:
    keys = ("roots", "tps", "selector_vs_best_static", "selector_vs_best_static_per_sampling", "selector_vs_oracle",
            "selector_vs_traversal_best_static", "selector_vs_autoregressive", "regret", "per_root_regret", "mae",
            "spearman", "best_static", "chosen")
    return {k: report[k] for k in keys if k in report}


def _log_baselines(client, experiment_id: str, results: dict, params: dict, tags: dict) -> dict[str, str]:
    from selector.report import flat_metrics

    ids = {}
    for kind, entry in results.items():
        run = client.create_run(experiment_id, run_name=f"baseline-{kind}/{params['method']}/{params['feature_set']}",
                                tags={**tags, "model": f"baseline:{kind}"})
        for k, v in {**params, "baseline": kind}.items():
            client.log_param(run.info.run_id, k, v)
        metrics = {"fit_seconds": entry["fit_seconds"]}
        for split in ("val", "test"):
            metrics.update(flat_metrics(entry[split], split))
        _log_metrics(client, run.info.run_id, metrics)
        client.set_terminated(run.info.run_id)
        ids[kind] = run.info.run_id
    return ids


def _log_metrics(client, run_id: str, metrics: dict[str, float]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
    for i in range(0, len(items), 900):
        client.log_batch(run_id, metrics=items[i:i + 900])


@dataclass
class TrainedSelector:
    """What one training produced, beside the network: the reports per split, the outputs with a label on TRAIN,
    the TRAIN roots, the MLflow run, the best checkpoint and the baselines (`selector.baselines`)."""

    reports: dict
    valid: Any  # [O] bool
    fit: Any  # selector.data.SelectorData, the TRAIN roots
    run_id: str
    tags: dict
    best_ckpt: str | None
    chain: bool = False
    baselines: dict = field(default_factory=dict)
    baseline_runs: dict = field(default_factory=dict)


def start_tracking(cfg, args, td: TrainingData):
    """``(MLflow logger, params, tags, tracking uri)`` of the selector's run; logs its hyperparameters once."""
    from pytorch_lightning.loggers import MLFlowLogger

    from pipeline.tracking import stage_tags, tracking_uri

    tc = cfg.train
    run_name = args.run_name or f"{tc.method}/{tc.feature_set}/{tc.objective}"
    layout, data = td.layout, td.data
    tags = stage_tags(cfg, "train", {"dataset_config_hash": td.manifest["config_hash"]})  # nested in the pipeline run
    uri = tracking_uri(cfg)
    logger = MLFlowLogger(experiment_name=cfg.tracking.experiment, tracking_uri=uri, run_name=run_name,
                          tags={**tags, "model": "selector"})
    params = {"method": tc.method, "feature_set": tc.feature_set, "objective": tc.objective,
              "methods": ",".join(layout.methods), "outputs": layout.size, "dataset": cfg.collect.out,
              "latency_profile": cfg.profile.out, "inference_seconds": td.inference_seconds,
              **{f"train.{k}": v for k, v in dataclasses.asdict(tc).items() if k not in ("method", "feature_set",
                                                                                       "objective")},
              **{f"roots_{s}": int((data.split == s).sum()) for s in ("train", "val", "test")}}
    logger.log_hyperparams(params)  # the one explicit hyperparameter log
    return logger, params, tags, uri


def selector_meta(cfg, td: TrainingData, run: TrainedSelector) -> dict:
    """The trained selector's meta (`selector.network.save_selector`); ``kind``: ``chain`` (outputs: chains
    ``(1, n, 0)``, verified as one chain, `pipeline.chain_selector`) or ``tree``."""
    from decoding.files import sha256_file
    from selector.report import serializable

    tc, layout, schema, latency, fit, data = cfg.train, td.layout, td.schema, td.latency, run.fit, td.data
    return {
        "kind": "chain" if run.chain else "tree", "feature_set": tc.feature_set, "schema": schema.to_dict(), "hidden_sizes": dict(schema.hidden_sizes),
        "scalars": list(schema.scalars), "objective": tc.objective,
        "outputs": {**layout.to_dict(), "valid": [bool(v) for v in run.valid]},
        "latency": latency.to_dict(),  # the profile the costs came from (export embeds it in its sidecar)
        "decision": "argmax over valid outputs o of output[o] / T(o) (decoding.pricing.decide); T = "
                    "decoding.pricing.step_seconds(latency, context_length, actions, methods, feature_set, "
                    "inference_seconds) (method-major)",
        "inference_seconds": td.inference_seconds,
        "latency_profile": {"path": cfg.profile.out, "sha256": sha256_file(cfg.profile.out),
                            "meta": getattr(latency, "meta", {})},
        "metrics": {k: _summary(serializable(r)) for k, r in run.reports.items()},
        "sampling_range": {"temperature": [float(fit.temperature.min()), float(fit.temperature.max())],
                          "top_p": [float(fit.top_p.min()), float(fit.top_p.max())],
                          "settings": sorted(set(fit.sampling().tolist()))},  # of the train roots
        "pair": td.manifest["pair"],
        "dataset": {"path": cfg.collect.out, "config_hash": td.manifest["config_hash"], "rows": len(data),
                    "roots_per_split": {s: int((data.split == s).sum()) for s in ("train", "val", "test")}},
        "git_revision": run.tags["git_revision"], "train_config": dataclasses.asdict(tc), "mlflow_run_id": run.run_id,
        "best_checkpoint": os.path.relpath(run.best_ckpt, tc.out) if run.best_ckpt else None,
    }


def log_selector_artifacts(client, net, out: Path, run: TrainedSelector, splits: dict) -> str:
    """Plots of the evaluated split, the selector files and the best checkpoint into the MLflow run; the split."""
    from selector.plots import selector_plots
    from selector.training import predict

    ev = "test" if "test" in run.reports else "val"
    for p in selector_plots(run.reports[ev], predict(net, splits[ev]), splits[ev], run.valid, out / "plots", ev):
        client.log_artifact(run.run_id, str(p), "plots")
    for name in ("selector.safetensors", "selector.json"):
        client.log_artifact(run.run_id, str(out / name), "selector")
    if run.best_ckpt:
        client.log_artifact(run.run_id, run.best_ckpt, "checkpoints")
    return ev


def train_metrics(tc, td: TrainingData, meta: dict, run: TrainedSelector, seconds: dict) -> dict:
    from selector.report import serializable

    return {
        "method": tc.method, "feature_set": tc.feature_set, "objective": tc.objective, "outputs": td.layout.size,
        "roots_per_split": meta["dataset"]["roots_per_split"], "config_hash": td.manifest["config_hash"],
        "seconds": seconds, "inference_seconds": td.inference_seconds, "mlflow_run_id": run.run_id,
        "mlflow_baseline_runs": run.baseline_runs,
        **{k: serializable(r) for k, r in run.reports.items()},
        "baselines": {k: {"fit_seconds": e["fit_seconds"], **{s: _summary(serializable(e[s])) for s in e
                                                              if s != "fit_seconds"}}
                      for k, e in run.baselines.items()},
    }


def run(cfg, args) -> int:
    return train_one(cfg, args)


def train_one(cfg, args, chain: bool = False) -> int:
    """Train the selector (``chain``: a chain selector, `pipeline.chain_selector`) and write its folder and metrics."""
    import torch

    from decoding.files import write_json_atomic
    from selector.baselines import baseline_reports
    from selector.data import SelectorDataModule
    from selector.network import save_selector
    from selector.report import flat_metrics, selector_report
    from selector.training import FitSetup, fit_selector, predict

    tc = cfg.train
    torch.set_num_threads(tc.threads)
    start = time.perf_counter()
    td = training_data(cfg, chain)
    data, layout = td.data, td.layout
    dm = SelectorDataModule(data, tc.batch_size, tc.seed)
    net = td.new_net(tc)
    load_seconds = time.perf_counter() - start
    logger, params, tags, uri = start_tracking(cfg, args, td)
    out = Path(tc.out)
    fit_start = time.perf_counter()
    setup = FitSetup(logger, str(out / "checkpoints"), tc.accelerator, tc.devices, tc.strategy, args.progress)
    module, best_ckpt = fit_selector(net, dm, hparams(tc), setup)
    fit_seconds = time.perf_counter() - fit_start
    if module.global_rank != 0:
        return 0
    fit, val, test = (data.subset(data.rows(s)) for s in ("train", "val", "test"))
    valid = fit.valid_outputs()
    reports = {"val": module.last_report}
    if len(test):
        reports["test"] = selector_report(predict(net, test), test, fit, valid)
    base_start = time.perf_counter()
    baselines = baseline_reports(fit, {k: v for k, v in (("val", val), ("test", test)) if len(v)}, selector_report,
                                 tc.baselines, tc.seed) if tc.baselines else {}
    base_seconds = time.perf_counter() - base_start
    client, run_id = logger.experiment, logger.run_id
    _log_metrics(client, run_id, {**flat_metrics(reports.get("test", {}), "test"), "fit_seconds": fit_seconds})
    baseline_runs = _log_baselines(client, logger.experiment_id, baselines, params, tags) if baselines else {}
    run = TrainedSelector(reports, valid, fit, run_id, tags, best_ckpt, chain, baselines, baseline_runs)
    meta = selector_meta(cfg, td, run)
    save_selector(out, net, meta)
    ev = log_selector_artifacts(client, net, out, run, {"test": test, "val": val})
    total = time.perf_counter() - start
    seconds = {"load": load_seconds, "fit": fit_seconds, "baselines": base_seconds, "total": total}
    metrics = train_metrics(tc, td, meta, run, seconds)
    metrics["world_size"] = module.trainer.world_size  # processes the fit ran on (DDP: train.devices)
    metrics["optimizer_steps"] = module.trainer.global_step  # the same on any number of devices
    write_json_atomic(tc.metrics, metrics)
    client.set_terminated(run_id)
    print(f"train: {layout.size} outputs ({tc.method}, {tc.feature_set}, {tc.objective}); "
          f"{int((data.split == 'train').sum())} train roots; fit {fit_seconds:.0f} s, total {total:.0f} s "
          f"-> {out}/, {tc.metrics}; MLflow run {run_id} ({uri})")
    print(results_table(metrics, ev))
    return 0


def results_table(metrics: dict, split: str = "test") -> str:
    """Realized TPS of the selector and the baselines on ``split``, as ratios to the references."""
    cols = ("selector_vs_best_static", "selector_vs_oracle", "selector_vs_autoregressive",
            "selector_vs_traversal_best_static")
    head = (f"{split.upper():24s} {'TPS':>8s} {'/best static':>12s} {'/oracle':>8s} {'/AR':>6s} {'/Trav.static':>12s} "
            f"{'used':>4s}")
    rows = [head]
    entries = [("selector", metrics.get(split))] + [(f"baseline {k}", e.get(split))
                                                    for k, e in metrics.get("baselines", {}).items()]
    for name, r in entries:
        if not r:
            continue
        vals = " ".join(f"{r.get(c, float('nan')):{w}.3f}" for c, w in zip(cols, (12, 8, 6, 12), strict=True))
        rows.append(f"{name:24s} {r['tps']['selector']:8.1f} {vals} {len(r.get('chosen', {})):4d}")
    r = metrics.get(split)
    if r:
        t = r["tps"]
        rows.append(f"(references, tokens/s: best static {t['best_static']:.1f} = {r.get('best_static')}, oracle "
                    f"{t['oracle']:.1f}, autoregressive {t['autoregressive']:.1f})")
    return "\n".join(rows)
