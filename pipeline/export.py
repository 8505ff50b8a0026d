"""``branchpoint export``: stage export, the trained selector as ONNX + sidecar (export/onnx_export.py).

Reads: the trained selector (``train.out``), held-out rows of the collected dataset (``collect.out``, TEST
split, else VAL) for the parity check. Writes: ``export.out`` (selector.onnx + selector.json), atomically;
logs the ONNX model to MLflow (float32 signature, input example) and registers it as
``export.registered_model`` with the sidecar. ``branchpoint decode --selector <export.out>`` decodes with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--selector", default=None, help="trained selector folder (default: train.out)")
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging and registration")


def parity_rows(cfg, meta: dict, rows: int):
    """(inputs, step_seconds) of up to ``rows`` held-out roots, built as training built them."""
    import numpy as np

    from data_collection.dataset import load_collected
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
    per = latency.step_seconds_matrix(cols["context_length"], actions, schema.feature_set)  # [N, A]
    seconds = np.tile(per, (1, len(methods))).astype(np.float32)
    return inputs, seconds


def log_to_mlflow(cfg, folder: Path, sidecar: dict, inputs: dict) -> str | None:
    """Log the ONNX model (signature + input example) and the sidecar; register the model."""
    import mlflow
    import numpy as np
    import onnx
    from mlflow.models import infer_signature

    from pipeline.tracking import start_run

    example = {k: np.asarray(v[:1], dtype=np.float32) for k, v in inputs.items()}
    example["step_seconds"] = np.ones((1, len(sidecar["outputs"]["table"])), dtype=np.float32)
    outputs = {"expected_block_efficiency": np.zeros((1, len(sidecar["outputs"]["table"])), dtype=np.float32),
               "choice": np.zeros(1, dtype=np.int64)}
    with start_run(cfg, "export") as run:
        mlflow.log_params({"feature_set": sidecar["feature_set"], "methods": ",".join(sidecar["outputs"]["methods"]),
                           "outputs": len(sidecar["outputs"]["table"]), "opset": sidecar["opset"]})
        mlflow.log_metrics({"parity/max_abs_diff": sidecar["parity"]["max_abs_diff"]})
        info = mlflow.onnx.log_model(onnx.load(str(folder / "selector.onnx")), name="selector",
                                     signature=infer_signature(example, outputs), input_example=example,
                                     registered_model_name=cfg.export.registered_model or None)
        mlflow.log_artifact(str(folder / "selector.json"), artifact_path="selector")
        return f"{run.info.run_id} ({info.model_uri})"


def run(cfg, args) -> int:
    from export.onnx_export import export_selector
    from models.selector_network import load_selector

    src = args.selector or cfg.train.out
    net, meta = load_selector(src)
    inputs, seconds = parity_rows(cfg, meta, cfg.export.parity_rows)
    sidecar = export_selector(net, meta, cfg.export.out, inputs, seconds, atol=cfg.export.atol)
    p = sidecar["parity"]
    print(f"export: {src} -> {cfg.export.out}/ (selector.onnx sha256 {sidecar['onnx_sha256'][:12]}..., "
          f"{len(sidecar['outputs']['table'])} outputs, feature set {sidecar['feature_set']}); parity on {p['rows']} "
          f"held-out rows: max |ΔÊ| {p['max_abs_diff']:.1e}, identical choices {p['identical_choices']}")
    if not args.no_mlflow and cfg.export.mlflow:
        where = log_to_mlflow(cfg, Path(cfg.export.out), sidecar, inputs)
        print(f"export: logged to MLflow run {where}; registered as {cfg.export.registered_model!r}")
    print(json.dumps({"inputs": sidecar["inputs"], "outputs": sidecar["outputs"]["names"]}))
    return 0
