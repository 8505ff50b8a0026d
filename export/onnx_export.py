"""Trained selector -> ONNX graph with the decision inside, a generated sidecar, and a parity check.

The graph (`DecisionGraph`): the selector network (feature standardisation inside, `selector.network`) and
the decision of ALGORITHMS.md section 6 over its outputs:

    inputs   <features of the schema> (float32 [batch, ...]), step_seconds [batch, outputs]
    outputs  expected_block_efficiency [batch, outputs] (``score`` for the ``throughput`` objective, whose
             outputs are decision scores), choice [batch] = argmax over valid outputs of Ê / T

so a runtime in any language needs nothing of ours beyond building the features (the sidecar says how)
and pricing the actions (the sidecar holds the latency profile; a fresh one can be passed instead).

The sidecar ``selector.json`` is generated from the modules that define the concepts (never typed twice):
the feature schema (`decoding.features.FeatureSchema.to_dict`), the output table (methods x actions,
`decoding.actions`), the latency profile (`decoding.latency.LatencyModel.to_dict`), plus the pair and
tokenizer fingerprint, the sampling range seen in training, training metrics, versions and the ONNX
file's sha256. The key facts also go into the ONNX ``metadata_props``.

Export writes into a temporary folder next to the destination, checks parity (torch vs onnxruntime on
held-out rows: max |ΔÊ| <= ``atol`` and identical choices) and only then renames it into place; a failed
check raises `ExportParityError` and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from decoding.files import sha256_file
from export.runtime import ONNX_FILE, SIDECAR_FILE, STEP_SECONDS, onnx_output_names

OPSET = 17


class ExportParityError(RuntimeError):
    """The ONNX graph does not reproduce the torch selector on held-out rows."""


class DecisionGraph(nn.Module):
    """Selector network + the decision ``argmax_valid Ê / T`` (see module docstring)."""

    def __init__(self, net: nn.Module, valid: list[bool]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("invalid", ~torch.tensor(valid, dtype=torch.bool))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.net(*inputs[:-1])  # [B, O]
        score = torch.where(self.invalid, torch.full_like(e, -3.0e38), e / inputs[-1])
        return e, torch.argmax(score, dim=-1)


def output_table(outputs: Mapping) -> list[list[str]]:
    """``[(method, "K,L1,L2")]`` per output, in output order (method-major, `selector.network.OutputLayout`)."""
    return [[m, a] for m in outputs["methods"] for a in outputs["actions"]]


def build_sidecar(meta: Mapping, onnx_sha256: str, parity: dict, versions: dict) -> dict:
    outputs = meta["outputs"]
    names = onnx_output_names(meta.get("objective"))
    return {
        "format": "branchpoint-selector-onnx", "format_version": 1,
        "kind": meta.get("kind", "tree"),  # chain: outputs (1, n, 0), one chain verified (pipeline/chain_selector.py)
        "onnx_file": ONNX_FILE, "onnx_sha256": onnx_sha256, "opset": OPSET,
        "features": meta["schema"],
        "inputs": [*(i["name"] for i in meta["schema"]["inputs"]), STEP_SECONDS],
        "outputs": {"methods": list(outputs["methods"]), "actions": list(outputs["actions"]),
                    "auto": bool(outputs.get("auto", False)), "valid": list(outputs["valid"]),
                    "table": output_table(outputs), "names": list(names),
                    "tied": meta.get("architecture", {}).get("tied"), "fixed": meta.get("architecture", {}).get("fixed")},
        "decision": f"choice = argmax over valid outputs of {names[0]} / step_seconds; "
                    "step_seconds[o] = decoding.pricing.step_seconds(latency_profile, context_length, actions, methods, "
                    "feature_set, inference_seconds) of output o's (method, action) (decoding/pricing.py)",
        "latency_profile": meta.get("latency"),
        "inference_seconds": float(meta.get("inference_seconds") or 0.0),  # charged to every decided step
        "objective": meta.get("objective"), "feature_set": meta["feature_set"],
        "pair": meta.get("pair"), "dataset": meta.get("dataset"), "sampling_range": meta.get("sampling_range"),
        "training_metrics": meta.get("metrics"), "parity": parity, "versions": versions,
    }


def _versions() -> dict:
    import onnx
    import onnxruntime

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__}


def export_selector(net: nn.Module, meta: Mapping, out_dir: str | Path, parity_inputs: Mapping[str, np.ndarray],
                    parity_seconds: np.ndarray, atol: float = 1e-4) -> dict:
    """Export ``net`` (with ``meta`` from `selector.network.load_selector`) to ``out_dir``; returns the sidecar.

    ``parity_inputs`` (schema order, float32, batch first) and ``parity_seconds`` ``[N, outputs]``: held-out
    rows the ONNX graph must reproduce."""
    import onnx
    import onnxruntime as ort

    out_dir = Path(out_dir)
    names = [i["name"] for i in meta["schema"]["inputs"]]
    if set(names) != set(parity_inputs):
        raise ValueError(f"parity inputs {sorted(parity_inputs)} do not match the schema's {names}")
    if tuple(names) != tuple(net.input_names):  # the graph's inputs are named in schema order, fed positionally
        raise ValueError(f"the net takes inputs {net.input_names}, the schema orders them {names}")
    graph = DecisionGraph(net, list(meta["outputs"]["valid"])).eval()
    names_out = list(onnx_output_names(meta.get("objective")))
    args = tuple(torch.from_numpy(np.asarray(parity_inputs[n], dtype=np.float32)) for n in names)
    args += (torch.from_numpy(np.asarray(parity_seconds, dtype=np.float32)),)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        onnx_path = tmp / ONNX_FILE
        all_names = [*names, STEP_SECONDS]
        torch.onnx.export(graph, args, str(onnx_path), dynamo=False, opset_version=OPSET, input_names=all_names,
                          output_names=names_out,
                          dynamic_axes={n: {0: "batch"} for n in [*all_names, *names_out]})
        graph.eval()  # the exporter restores the training flag of the wrapper; keep eval for parity
        model = onnx.load(str(onnx_path))
        onnx.helper.set_model_props(model, {
            "branchpoint.feature_set": str(meta["feature_set"]),
            "branchpoint.methods": ",".join(meta["outputs"]["methods"]),
            "branchpoint.actions": ";".join(meta["outputs"]["actions"]),
            "branchpoint.inputs": ",".join(all_names),
            "branchpoint.pair": json.dumps(meta.get("pair"), sort_keys=True),
            "branchpoint.sidecar": SIDECAR_FILE,
        })
        onnx.checker.check_model(model)
        onnx.save(model, str(onnx_path))
        with torch.no_grad():
            e_t, c_t = graph(*args)
        sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        e_o, c_o = sess.run(names_out, {n: a.numpy() for n, a in zip(all_names, args, strict=True)})
        diff = float(np.max(np.abs(e_o - e_t.numpy()))) if e_o.size else 0.0
        same = bool(np.array_equal(c_o, c_t.numpy()))
        parity = {"rows": int(args[0].shape[0]), "max_abs_diff": diff, "identical_choices": same, "atol": atol}
        if diff > atol or not same:
            raise ExportParityError(f"ONNX parity check failed on {parity['rows']} held-out rows: max |ΔÊ| = "
                                    f"{diff:.2e} (allowed {atol:.0e}), identical choices: {same}; nothing written")
        sidecar = build_sidecar(meta, sha256_file(onnx_path), parity, _versions())
        (tmp / SIDECAR_FILE).write_text(json.dumps(sidecar, indent=2, default=str) + "\n")
        old = out_dir.parent / f".{out_dir.name}.old{os.getpid()}"
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
        return sidecar
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
