"""Engine benchmark -> benchmarks/results/engine.json.

1. Tree pass overhead: one target pass over a tree of n tokens (ancestor mask, positions by depth) vs a
   plain causal forward of n tokens, both on the same cached context (target: ratio <= 1.3 at n = 40).
2. Our autoregressive loop vs transformers ``generate`` (greedy, same token count): tokens/s ratio
   (target >= 0.9).
3. Block efficiency and tokens/s of every method with a static action vs autoregressive sampling on the
   default pair, at T = 1.0 and T = 0.6.

The default draft is the trained self-draft (``model.draft`` of params.yaml); when its artifact does not
exist yet, a noisy copy of the target stands in (early-exit drafts without an adapter overlap p by < 1%
on SmolLM2), and the JSON says so. Run: ``python -m benchmarks.bench_engine [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from decoding.actions import Action, parse_action
from decoding.engine import AUTOREGRESSIVE, SpeculativeDecoder
from decoding.engine.cache import KVState
from decoding.engine.tree_pass import causal_allowed, forward_nodes, target_tree_pass
from decoding.sampling import Sampling
from decoding.tree import build_tree
from decoding.verifiers import METHODS

RESULTS = Path(__file__).parent / "results" / "engine.json"
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "Translate to French: The weather is nice today and we are going to the beach.",
]


def load_default_pair(noise: float):
    from models.loading import load_pair
    from pipeline.config import load_config

    cfg = load_config("params.yaml" if os.path.exists("params.yaml") else None)
    draft_note = cfg.model.draft
    try:
        pair = load_pair(cfg.model.target, cfg.model.draft, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir)
        draft = pair.draft
    except Exception as e:  # the self-draft artifact is built by a later stage
        pair = load_pair(cfg.model.target, cfg.model.target, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir)
        draft = noisy_draft(pair.target, noise)
        draft_note = (f"STAND-IN: copy of the target with noise {noise} x std on its last layer's MLP (as costly "
                      f"as the target, so tokens/s cannot beat autoregressive; block efficiency is meaningful). "
                      f"{cfg.model.draft} unavailable: {str(e).splitlines()[0][:160]}")
    return pair, draft.eval(), draft_note


def noisy_draft(target: torch.nn.Module, noise: float = 0.5, seed: int = 0) -> torch.nn.Module:
    """A copy of ``target`` whose last decoder layer's MLP weights carry Gaussian noise (``noise`` x each
    tensor's std): q close to p but not equal, so drafts are accepted often and rejected often. Early-
    exit drafts of SmolLM2 without an adapter overlap p by < 1%, too little to exercise acceptance.
    The stand-in draft of this benchmark and of the engine tests (tests/engine_helpers.py)."""
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.model.layers[-1].mlp.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
    return draft.eval()


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def tree_pass_overhead(model, context: list[int], sizes: list[int], reps: int) -> list[dict]:
    """Median seconds of a tree pass of n tokens vs a plain forward of n tokens on the same context."""
    kv = KVState(model)
    forward_nodes(kv, context, list(range(len(context))), causal_allowed(0, len(context)))
    ctx = len(kv)
    cache_kw = {kv._kwarg: kv.cache}
    out = []
    rng = np.random.default_rng(0)
    for n in sizes:
        # a delayed tree with n - 1 draft nodes: K = 4 rollouts after a trunk of the rest
        l2 = max(1, (n - 1) // 8)
        action = Action(4, n - 1 - 4 * l2, l2)
        tokens = rng.integers(10, 1000, size=n)
        tokens[0] = -1
        tree = build_tree(action, tokens, np.zeros((n, 1)))
        ids = torch.as_tensor(rng.integers(10, 1000, size=(1, n)), device=kv.device)
        pos = torch.arange(ctx, ctx + n, device=kv.device)[None]

        def plain(ids=ids, pos=pos):
            model(input_ids=ids, position_ids=pos, use_cache=True, **cache_kw)
            kv.crop(ctx)

        def tree_pass(tree=tree):
            target_tree_pass(kv, 7, tree)
            kv.crop(ctx)

        plain(), tree_pass()  # warm-up
        t_plain, t_tree = _median_time(plain, reps), _median_time(tree_pass, reps)
        out.append({"n": n, "action": str(action), "context": ctx, "plain_ms": 1e3 * t_plain,
                    "tree_ms": 1e3 * t_tree, "overhead_ratio": t_tree / t_plain})
        print(f"tree pass n={n}: plain {1e3 * t_plain:.1f} ms, tree {1e3 * t_tree:.1f} ms, "
              f"ratio {t_tree / t_plain:.3f}", flush=True)
    return out


@torch.inference_mode()
def ar_vs_hf(pair, prompt_ids: list[int], new_tokens: int, reps: int) -> dict:
    """Greedy tokens/s of our autoregressive loop and of HF generate (EOS disabled, same length)."""
    decoder = SpeculativeDecoder(pair.target, None, pair.vocab_size)
    ids = torch.tensor([prompt_ids], device=pair.device)

    def ours():
        return decoder.generate(prompt_ids, new_tokens, AUTOREGRESSIVE, sampling=Sampling(0.0)).tokens

    def hf():
        out = pair.target.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt_ids):].tolist()

    same = ours() == hf()  # warm-up, and the greedy outputs must agree
    t_ours, t_hf = _median_time(ours, reps), _median_time(hf, reps)
    res = {"new_tokens": new_tokens, "ours_tok_s": new_tokens / t_ours, "hf_generate_tok_s": new_tokens / t_hf,
           "ratio": t_hf / t_ours, "greedy_tokens_identical": same}
    print(f"autoregressive: ours {res['ours_tok_s']:.1f} tok/s, HF generate {res['hf_generate_tok_s']:.1f} tok/s, "
          f"ratio {res['ratio']:.3f}, identical {same}", flush=True)
    return res


def methods_table(pair, draft, prompts: list[list[int]], new_tokens: int, temperatures: list[float],
                  tree_action: Action, chain_action: Action, methods: list[str]) -> list[dict]:
    decoder = SpeculativeDecoder(pair.target, draft, pair.vocab_size)
    rows = []
    for temp in temperatures:
        sampling = Sampling(temp)
        for method in [AUTOREGRESSIVE] + methods:
            action = chain_action if method in ("naive", "bv") else tree_action
            emitted = steps = tokens = 0
            seconds = 0.0
            for i, ids in enumerate(prompts):
                res = decoder.generate(ids, new_tokens, method, action, sampling, seed=i)
                emitted += res.stats.emitted
                steps += res.stats.steps
                tokens += res.stats.new_tokens
                seconds += res.stats.time_total
            row = {"temperature": temp, "method": method, "action": "-" if method == AUTOREGRESSIVE else str(action),
                   "block_efficiency": emitted / steps, "tokens_per_second": tokens / seconds, "tokens": tokens}
            rows.append(row)
            print(f"T={temp} {method:>14} {row['action']:>6}: block efficiency {row['block_efficiency']:.2f}, "
                  f"{row['tokens_per_second']:.2f} tok/s", flush=True)
        base = next(r for r in rows if r["temperature"] == temp and r["method"] == AUTOREGRESSIVE)
        for r in rows:
            if r["temperature"] == temp:
                r["speedup_vs_ar"] = r["tokens_per_second"] / base["tokens_per_second"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens, prompts and repetitions")
    parser.add_argument("--stand-in-noise", type=float, default=0.5, help="noise of the stand-in draft")
    parser.add_argument("--tree-action", default="2,2,3")
    parser.add_argument("--chain-action", default="1,4,0")
    parser.add_argument("--methods", default=",".join(sorted(METHODS)))
    parser.add_argument("--skip", default="", help="comma list of parts to skip: tree,ar,methods")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    reps = 3 if args.quick else 7
    pair, draft, draft_note = load_default_pair(args.stand_in_noise)
    tok = pair.tokenizer
    enc = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
           for p in PROMPTS]
    prompts = [list(e["input_ids"] if hasattr(e, "keys") else e) for e in enc]
    result = {
        "machine": {"platform": platform.platform(), "device": str(pair.device), "threads": torch.get_num_threads(),
                    "load_average_at_start": os.getloadavg()[0],
                    "torch": torch.__version__},
        "pair": {"target": pair.target_spec, "draft": draft_note, "dtype": str(pair.dtype)},
    }
    if RESULTS.exists():  # keep parts not re-run
        old = json.loads(RESULTS.read_text())
        result.update({k: v for k, v in old.items()
                       if k in ("tree_pass", "autoregressive_vs_hf", "methods") or k.startswith("methods_")})
    if "tree" not in skip:
        result["tree_pass"] = tree_pass_overhead(pair.target, prompts[0] * 2, [8, 20, 40], reps)
    if "ar" not in skip:
        result["autoregressive_vs_hf"] = ar_vs_hf(pair, prompts[0], 16 if args.quick else 48, max(2, reps // 2))
    if "methods" not in skip:
        methods = [m for m in args.methods.split(",") if m]
        result["methods"] = methods_table(pair, draft, prompts[:1] if args.quick else prompts,
                                          16 if args.quick else 48, [1.0, 0.6], parse_action(args.tree_action),
                                          parse_action(args.chain_action), methods)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
