"""``branchpoint export``: stage export, the trained selector as ONNX + sidecar (export/onnx_export.py).

Reads: the trained selector (``train.out``), held-out rows of the collected dataset (``collect.out``, TEST
split, else VAL) for the parity check. Writes: ``export.out`` (selector.onnx + selector.json), atomically;
logs that folder to MLflow as the run's ``selector/`` artifacts and registers it as a version of
``export.registered_model`` (so ``mlflow artifacts download -u models:/<name>/<N>`` gives a selector folder as is),
plus the ONNX model (float32 signature, input example) for the UI; tags the run with the train run id.
``branchpoint decode --selector <export.out>`` decodes with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SECTIONS = ("model", "tracking", "collect", "train", "export")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--selector", default=None, help="trained selector folder (default: train.out)")
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging and registration")


def parity_rows(cfg, meta: dict, rows: int):
    """(inputs, step_seconds) of up to ``rows`` held-out roots, built as training built them."""
    import numpy as np

    from data_collection.dataset import load_collected
    from decoding import pricing
    from decoding.actions import parse_action
    from decoding.features import FeatureSchema, batch_inputs
    from decoding.latency import LatencyModel

    schema = FeatureSchema.from_dict(meta["schema"])
    latency = LatencyModel.from_dict(meta["latency"])
    ds = load_collected(cfg.collect.out, splits=["test"])
    if len(ds) == 0:
        ds = load_collected(cfg.collect.out, splits=["val"])
    ds = ds.select(range(min(rows, len(ds))))
    needed = [*schema.hidden, "context_length", *[n for n in schema.scalars if n in ds.column_names]]
    cols = {n: np.asarray(ds.with_format("numpy")[n]) for n in needed}
    inputs = batch_inputs(schema, cols, latency)
    actions = [parse_action(a) for a in meta["outputs"]["actions"]]
    methods = meta["outputs"]["methods"]
    seconds = pricing.step_seconds(latency, cols["context_length"], actions, methods, schema.feature_set)  # [N, O]
    seconds = seconds.astype(np.float32)
    return inputs, seconds


def register_selector(client, name: str, run, train_run_id: str | None):
    """Register the run's ``selector/`` artifact folder (selector.onnx + selector.json) as a new version of
    ``name``: ``mlflow artifacts download -u models:/<name>/<version>`` then gives that folder as is."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:  # the first version: create the registered model
        client.create_registered_model(name, description="branchpoint tree-shape selector: selector.onnx + "
                                       "selector.json (load with export.runtime.SelectorRuntime)")
    tags = {"train_run_id": train_run_id} if train_run_id else {}
    return client.create_model_version(name, source=f"{run.info.artifact_uri}/selector", run_id=run.info.run_id,
                                       tags=tags)


def logged_and_registered(cfg, run, train_run_id: str | None) -> str:
    """Register the run's ``selector/`` folder when ``export.registered_model`` is set; where it went, in words."""
    from mlflow import MlflowClient

    from pipeline.tracking import tracking_uri

    where = f"run {run.info.run_id}"
    if cfg.export.registered_model:
        version = register_selector(MlflowClient(tracking_uri(cfg)), cfg.export.registered_model, run, train_run_id)
        where += f"; registered models:/{cfg.export.registered_model}/{version.version}"
    return where


def log_to_mlflow(cfg, folder: Path, sidecar: dict, inputs: dict, train_run_id: str | None = None) -> str:
    """Log the selector folder as the run's ``selector/`` artifacts, the ONNX model (signature + input example,
    one file) as a logged model for the UI, and register the folder (`register_selector`)."""
    import mlflow
    import numpy as np
    import onnx
    from mlflow.models import infer_signature

    from pipeline.tracking import start_run

    example = {k: np.asarray(v[:1], dtype=np.float32) for k, v in inputs.items()}
    example["step_seconds"] = np.ones((1, len(sidecar["outputs"]["table"])), dtype=np.float32)
    outputs = {sidecar["outputs"]["names"][0]: np.zeros((1, len(sidecar["outputs"]["table"])), dtype=np.float32),
               "choice": np.zeros(1, dtype=np.int64)}
    tags = {"onnx_sha256": sidecar["onnx_sha256"], **({"train_run_id": train_run_id} if train_run_id else {})}
    with start_run(cfg, "export", tags=tags) as run:
        mlflow.log_params({"feature_set": sidecar["feature_set"], "methods": ",".join(sidecar["outputs"]["methods"]),
                           "outputs": len(sidecar["outputs"]["table"]), "opset": sidecar["opset"],
                           "objective": sidecar.get("objective")})
        mlflow.log_metrics({"parity/max_abs_diff": sidecar["parity"]["max_abs_diff"]})
        for name in ("selector.onnx", "selector.json"):
            mlflow.log_artifact(str(folder / name), artifact_path="selector")
        mlflow.onnx.log_model(onnx.load(str(folder / "selector.onnx")), name="onnx_model", save_as_external_data=False,
                              signature=infer_signature(example, outputs), input_example=example)
        return logged_and_registered(cfg, run, train_run_id)


def run(cfg, args) -> int:
    return export_one(cfg, args, Path(args.selector or cfg.train.out), Path(cfg.export.out))


def export_one(cfg, args, src: Path, out: Path) -> int:
    """Export the trained selector in ``src`` to ``out`` (also the chain selector's, `pipeline.chain_selector`)."""
    from export.onnx_export import export_selector
    from selector.network import load_selector

    net, meta = load_selector(src)
    inputs, seconds = parity_rows(cfg, meta, cfg.export.parity_rows)
    sidecar = export_selector(net, meta, out, inputs, seconds, atol=cfg.export.atol)
    p = sidecar["parity"]
    print(f"export: {src} -> {out}/ (selector.onnx sha256 {sidecar['onnx_sha256'][:12]}..., "
          f"{len(sidecar['outputs']['table'])} outputs, feature set {sidecar['feature_set']}); parity on {p['rows']} "
          f"held-out rows: max |ΔÊ| {p['max_abs_diff']:.1e}, identical choices {p['identical_choices']}")
    if not args.no_mlflow and cfg.export.mlflow:
        where = log_to_mlflow(cfg, out, sidecar, inputs, meta.get("mlflow_run_id"))
        print(f"export: logged to MLflow {where}")
    print(json.dumps({"inputs": sidecar["inputs"], "outputs": sidecar["outputs"]["names"]}))
    return 0
