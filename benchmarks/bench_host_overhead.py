"""A decoding step's host overhead, device-independently -> benchmarks/results/host_overhead.json.

On a tiny random-weight Llama pair (2 layers, hidden 64, SmolLM2's 49,152-token vocabulary so every per-row cost is
the real one; the draft a noisy copy of the target) a forward costs little, so a decoded step's time is mostly the
engine's own work: masks, index tensors, probability rows, draws, verification, cache pruning. Per step class
(``STEP_CLASSES``: a plain step, drafted 2,0,1, a proposed one-hot chain 1,3,0 as prompt lookup verifies it, the
largest tree of the default grid 3,3,3) it times whole decodes (`SpeculativeDecoder.generate`, ms per step after
the prefill, split into draft / target pass / verify / choose / rest by `DecodeStats`) next to HF transformers'
``generate()`` per token (greedy, same model, same device: (t(N) - t(1)) / (N - 1)), interleaved per round;
medians over rounds. ``verify_ms``: one ``verify`` call per method and tree shape on rows of the pair
(`data_collection.verify_cost.measure_verify_seconds`, the profile's measurement).

``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/hostov-before <commit>``): every
round runs this file once against the current code and once against DIR's (``PYTHONPATH=DIR``), alternating, and
the JSON holds both (``after`` / ``before``).

    .venv/bin/python -m benchmarks.bench_host_overhead [--rounds 5] [--tokens 48] [--device cpu] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "host_overhead.json"
VOCAB = 49152
# step class -> (action "K,L1,L2" or "autoregressive", proposal length for a one-hot chain, else 0)
STEP_CLASSES = {"plain": ("autoregressive", 0), "drafted 2,0,1": ("2,0,1", 0), "lookup 1,3,0": ("1,3,0", 3),
                "tree 3,3,3": ("3,3,3", 0)}
VERIFY_SHAPES = ("2,0,1", "1,3,0", "2,1,2", "3,3,3")


def tiny_pair(device: str, vocab: int = VOCAB, seed: int = 0):
    """(target, draft): a 2-layer, hidden-64 random Llama with an untied head, and a noisy copy of it."""
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.fast_path import prepare_for_inference

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    target = LlamaForCausalLM(config)
    with torch.no_grad():
        target.lm_head.weight.mul_(3.0)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    return tuple(prepare_for_inference(m.to(device).eval()) for m in (target, draft))


def proposal_policy(length: int):
    """A policy that proposes the root's last ``length`` context tokens as a one-hot chain (a lookup step)."""
    from decoding.actions import Action
    from decoding.policy import Choice, Policy
    from decoding.tree import proposal_tree

    class Propose(Policy):
        needs_draft = False

        def select(self, features):
            tokens = [int(t) for t in features.context[-length:]]
            return Choice(Action(1, length, 0), proposal=proposal_tree(tokens, len(features.p_prev)))

    return Propose()


def ours_ms(decoder, prompt: list[int], step_class: str, tokens: int) -> dict:
    """One decode of ``tokens`` tokens: ms per step after the prefill, and its split."""
    from decoding.actions import parse_action

    name, proposal = STEP_CLASSES[step_class]
    if name == "autoregressive":
        kwargs = {"method": "autoregressive"}
    else:
        kwargs = {"policy": proposal_policy(proposal) if proposal else parse_action(name)}
    result = decoder.generate(prompt, tokens, seed=0, **kwargs)
    stats, timings = result.stats, [r.timing for r in result.steps]
    parts = {"draft": sum(t.draft_seconds - t.draft_prefill_seconds for t in timings),
             "target": sum(t.target_seconds for t in timings), "verify": stats.time_verify,
             "choose": stats.time_selector}
    total = sum(t.step_seconds for t in timings)  # the draft's prefill over the prompt left out
    parts["rest"] = total - sum(parts.values())
    return {"step_ms": 1e3 * total / len(timings), **{f"{k}_ms": 1e3 * v / len(timings) for k, v in parts.items()},
            "steps": len(timings)}


def hf_ms_per_token(model, prompt: list[int], tokens: int) -> float:
    """HF ``generate()`` per token, greedy: (t(N) - t(1)) / (N - 1) ms."""
    import torch

    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    times = {}
    for n in (1, tokens):
        if ids.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)
        if ids.device.type == "cuda":
            torch.cuda.synchronize()
        times[n] = time.perf_counter() - t0
    return 1e3 * (times[tokens] - times[1]) / (tokens - 1)


def one_round(device: str, tokens: int, repeats: int) -> dict:
    """Every step class ``repeats`` times, each next to one ``generate()``; per class the medians."""
    import numpy as np
    import torch

    from engine.decoder import SpeculativeDecoder
    torch.set_num_threads(1)
    target, draft = tiny_pair(device)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, 32)]
    for step_class in STEP_CLASSES:  # warm-up
        ours_ms(decoder, prompt, step_class, 4)
    hf_ms_per_token(target, prompt, 4)
    runs: dict[str, list[dict]] = {c: [] for c in STEP_CLASSES}
    hf: list[float] = []
    for _ in range(repeats):
        for step_class in STEP_CLASSES:
            runs[step_class].append(ours_ms(decoder, prompt, step_class, tokens))
            hf.append(hf_ms_per_token(target, prompt, tokens))
    out = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in runs.items()}
    return {"ours": out, "generate_ms_per_token": statistics.median(hf)}


def verify_ms(device: str) -> dict:
    """``{method: {shape: ms}}``: one ``verify`` call on rows of the tiny pair at T = 1."""
    import torch

    from data_collection.verify_cost import measure_verify_seconds
    from decoding.actions import parse_action
    from decoding.sampling import Sampling
    from engine.torch_sampling import prob_rows

    target, draft = tiny_pair(device)
    ids = torch.randint(3, VOCAB, (1, 64), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():
        q, p = (prob_rows(m(ids).logits[0], Sampling(), VOCAB) for m in (draft, target))
    seconds = measure_verify_seconds([parse_action(s) for s in VERIFY_SHAPES], q, p, repeats=5)
    return {m: {s: round(1e3 * v, 3) for s, v in by.items()} for m, by in seconds.items()}


def child(code_dir: str | None, args) -> dict:
    """One round in a fresh process on the current code (``code_dir`` None) or on ``code_dir``'s."""
    env = dict(os.environ)
    root = code_dir or str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--device", args.device,
           "--tokens", str(args.tokens), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(rounds: list[dict]) -> dict:
    """Medians over rounds, per step class and part, and generate()'s per token."""
    ours = {c: {k: round(statistics.median(r["ours"][c][k] for r in rounds), 3) for k in rounds[0]["ours"][c]}
            for c in rounds[0]["ours"]}
    gen = statistics.median(r["generate_ms_per_token"] for r in rounds)
    for row in ours.values():
        row["vs_generate_per_token"] = round(row["step_ms"] / gen, 3)
    return {"step_classes": ours, "generate_ms_per_token": round(gen, 3)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per decode")
    ap.add_argument("--repeats", type=int, default=3, help="decodes per step class in one round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a checkout of the code to compare with (before)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # one round, printed as one line for the parent
        return one_round(args.device, args.tokens, args.repeats)
    after, before = [], []
    for _ in range(args.rounds):
        after.append(child(None, args))
        if args.baseline:
            before.append(child(args.baseline, args))
    res = {"device": args.device, "model": "random Llama, 2 layers, hidden 64, vocab 49152 (untied head), "
           "draft a noisy copy", "tokens_per_decode": args.tokens, "rounds": args.rounds, "repeats": args.repeats,
           "threads": 1, "load_average_1min": round(os.getloadavg()[0], 2),
           "after": summarize(after), "verify_ms": verify_ms(args.device)}
    if before:
        res["before"] = summarize(before)
        res["baseline"] = args.baseline
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    print(json.dumps(main(), indent=None if "--child" in sys.argv else 2))
