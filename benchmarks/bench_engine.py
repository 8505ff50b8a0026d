"""Engine benchmark -> benchmarks/results/engine.json.

The pair is loaded as every stage loads it (`models.loading.load_pair`: on CPU every linear prepacked,
models/fast_path.py); "stock" is a deep copy with plain ``nn.Linear`` modules (the path before packing).
1. ``linear_candidates``: the kernels tried for one linear layer (benchmarks/engine_parts.py);
2. ``pass_ratio``: a target pass over n tree tokens / one plain decode step at context 256, n = 1..16,
   packed and stock (goal: <= 1.15 for n <= 4, <= 1.4 for n = 8);
3. ``step_split``: one decode step's parts (action 2,2,3, context 256), packed and stock;
4. ``draft_vs_target``: draft step / target step (the configured self-draft; untrained when its
   artifact is not built: same shapes, same cost), packed, packed with the shared layers through HF's
   modules instead of models/lean_layers.py (``packed_hf_layers``), and stock;
5. ``autoregressive_vs_hf``: our greedy autoregressive loop vs transformers ``generate`` on the same
   (packed) weights and on the stock weights (goal >= 1.3x);
6. block efficiency and tokens/s of every method with a static action vs autoregressive sampling on the
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

import torch

from benchmarks.engine_parts import linear_candidates, pass_ratios, step_split
from data_collection.forward_tables import TimedPair, step_times
from decoding.actions import Action, parse_action
from decoding.files import write_json_atomic
from decoding.sampling import Sampling
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from verifiers import METHODS

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
        pair = load_pair(cfg.model.target, cfg.model.draft, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                         cfg.model.placement())
        draft = pair.draft
    except Exception as e:  # the self-draft artifact is built by a later stage
        pair = load_pair(cfg.model.target, cfg.model.target, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                         cfg.model.placement())
        draft = noisy_draft(pair.target, noise)
        draft_note = (f"STAND-IN: copy of the target with noise {noise} x std on its last layer's MLP (as costly "
                      f"as the target, so tokens/s cannot beat autoregressive; block efficiency is meaningful). "
                      f"{cfg.model.draft} unavailable: {str(e).splitlines()[0][:160]}")
    return cfg, pair, draft.eval(), draft_note


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
    from models.fast_path import prepare_for_inference

    return prepare_for_inference(draft.eval())  # a deep copy is unpacked: pack it like a loaded model


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
def ar_vs_hf(pair, stock, prompt_ids: list[int], new_tokens: int, reps: int) -> dict:
    """Greedy tokens/s of our autoregressive loop (packed pair) and of HF generate on the same packed
    weights and on the ``stock`` copy (EOS disabled, same length); ratios = HF time / our time."""
    decoder = SpeculativeDecoder(pair.target, None, pair.vocab_size)
    ids = torch.tensor([prompt_ids], device=pair.device)

    def ours():
        return decoder.generate(prompt_ids, new_tokens, AUTOREGRESSIVE, sampling=Sampling(0.0)).tokens

    def hf(model):
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt_ids):].tolist()

    mine = ours()  # warm-up, and the greedy outputs must agree
    same = mine == hf(pair.target) and mine == hf(stock)
    times = {"ours": [], "hf_packed": [], "hf_stock": []}
    for _ in range(reps):  # interleaved: load from other processes hits all three alike
        for name, fn in (("ours", ours), ("hf_packed", lambda: hf(pair.target)), ("hf_stock", lambda: hf(stock))):
            times[name].append(_median_time(fn, 1))
    t = {k: statistics.median(v) for k, v in times.items()}
    res = {"new_tokens": new_tokens, "ours_tok_s": new_tokens / t["ours"],
           "hf_generate_packed_tok_s": new_tokens / t["hf_packed"], "hf_generate_stock_tok_s": new_tokens / t["hf_stock"],
           "ratio_vs_hf_same_weights": t["hf_packed"] / t["ours"], "ratio_vs_hf_stock": t["hf_stock"] / t["ours"],
           "greedy_tokens_identical": same}
    print(f"autoregressive: ours {res['ours_tok_s']:.1f} tok/s, HF generate {res['hf_generate_packed_tok_s']:.1f} "
          f"(same packed weights) / {res['hf_generate_stock_tok_s']:.1f} (stock) tok/s; ratios "
          f"{res['ratio_vs_hf_same_weights']:.2f}x / {res['ratio_vs_hf_stock']:.2f}x, identical {same}", flush=True)
    return res


def timing_drafts(cfg, pair, stock):
    """``(packed draft, stock draft, note)`` for the step timings: the loaded self-draft when its artifact
    exists, else an untrained one of the configured shape (same shapes, same kernels, same cost)."""
    from models.fast_path import prepare_for_inference
    from models.self_draft import SelfDraft, SelfDraftConfig

    if isinstance(pair.draft, SelfDraft):
        config, note = copy.deepcopy(pair.draft.config_draft), cfg.model.draft
    else:
        td = cfg.train_draft
        config = SelfDraftConfig(layers=td.layers, adapter_width=td.adapter_width,
                                 vocab_subset_size=td.vocab_subset_size)
        note = f"untrained self-draft, train_draft shape (layers {td.layers}, width {td.adapter_width})"
    packed = pair.draft if isinstance(pair.draft, SelfDraft) else prepare_for_inference(SelfDraft(pair.target, config).eval())
    return packed, SelfDraft(stock, copy.deepcopy(config)).eval(), note


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


def draft_vs_target(pair, stock, packed_draft, stock_draft, timing_note: str, context: list[int], reps: int) -> dict:
    """Draft step / target step: packed, packed with the self-draft's shared layers through HF's modules
    (models/lean_layers.py off), and stock."""
    hf_layers = {}
    packed = TimedPair(pair.target, packed_draft, pair.vocab_size)
    if hasattr(packed_draft, "lean"):
        packed_draft.lean = False
        hf_layers = {"packed_hf_layers": step_times(packed, context, reps)}
        packed_draft.lean = True
    out = {"draft": timing_note, "packed": step_times(packed, context, reps),
           **hf_layers, "stock": step_times(TimedPair(stock, stock_draft, pair.vocab_size), context, reps)}
    print("draft step / target step: " + ", ".join(
        f"{k} {v['step_time_ratio']:.3f}" for k, v in out.items() if k != "draft"), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens, prompts and repetitions")
    parser.add_argument("--stand-in-noise", type=float, default=0.5, help="noise of the stand-in draft")
    parser.add_argument("--tree-action", default="2,2,3")
    parser.add_argument("--chain-action", default="1,4,0")
    parser.add_argument("--methods", default=",".join(sorted(METHODS)))
    parser.add_argument("--skip", default="", help="comma list of parts to skip: linear,pass,split,draft,ar,methods")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = model.threads)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    reps = 3 if args.quick else 9
    cfg, pair, draft, draft_note = load_default_pair(args.stand_in_noise)
    torch.set_num_threads(args.threads or cfg.model.threads)
    stock = copy.deepcopy(pair.target)  # deep copies of PackedLinear are plain nn.Linear: the stock path
    tok = pair.tokenizer
    enc = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
           for p in PROMPTS]
    prompts = [list(e["input_ids"] if hasattr(e, "keys") else e) for e in enc]
    context = (prompts[0] * (256 // len(prompts[0]) + 1))[:256]
    result = {
        "machine": {"platform": platform.platform(), "device": str(pair.device), "threads": torch.get_num_threads(),
                    "load_average_at_start": os.getloadavg()[0], "torch": torch.__version__},
        "pair": {"target": pair.target_spec, "draft": draft_note, "dtype": str(pair.dtype)},
    }
    if RESULTS.exists():  # keep parts not re-run
        old = json.loads(RESULTS.read_text())
        result.update({k: v for k, v in old.items() if k not in result})
    if "linear" not in skip:
        result["linear_candidates"] = linear_candidates(stock, [1, 2, 4, 8, 16], reps * 2)
    if "pass" not in skip:
        result["pass_ratio"] = pass_ratios({"packed": pair.target, "stock": stock}, context, list(range(1, 17)),
                                           reps)
    packed_draft, stock_draft, timing_note = timing_drafts(cfg, pair, stock)
    if "split" not in skip:
        action = parse_action(args.tree_action)
        result["step_split"] = {"action": str(action), "context": len(context),
                                "packed": step_split(pair.target, packed_draft, pair.vocab_size, context, action, reps),
                                "stock": step_split(stock, stock_draft, pair.vocab_size, context, action, reps)}
        print("step split (ms): " + json.dumps(result["step_split"]), flush=True)
    if "draft" not in skip:
        result["draft_vs_target"] = draft_vs_target(pair, stock, packed_draft, stock_draft, timing_note, context,
                                                    reps * 2)
    del stock_draft
    if "ar" not in skip:
        result["autoregressive_vs_hf"] = ar_vs_hf(pair, stock, prompts[0], 16 if args.quick else 48, max(3, reps // 2))
    del stock
    if "methods" not in skip:
        methods = [m for m in args.methods.split(",") if m]
        result["methods"] = methods_table(pair, draft, prompts[:1] if args.quick else prompts,
                                          16 if args.quick else 48, [1.0, 0.6], parse_action(args.tree_action),
                                          parse_action(args.chain_action), methods)
    write_json_atomic(RESULTS, result)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
