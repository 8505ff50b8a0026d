"""The selector's decision cost is load-proof: what deciding adds to a step, its features
(`data_collection.step_prices.deciding_work`, priced by the profile's ``feature_seconds``) plus the selector's forward
(`pipeline.training_data.inference_seconds`), each timed with `decoding.latency.quiet_seconds` (the quietest block's
median), measured on a quiet machine and next to another decode, and the share of TEST roots whose decision
(`decoding.pricing.decide`, argmax Ê / T) stays the same with either price. The means of the same timings (what priced
the forward before issue #43) are measured beside them for comparison. Writes benchmarks/results/decision_cost.json.

Needs the pipeline's outputs up to stage train (data/collect, artifacts/latency.json, artifacts/selector_torch).
The load is a second process decoding with the target (`branchpoint decode --method autoregressive`).

    .venv/bin/python -m benchmarks.bench_decision_cost [--params params.yaml]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "decision_cost.json"


def mean_seconds(fn, reps: int = 200) -> float:
    """The estimator issue #43 replaced: the mean of ``reps`` timed calls."""
    from decoding.latency import timed_calls

    return float(np.mean(timed_calls(fn, reps)))


def timings(net, features) -> dict:
    """Deciding's seconds (``features()`` then the network's forward) by both statistics, and the parts."""
    import torch

    from decoding.latency import quiet_seconds
    from pipeline.training_data import inference_seconds

    xs = [torch.zeros(1, getattr(net, f"{n}_mean").shape[0]) for n in net.input_names]
    with torch.inference_mode():
        mean_forward = mean_seconds(lambda: net(*xs))
    parts = {"robust_features": quiet_seconds(features), "robust_forward": inference_seconds(net),
             "mean_features": mean_seconds(features), "mean_forward": mean_forward}
    return {**parts, "robust_seconds": parts["robust_features"] + parts["robust_forward"],
            "mean_seconds": parts["mean_features"] + mean_forward}


def start_load(params: str) -> subprocess.Popen:
    """A second process group decoding with the target until it is killed: autoregressive decodes one after the
    other (one decode alone ends at the model's EOS, after a few seconds)."""
    decode = [sys.executable, "-m", "pipeline.cli", "decode", "--params", params, "--method", "autoregressive",
              "--max-new-tokens", "2000", "--no-chat-template", "--prompt", "Once upon a time"]
    cmd = ["bash", "-c", "while true; do " + " ".join(shlex.quote(c) for c in decode) + "; done"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    time.sleep(25)  # the model loads, the decode runs
    if proc.poll() is not None:
        raise SystemExit(f"bench_decision_cost: the load process exited ({proc.returncode}): {' '.join(cmd)}")
    return proc


def decisions(data, pred, seconds_of_deciding: float, quiet: float) -> np.ndarray:
    """The choice at every root with the selector's decision cost replaced by ``seconds_of_deciding``."""
    from decoding.pricing import decide

    return decide(pred, data.cost - quiet + seconds_of_deciding, data.valid_outputs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    import torch

    from data_collection.forward_tables import TimedPair, tile_ids
    from data_collection.prompts import encode_prompt
    from data_collection.step_prices import deciding_work
    from decoding.files import write_json_atomic
    from decoding.latency import LatencyModel
    from decoding.sampling import Sampling
    from pipeline.config import load_config
    from pipeline.profile import load_profiled_pair
    from pipeline.training_data import training_data
    from selector.network import load_selector
    from selector.training import predict

    cfg = load_config(args.params)
    missing = [p for p in (cfg.train.out, cfg.collect.out, cfg.profile.out) if not Path(p).exists()]
    if missing:
        print(f"bench_decision_cost: skipped, no {', '.join(missing)} (run dvc repro train first)")
        return 0
    net, _ = load_selector(cfg.train.out)
    td = training_data(cfg)
    latency = LatencyModel.load(cfg.profile.out)
    feature_set = td.data.schema.feature_set
    priced = latency.deciding_seconds(feature_set) + td.inference_seconds  # what train priced deciding at
    test = td.data.subset(td.data.rows("test"))
    pred = predict(net, test)
    torch.set_num_threads(cfg.model.threads)
    pair, _ = load_profiled_pair(cfg)
    ids = tile_ids(encode_prompt(cfg.decode.prompt, pair.tokenizer, cfg.decode.chat_template), 256)
    features = deciding_work(TimedPair(pair.target, pair.draft, pair.vocab_size), ids, latency,
                             Sampling(cfg.sampling.temperature, cfg.sampling.top_p))[feature_set]
    quiet = timings(net, features)
    proc = start_load(args.params)
    try:
        busy = timings(net, features)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the loop and the decode inside it
        proc.wait()
    base = decisions(test, pred, priced, priced)
    out = {"test_roots": len(test), "feature_set": feature_set, "priced_by_train_seconds": priced, "quiet": quiet,
           "busy": busy}
    for key in ("robust_seconds", "mean_seconds"):
        same = float(np.mean(decisions(test, pred, busy[key], priced) == base))
        out[f"unchanged_with_busy_{key}"] = same
        print(f"{key}: quiet {quiet[key] * 1e3:.3f} ms, busy {busy[key] * 1e3:.3f} ms; decisions unchanged on "
              f"{same:.1%} of {len(test)} TEST roots")
    write_json_atomic(Path(args.out), out)
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
