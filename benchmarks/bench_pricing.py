"""Pricing audit benchmark -> benchmarks/results/pricing.json: do the step prices hold online, relative to autoregressive?

What stage evaluate audits for every policy (`evaluation.audit`), without a trained selector: the pair of params.yaml
(the self-draft untrained when its artifact is not built: same shapes, same step cost), a profile measured now
(`branchpoint profile`'s tables and step ratios, or ``--latency FILE``), then TEST prompts decoded by autoregressive,
static trees, a naive chain, prompt lookup and the threshold chain in rotated order, every step priced by
`decoding.pricing` next to its measured seconds. The audit holds when every policy's measured / modelled, over
autoregressive's in the same run, is within 1 +- 0.03. Run it twice, at different times, to see a second machine
phase: ``python -m benchmarks.bench_pricing [--quick] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from types import SimpleNamespace

RESULTS = Path(__file__).parent / "results" / "pricing.json"
POLICIES = {  # name -> registry spec (policies/registry.py)
    "autoregressive": {"name": "autoregressive"},
    "static:traversal:2,0,1": {"name": "static", "action": "2,0,1", "method": "traversal"},
    "static:traversal:3,0,1": {"name": "static", "action": "3,0,1", "method": "traversal"},
    "static:specinfer:2,2,3": {"name": "static", "action": "2,2,3", "method": "specinfer"},
    "chain:naive:1,2,0": {"name": "static", "action": "1,2,0", "method": "naive"},
    "prompt_lookup": {"name": "prompt_lookup", "length": 4, "min_ngram": 1},
    "threshold_chain": {"name": "threshold_chain", "max_length": 4, "threshold": 0.6},
}


def units(cfg, tokenizer, n: int) -> list:
    """``n`` TEST prompts of the configured prompt sets (by-prompt split), at alternating temperatures 1.0 / 0.6."""
    from data_collection.prompts import encode_prompt, load_prompt_set, split_prompts
    from decoding.files import stable_hash64

    test = split_prompts(load_prompt_set(cfg.prompts.sets, cfg.prompts.max_prompts), cfg.prompts.split,
                         cfg.prompts.seed)["test"]
    rows = sorted(zip(test["prompt_id"], test["source"], test["text"], strict=True), key=lambda r: stable_hash64(r[0]))  # a seeded mix of sources
    return [SimpleNamespace(prompt_id=pid, source=src, temperature=(1.0, 0.6)[i % 2], top_p=1.0,
                            prompt_ids=encode_prompt(text, tokenizer, cfg.prompts.chat_template)[-384:])
            for i, (pid, src, text) in enumerate(rows[:n])]


def measure_profile(cfg, target, draft, vocab, tokenizer, quick: bool):
    """A latency profile measured now, as `branchpoint profile` measures it (smaller grid with ``quick``)."""
    import dataclasses

    from data_collection.forward_tables import Grid, TimedPair, profile_pair, tile_ids
    from data_collection.prompts import encode_prompt
    from data_collection.step_prices import PriceRounds, measure_step_ratios, time_deciding

    p = cfg.profile
    ids = tile_ids(encode_prompt(cfg.decode.prompt, tokenizer, cfg.decode.chat_template), max(p.contexts))
    grid = Grid(p.contexts, p.draft_rows, p.target_tokens, 2 if quick else p.repeats, 1 if quick else p.warmup)
    model = profile_pair(TimedPair(target, draft, vocab), ids, grid)
    model = dataclasses.replace(model, feature_seconds=time_deciding(TimedPair(target, draft, vocab), ids, model))
    plan = PriceRounds(p.lookup_lengths, p.price_tokens, 2 if quick else p.price_rounds)
    ratios, by_class = measure_step_ratios(TimedPair(target, draft, vocab), [tile_ids(ids, c) for c in p.price_contexts],
                                           model, list(cfg.actions.space()), plan, progress="step prices")
    return dataclasses.replace(model, step_ratios=ratios, meta={**model.meta, "step_ratios_by_class": by_class})


def main(argv: list[str] | None = None) -> int:
    import torch

    from decoding.files import write_json_atomic
    from decoding.latency import LatencyModel
    from evaluation.audit import audit_table, pricing_audit
    from evaluation.online import DecodePlan, Progress, decode_units
    from pipeline.config import load_config
    from pipeline.profile import load_profiled_pair
    from policies.registry import build_policy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 prompts x 24 tokens, a smaller profile")
    ap.add_argument("--latency", help="price with this profile instead of measuring one now")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    cfg = load_config("params.yaml" if os.path.exists("params.yaml") else None)
    torch.set_num_threads(cfg.model.threads)
    pair, draft_source = load_profiled_pair(cfg)
    target, draft, vocab, tokenizer = pair.target, pair.draft, pair.vocab_size, pair.tokenizer
    start = time.perf_counter()
    latency = LatencyModel.load(args.latency) if args.latency else measure_profile(cfg, target, draft, vocab, tokenizer,
                                                                                   args.quick)
    profile_seconds = time.perf_counter() - start
    policies = [build_policy(spec["name"], spec).named(name) for name, spec in POLICIES.items()]
    from engine.decoder import SpeculativeDecoder
    decoder = SpeculativeDecoder(target, draft, vocab)
    todo = units(cfg, tokenizer, 4 if args.quick else args.prompts)
    tokens = 24 if args.quick else args.tokens
    runs = decode_units(decoder, todo, policies, DecodePlan(tokens), Progress("pricing"), latency)
    audit = pricing_audit(runs)
    print(audit_table(audit))
    result = {"pair": {"target": cfg.model.target, "draft": draft_source}, "threads": torch.get_num_threads(),
              "prompts": len(todo), "max_new_tokens": tokens, "profile_seconds": profile_seconds,
              "decode_seconds": time.perf_counter() - start - profile_seconds,
              "step_ratios": latency.step_ratios.to_dict(),
              "step_ratios_by_class": latency.meta.get("step_ratios_by_class"), "pricing_audit": audit,
              "holds": all(e["holds"] for e in audit.values()),
              "worst_relative": max((e["relative_to_autoregressive"] for e in audit.values()),
                                    key=lambda v: abs(v - 1)),
              "date": latency.meta.get("date"), "quick": args.quick}
    write_json_atomic(args.out, result, sort_keys=False)
    print(f"pricing audit -> {args.out}: worst relative {result['worst_relative']:.3f}, holds {result['holds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
