"""Benchmark of the self-speculative draft (stage train_draft) -> benchmarks/results/draft.json.

Measures, on this machine, with the trained artifact loaded through `load_pair` (the decoder's path):
1. one draft decode step vs one target decode step (one new token on a KV cache) at several context
   lengths: ``step_time_ratio`` = median draft step / median target step, steps interleaved;
2. chain speculative decoding (action K=1, L1=0, L2=n, method ``naive`` = standard speculative sampling)
   vs autoregressive decoding with the engine (engine) on TEST prompts: block efficiency
   (tokens per target pass) and tokens per second.

Run: ``python -m benchmarks.bench_draft`` (after ``dvc repro train_draft``; TEST prompts from the trajectories); ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

OUT = Path("benchmarks/results/draft.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--contexts", default="64,256,512", help="context lengths of the step timing")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=4, help="TEST prompts decoded per setting")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--chain", default="2,4", help="draft chain lengths L2 to decode with")
    parser.add_argument("--temperatures", default="1.0,0.6")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: train_draft.threads)")
    parser.add_argument("--quick", action="store_true", help="tiny settings, for a smoke run")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.quick:
        args.contexts, args.reps, args.prompts, args.max_new_tokens, args.chain = "64", 5, 1, 8, "3"
        args.temperatures = "1.0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from data_collection.forward_tables import TimedPair, step_times, tile_ids
    from data_collection.trajectory_store import load_trajectories
    from models.loading import load_pair
    from pipeline.config import load_config

    cfg = load_config(args.params if Path(args.params).is_file() else None)
    torch.set_num_threads(args.threads or cfg.train_draft.threads)
    pair = load_pair(cfg.model.target, f"self_draft:{cfg.train_draft.out}", cfg.model.device, cfg.model.dtype,
                     cfg.model.cache_dir, cfg.model.placement())
    target, draft = pair.target, pair.draft
    test_prompts = list({t.prompt_id: t.prompt_ids for t in load_trajectories(cfg.trajectories.out, ["test"])}.values())
    result: dict = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
                    "loadavg_start": os.getloadavg()},
        "draft": {"spec": pair.draft_spec, **{k: v for k, v in vars(draft.config_draft).items()
                                               if k != "target_fingerprint"}},
        "step_time": [],
    }
    ids = test_prompts[0]
    for n in [int(c) for c in args.contexts.split(",")]:
        timed = TimedPair(target, draft, pair.vocab_size)
        result["step_time"].append(step_times(timed, tile_ids(ids, n), reps=args.reps))
        print(json.dumps(result["step_time"][-1]))
    result["step_time_ratio"] = max(r["step_time_ratio"] for r in result["step_time"])

    result["decoding"] = decode_rows(pair, test_prompts[: args.prompts], args)
    result["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def decode_rows(pair, prompts: list, args) -> list[dict]:
    """Chain speculative decoding (naive, K = 1, L2 = each of ``--chain``) vs autoregressive on ``prompts``, per
    temperature: block efficiency and tokens/s, with the speedup over autoregressive at that temperature."""
    from decoding.actions import Action
    from decoding.sampling import Sampling
    from engine.decoder import SpeculativeDecoder
    from models.loading import eos_ids

    eos = eos_ids(pair.tokenizer, pair.target)
    rows_all: list[dict] = []
    for temp in [float(t) for t in args.temperatures.split(",")]:
        sampling = Sampling(temperature=temp)
        settings = [("autoregressive", None)] + [("naive", Action(1, 0, int(n))) for n in args.chain.split(",")]
        rows = []
        for method, action in settings:
            tokens = passes = emitted = 0
            seconds = 0.0
            for i, prompt in enumerate(prompts):
                start = time.perf_counter()
                decoder = SpeculativeDecoder(pair.target, pair.draft, pair.vocab_size, eos)
                out = decoder.generate(prompt, args.max_new_tokens, method, action or Action(1, 0, 1), sampling, i)
                seconds += time.perf_counter() - start
                tokens += out.stats.new_tokens
                passes += out.stats.steps
                emitted += out.stats.emitted  # before truncation at EOS / max_new_tokens
            rows.append({"temperature": temp, "method": method, "action": None if action is None else str(action),
                         "prompts": len(prompts), "new_tokens": tokens, "target_passes": passes,
                         "block_efficiency": emitted / passes if passes else float("nan"),
                         "tokens_per_second": tokens / seconds, "seconds": seconds})
            print(json.dumps(rows[-1]))
        for r in rows[1:]:
            r["speedup_vs_autoregressive"] = r["tokens_per_second"] / rows[0]["tokens_per_second"]
        rows_all += rows
    return rows_all


if __name__ == "__main__":
    raise SystemExit(main())
