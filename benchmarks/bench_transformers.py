"""transformers' generate() with the branchpoint chain selector against transformers' own options, end to end.

Every policy decodes inside ``model.generate()`` on the same target and the same draft weights (the pair of the
params file: the target and the self-draft of ``--draft``, wrapped by `integrations.assistant`), the same TEST
prompts (one trajectory's prompt per TEST prompt, as stage evaluate picks them), at each temperature of
``--temperatures`` (top-p 1, top-k off), ``--max-new-tokens`` tokens (EOS suppressed: every run decodes them all):

- ``autoregressive``: plain sampling;
- ``assisted_default``: assisted generation with transformers' defaults (the self-draft as ``assistant_model``);
- ``assisted_tuned_threshold``: the same with ``assistant_confidence_threshold`` tuned on TRAIN prompts;
- ``prompt_lookup``: ``prompt_lookup_num_tokens`` tuned on TRAIN prompts;
- ``branchpoint``: `integrations.transformers.branchpoint_generate`: the chain selector picks each step's draft length;
- ``branchpoint_lookup``: the same behind prompt lookup's rule (a lookup chain of the tuned length where the
  context repeats), our headline's policy.

Units are (prompt, temperature); each unit is decoded by every policy in a rotated order (unit i starts with
policy i mod 6) under the same seed. Stored: ``policies[name].tokens_per_second`` (sum tokens / sum seconds, 95%
bootstrap interval over prompts) and ``selector_vs_best_builtin``: the better of the two branchpoint policies
over the best of the four built-in ones (by tokens/s), paired. Also each unit's runs, the tuning, the selector's
step mix (plain / drafted / lookup steps, mean draft length) and the machine's load average.

    .venv/bin/python -m benchmarks.bench_transformers [--selector artifacts/selector_chain] [--draft artifacts/draft]
        [--latency artifacts/latency.json] [--params params.yaml] [--prompts 12] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "transformers.json"
BUILTIN = ("autoregressive", "assisted_default", "assisted_tuned_threshold", "prompt_lookup")
OURS = ("branchpoint", "branchpoint_lookup")
GOAL = 1.05  # the goal: the better selector policy over the best built-in one


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", default="params.yaml", help="params file: the model pair, trajectories (prompts)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="params override, repeatable")
    p.add_argument("--selector", default="artifacts/selector_chain", help="chain selector folder")
    p.add_argument("--draft", default="artifacts/draft", help="self-draft folder (branchpoint train-draft)")
    p.add_argument("--latency", default="artifacts/latency.json", help="this machine's latency profile")
    p.add_argument("--prompts", type=int, default=12, help="TEST prompts")
    p.add_argument("--tune-prompts", type=int, default=2, help="TRAIN prompts of the tuning")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tune-max-new-tokens", type=int, default=48)
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.6])
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.1, 0.2, 0.4, 0.6, 0.8])
    p.add_argument("--lookup-lengths", type=int, nargs="+", default=[2, 3, 4, 6, 10])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--quick", action="store_true", help="4 TEST prompts, 1 TRAIN prompt, 3 thresholds, 3 lengths")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.quick:
        args.prompts, args.tune_prompts = min(args.prompts, 4), 1
        args.thresholds, args.lookup_lengths = [0.2, 0.4, 0.6], [3, 6, 10]
    if args.max_new_tokens < 1 or args.prompts < 1:
        p.error("--max-new-tokens and --prompts must be >= 1")
    return args


def prompts(cfg, split: str, n: int) -> list:
    """``n`` trajectories of ``split``, one per prompt, in stage evaluate's seeded order (their prompt ids)."""
    from pipeline.evaluate import pick_units

    return pick_units(cfg, split, n)[0]


def load(args):
    """``(cfg, pair, assistant, selector)``."""
    from integrations.assistant import SelfDraftAssistant
    from integrations.transformers import load_chain_selector
    from models.loading import load_pair
    from pipeline.config import load_config

    cfg = load_config(args.params, args.overrides)
    pair = load_pair(cfg.model.target, f"self_draft:{args.draft}", cfg.model.device, cfg.model.dtype,
                     cfg.model.cache_dir, cfg.model.placement())
    assistant = SelfDraftAssistant(pair.draft, pair.target)
    selector = load_chain_selector(args.selector, pair.target, args.latency, pair.tokenizer)
    return cfg, pair, assistant, selector


class Policies:
    """Each policy's ``generate()`` keyword arguments; the assistant's config is restored before every run
    (transformers' heuristic schedule writes its draft length back into it)."""

    def __init__(self, assistant, selector) -> None:
        self.assistant, self.selector = assistant, selector
        self.pristine = copy.deepcopy(assistant.generation_config)
        self.threshold: float | None = None
        self.lookup: int | None = None
        self.decodings: dict = {}

    def kwargs(self, name: str) -> dict:
        from integrations.transformers import BranchpointDecoding

        self.assistant.generation_config = copy.deepcopy(self.pristine)
        if name == "autoregressive":
            return {}
        if name == "assisted_default":
            return {"assistant_model": self.assistant}
        if name == "assisted_tuned_threshold":
            self.assistant.generation_config.assistant_confidence_threshold = self.threshold
            return {"assistant_model": self.assistant}
        if name == "prompt_lookup":
            return {"prompt_lookup_num_tokens": self.lookup}
        lookup = self.lookup if name == "branchpoint_lookup" else None
        self.decodings[name] = BranchpointDecoding(self.selector, self.assistant, lookup=lookup)
        return {"custom_generate": self.decodings[name]}


def decode(pair, policies: Policies, name: str, prompt_ids, temperature: float, tokens: int, seed: int) -> dict:
    """One timed ``generate()``: ``{tokens, seconds}`` (prefill included) and, for ours, its step mix."""
    import torch

    ids = torch.tensor([prompt_ids], device=pair.device)
    kwargs = policies.kwargs(name)
    torch.manual_seed(seed)
    start = time.perf_counter()
    out = pair.target.generate(ids, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                               max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
    seconds = time.perf_counter() - start
    row = {"tokens": int(out.shape[1] - ids.shape[1]), "seconds": seconds}
    if name in policies.decodings:
        gen = policies.decodings[name].last_generator
        row["steps"] = dict(gen.steps)  # per step class (`decoding.pricing.step_class`)
        row["drafted"] = gen.drafted
    return row


def tune(pair, policies: Policies, name: str, attr: str, values, units, temperatures, tokens: int, seed: int) -> dict:
    """Set ``policies.<attr>`` to the value of ``values`` with the highest tokens/s of ``name`` on ``units``."""
    scores = {}
    for v in values:
        setattr(policies, attr, v)
        rows = [decode(pair, policies, name, u.prompt_ids, t, tokens, seed) for u in units for t in temperatures]
        scores[str(v)] = sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)
    best = max(values, key=lambda v: scores[str(v)])
    setattr(policies, attr, best)
    print(f"tuned {name}: {attr} = {best} ({', '.join(f'{k}: {s:.1f}' for k, s in scores.items())} tokens/s)")
    return {"chosen": best, "tokens_per_second": scores}


def run_units(pair, policies: Policies, units, args) -> list[dict]:
    """Every (TEST prompt, temperature) unit decoded by every policy, the order rotated per unit."""
    names = [*BUILTIN, *OURS]
    rows = []
    for i, (u, t) in enumerate((u, t) for u in units for t in args.temperatures):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            r = decode(pair, policies, name, u.prompt_ids, t, args.max_new_tokens, args.seed + i)
            rows.append({"policy": name, "prompt_id": u.prompt_id, "temperature": t, "unit": i, **r})
        line = ", ".join(f"{r['policy']} {r['tokens'] / r['seconds']:.1f}" for r in rows[-len(names):])
        print(f"unit {i + 1} ({u.prompt_id}, T={t}): {line} tokens/s", flush=True)
    return rows


def summarize(rows: list[dict], args) -> dict:
    """``policies[name].tokens_per_second`` (and per temperature) and ``selector_vs_best_builtin``, with intervals."""
    from evaluation.paired_stats import Bootstrap, rate_ci, ratio_ci

    boot = Bootstrap(n_boot=args.bootstrap, seed=args.seed)

    def arrays(name, temperature=None):
        sel = sorted((r for r in rows if r["policy"] == name and temperature in (None, r["temperature"])),
                     key=lambda r: r["unit"])
        return (np.array([r["tokens"] for r in sel]), np.array([r["seconds"] for r in sel]),
                np.array([r["prompt_id"] for r in sel]))

    policies = {}
    for name in (*BUILTIN, *OURS):
        tok, sec, groups = arrays(name)
        policies[name] = {"tokens_per_second": rate_ci(tok, sec, groups, boot),
                          "by_temperature": {str(t): rate_ci(*arrays(name, t), boot)
                                             for t in args.temperatures}}
    rate = {k: v["tokens_per_second"]["value"] for k, v in policies.items()}
    best_builtin = max(BUILTIN, key=rate.get)
    best_ours = max(OURS, key=rate.get)
    ta, sa, groups = arrays(best_ours)
    tb, sb, _ = arrays(best_builtin)
    ratio = ratio_ci((ta, sa), (tb, sb), groups, boot)
    per_t = {}
    for t in args.temperatures:
        (ta_t, sa_t, g_t), (tb_t, sb_t, _) = arrays(best_ours, t), arrays(best_builtin, t)
        per_t[str(t)] = ratio_ci((ta_t, sa_t), (tb_t, sb_t), g_t, boot)
    return {"policies": policies,
            "selector_vs_best_builtin": {**ratio, "selector_policy": best_ours, "best_builtin": best_builtin,
                                         "by_temperature": per_t, "goal": GOAL, "met": ratio["value"] >= GOAL}}


def step_mix(rows: list[dict]) -> dict:
    """The branchpoint policies' steps: shares of plain / drafted / lookup steps (`decoding.pricing.step_kind` of
    their step classes) and the mean draft length."""
    from collections import Counter

    from decoding.pricing import kind_counts

    out = {}
    for name in OURS:
        steps = kind_counts(sum((Counter(r["steps"]) for r in rows if r["policy"] == name), Counter()))
        total = max(sum(steps.values()), 1)
        drafted = sum(r["drafted"] for r in rows if r["policy"] == name)
        out[name] = {**{f"{k}_share": v / total for k, v in steps.items()}, "steps": total,
                     "mean_draft_length": drafted / max(steps["draft"], 1)}
    return out


def main(argv=None) -> int:
    import torch
    import transformers

    from decoding.files import write_json_atomic

    args = parse_args(argv)
    missing = [p for p in (args.selector, args.draft, args.latency) if not Path(p).exists()]
    if missing:  # `make bench` on a checkout without a pipeline run
        print(f"bench_transformers: skipped, {missing} missing: run `dvc repro` (stages profile, train_draft, "
              "collect, chain_selector) first, or pass --selector/--draft/--latency")
        return 0
    kind = json.loads((Path(args.draft) / "config.json").read_text()).get("kind", "self_draft")
    if kind != "self_draft":  # transformers' assistant sees token ids only, not the target's hidden states
        print(f"bench_transformers: skipped, {args.draft} holds a {kind} draft, which reads the target's hidden "
              "states and cannot be transformers' assistant_model; pass --draft <a self-draft folder>")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, pair, assistant, selector = load(args)
    policies = Policies(assistant, selector)
    test, train = prompts(cfg, "test", args.prompts), prompts(cfg, "train", args.tune_prompts)
    load_before = os.getloadavg()
    start = time.perf_counter()
    tuning = {"assisted_tuned_threshold": tune(pair, policies, "assisted_tuned_threshold", "threshold", args.thresholds,
                                               train, args.temperatures, args.tune_max_new_tokens, args.seed),
              "prompt_lookup": tune(pair, policies, "prompt_lookup", "lookup", args.lookup_lengths, train,
                                    args.temperatures, args.tune_max_new_tokens, args.seed)}
    for name in (*BUILTIN, *OURS):  # untimed warm-up of each path
        decode(pair, policies, name, test[0].prompt_ids, args.temperatures[0], 8, args.seed)
    rows = run_units(pair, policies, test, args)
    result = {"command": "python -m benchmarks.bench_transformers " + " ".join(sys.argv[1:] if argv is None else argv),
              **summarize(rows, args), "selector_steps": step_mix(rows), "tuning": tuning,
              "setup": {"target": cfg.model.target, "draft": args.draft, "selector": args.selector,
                        "selector_sha256": selector.sidecar.get("onnx_sha256"), "latency": args.latency,
                        "test_prompts": len(test), "train_prompts": len(train), "temperatures": args.temperatures,
                        "max_new_tokens": args.max_new_tokens, "top_p": 1.0, "top_k": None,
                        "transformers": transformers.__version__, "torch": torch.__version__,
                        "threads": torch.get_num_threads(), "load_average_before": load_before,
                        "load_average_after": os.getloadavg(), "seconds": time.perf_counter() - start},
              "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    r = result["selector_vs_best_builtin"]
    print(f"{r['selector_policy']} / {r['best_builtin']}: {r['value']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] "
          f"(goal {GOAL}x) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
