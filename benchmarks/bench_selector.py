"""Selector overhead per decoding step: ONNX decision latency and feature-building time, as a share of one
target decode step. Writes benchmarks/results/selector.json.

- decision: `SelectorRuntime.run_graph` at batch 1 with the features already built (median; goal <= 100 us);
- features: `FeatureSchema.vectorize` of one root from [V] probability rows and hidden states, plus the
  step-seconds vector (what `SelectorRuntime.select` adds around the decision);
- share: both against the profiled target step (t_p(l, 1)) at the same context length (goal < 1%).
Uses artifacts/selector when it exists (the real export), else a randomly initialised selector of the
default pair's shapes exported to a temporary folder. Both feature sets are measured.

    .venv/bin/python -m benchmarks.bench_selector [--selector artifacts/selector] [--reps 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "selector.json"
V, H = 49152, 576  # the default pair: vocabulary and hidden size (target and self-draft)


def _median_us(fn, reps: int) -> float:
    for _ in range(min(50, reps)):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _random_export(feature_set: str, folder: Path, latency) -> Path:
    import torch

    from decoding import pricing
    from decoding.actions import ActionSpace
    from decoding.features import FeatureSchema
    from export.onnx_export import export_selector
    from selector.network import SelectorNet

    torch.manual_seed(0)
    schema = FeatureSchema.for_pair(feature_set, H, H)
    space = ActionSpace(range(1, 4), range(0, 4), range(0, 4))
    net = SelectorNet({h: H for h in schema.hidden}, len(schema.scalars), len(space)).eval()
    meta = {"feature_set": feature_set, "schema": schema.to_dict(),
            "outputs": {"methods": ["specinfer"], "actions": [str(a) for a in space], "valid": [True] * len(space)},
            "latency": latency.to_dict()}
    rng = np.random.default_rng(0)
    inputs = {k: rng.normal(size=(8, *s)).astype(np.float32) for k, s in schema.input_shapes().items()}
    inputs["scalars"][:, schema.scalars.index("context_length")] = 300
    seconds = np.repeat(pricing.step_seconds(latency, [300], space, features=feature_set), 8, axis=0).astype(np.float32)
    out = folder / feature_set
    export_selector(net, meta, out, inputs, seconds)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--selector", default="artifacts/selector")
    parser.add_argument("--latency", default="artifacts/latency.json")
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--context", type=int, default=300)
    args = parser.parse_args()

    from decoding.latency import LatencyModel
    from decoding.policy import RootFeatures
    from decoding.sampling import Sampling
    from export.runtime import SelectorRuntime

    latency_path = Path(args.latency)
    if not latency_path.is_file():
        raise SystemExit(f"{latency_path} not found: run `branchpoint profile` (or dvc repro profile) first")
    latency = LatencyModel.load(latency_path)
    target_step_us = float(latency.t_p(args.context, 1)) * 1e6
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.full(V, 0.05), size=3)
    root = RootFeatures(args.context, Sampling(1.0), rows[0], rows[1], rows[2], *rng.normal(size=(3, H)))
    results: dict = {"context_length": args.context, "target_step_us": target_step_us, "reps": args.reps,
                     "vocab": V, "hidden": H, "feature_sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        if Path(args.selector, "selector.json").is_file():
            rt = SelectorRuntime(args.selector, latency=latency)
            folders[rt.schema.feature_set] = (Path(args.selector), "artifacts")
        for fs in ("paper", "target_only"):
            folders.setdefault(fs, (_random_export(fs, Path(tmp), latency), "random weights"))
        for fs, (folder, source) in folders.items():
            rt = SelectorRuntime(folder, latency=latency)
            x = rt.schema.vectorize(root, latency)
            batch = {k: v[None] for k, v in x.items()}
            seconds = rt.step_seconds(args.context)[None]
            decide_us = _median_us(lambda rt=rt, batch=batch, seconds=seconds: rt.run_graph(batch, seconds), args.reps)
            build_us = _median_us(lambda rt=rt: (rt.schema.vectorize(root, latency), rt.step_seconds(args.context)),
                                  max(50, args.reps // 10))
            results["feature_sets"][fs] = {
                "selector": source, "outputs": len(rt.table),
                "decision_us_median": decide_us, "decision_goal_us": 100.0, "decision_goal_met": decide_us <= 100.0,
                "feature_build_us_median": build_us,
                "share_of_target_step": (decide_us + build_us) / target_step_us,
                "share_goal": 0.01, "share_goal_met": (decide_us + build_us) / target_step_us < 0.01,
            }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
