"""The target's backends, paired -> benchmarks/results/target_backend.json.

One run, interleaved (each repetition times every backend in turn, so a phase of the machine hits all alike):

1. ``steps``: ms per decode step of our engine for each backend (``dense`` float32 prepacked weights; ``int4`` the
   GGUF file's own blocks through torch's 4-bit kernel, bfloat16 activations; ``int4_compiled`` the same with the
   decoder stack as one compiled graph, ``model.compile``) and each step class:
   plain (autoregressive), the static tree 2,0,1 and the action space's largest tree, with the configured
   self-draft on that same target (its shared layers compute on the same backend);
2. ``bytes``: weight bytes the linear layers read per plain step, and the implied GB/s;
3. ``llama_cpp``: llama.cpp's plain decoding of the same GGUF file, same prompts, same threads, sampled at T = 1,
   through `benchmarks.bench_llamacpp`'s worker in its benchmark-only environment (``make llamacpp``); skipped with
   one message where there is none. The project does not depend on it;
4. ``perplexity``: held-out perplexity (HumanEval prompts the selector never trains on are not needed: the
   text is scored teacher-forced) of each backend next to the dense float32 reference, and llama.cpp's on the same
   token ids (its arithmetic: activations rounded to 8 bits per block of 32 before each product).

``--baseline DIR`` (a checkout of an earlier commit, ``git worktree add /tmp/before <commit>``) times the step
classes only: every repetition runs them once in a fresh process on the current code and once on DIR's
(``PYTHONPATH=DIR``), alternating; the JSON (``results/target_backend_ab.json``) holds ``after`` / ``before``.
Both sides run in this checkout's folder, so they read one params.yaml and load the same draft artifact (a DIR
without ``artifacts/draft`` would otherwise time an untrained stand-in draft against the trained one).

Run: ``python -m benchmarks.bench_target_backend [--quick] [--skip-llamacpp] [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from decoding.actions import Action
from decoding.files import write_json_atomic
from decoding.sampling import Sampling
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder

RESULTS = Path(__file__).parent / "results" / "target_backend.json"
AB_RESULTS = RESULTS.with_name("target_backend_ab.json")
BACKENDS = ("dense", "int4", "int4_compiled")  # int4_compiled: model.compile (models/compiled_stack.py)


def load_backends(cfg, backends):
    """``{backend: (target, draft)}``; the draft is the configured self-draft on that target (untrained, same
    shapes and cost, when its artifact is not built)."""
    from models.fast_path import prepare_for_inference
    from models.loading import (
        Placement,
        load_draft,
        load_model,
        load_tokenizer,
        resolve_device,
        resolve_dtype,
    )
    from models.self_draft import SelfDraft, SelfDraftConfig

    device, dtype = resolve_device(cfg.model.device), resolve_dtype(cfg.model.dtype)
    tok = load_tokenizer(cfg.model.target, cfg.model.cache_dir)
    out = {}
    for backend in backends:
        placement = Placement(backend="int4", compile=True) if backend == "int4_compiled" else Placement(backend=backend)
        target = load_model(cfg.model.target, device, dtype, cfg.model.cache_dir, placement)
        try:
            draft = load_draft(cfg.model.draft, target, tok, cfg.model.target, dtype, cfg.model.cache_dir)
        except Exception as e:  # the artifact is built by stage train_draft
            td = cfg.train_draft
            print(f"{cfg.model.draft} unavailable ({str(e).splitlines()[0][:100]}): an untrained self-draft of its "
                  "shape stands in (same cost)", flush=True)
            draft = prepare_for_inference(SelfDraft(target, SelfDraftConfig(
                layers=td.layers, adapter_width=td.adapter_width, vocab_subset_size=td.vocab_subset_size)).eval())
        out[backend] = (target, draft.eval())
        warm_up(*out[backend], tok)
    return tok, out


def warm_up(target, draft, tok) -> None:
    """One short plain and one drafted decode, untimed: a compiled stack traces its graphs here, not in a timing."""
    decoder = SpeculativeDecoder(target, draft)
    ids = tok("def add(a, b):")["input_ids"]
    decoder.generate(ids, 3, AUTOREGRESSIVE, sampling=Sampling(1.0), seed=0)
    decoder.generate(ids, 3, "specinfer", Action(2, 0, 1), Sampling(1.0), seed=0)


def step_ms(decoder: SpeculativeDecoder, prompts, tokens: int, method: str, action: Action | None) -> float:
    """Median over prompts of ms per decode step, sampling at T = 1: the seconds after the prompt's prefill over the
    target passes after it, as llama.cpp's side counts (`llama_ms`: the tokens after the first)."""
    per = []
    for i, ids in enumerate(prompts):
        if action is None:
            res = decoder.generate(ids, tokens, AUTOREGRESSIVE, sampling=Sampling(1.0), seed=i)
        else:
            res = decoder.generate(ids, tokens, method, action, Sampling(1.0), seed=i)
        per.append(1e3 * res.stats.decode_seconds / res.stats.steps)
    return statistics.median(per)


def llama_ms(worker, prompts, tokens: int) -> float:
    """Median over prompts of llama.cpp's ms per decode step after the first token (`benchmarks.llamacpp_worker`)."""
    per = []
    for i, ids in enumerate(prompts):
        r = worker.decode(ids, tokens, "plain", i)
        per.append(1e3 * r["decode_seconds"] / (r["tokens"] - 1))
    return statistics.median(per)


@torch.inference_mode()
def perplexity(model: torch.nn.Module, texts: list[list[int]]) -> float:
    nll, count = 0.0, 0
    for ids in texts:
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(x).logits[0, :-1].double(), -1)
        nll -= logp.gather(1, x[0, 1:, None]).sum().item()
        count += len(ids) - 1
    return math.exp(nll / count)


def step_classes(cfg) -> dict:
    return {"plain": None, "2,0,1": Action(2, 0, 1), "largest": cfg.actions.space().max_action}


def decode_prompts(tok, n_prompts: int) -> list[list[int]]:
    """The last ``n_prompts`` HumanEval prompts, their last 200 tokens each."""
    from data_collection.prompts import load_prompt_set

    return [tok(t)["input_ids"][-200:] for t in load_prompt_set("humaneval")["text"][-n_prompts:]]


def class_ms(target, draft, prompts, tokens: int, method: str, classes: dict) -> dict[str, float]:
    """``{step class: ms per step}`` of one pass over ``prompts`` (`step_ms`)."""
    decoder = SpeculativeDecoder(target, draft)
    return {name: step_ms(decoder, prompts, tokens, method, action) for name, action in classes.items()}


def one_repetition(cfg, backends: list[str], tokens: int, n_prompts: int, method: str) -> dict:
    """``{backend: {class: ms per step}}`` of one repetition in this process (the ``--baseline`` child)."""
    tok, models = load_backends(cfg, backends)
    prompts = decode_prompts(tok, n_prompts)
    return {b: class_ms(target, draft, prompts, tokens, method, step_classes(cfg)) for b, (target, draft) in models.items()}


def compare_with_baseline(args, reps: int, tokens: int, n_prompts: int) -> dict:
    """Repetitions alternating the current code and ``args.baseline``'s, each in a fresh process; medians."""
    runs: dict[str, list[dict]] = {"after": [], "before": []}
    here = str(Path(__file__).resolve().parents[1])
    for rep in range(reps):
        for side, root in (("after", here), ("before", str(Path(args.baseline).resolve()))):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--backends", args.backends,
                   "--method", args.method, "--tokens", str(tokens), "--prompts", str(n_prompts)]
            out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=root), cwd=here, capture_output=True,
                                 text=True, check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"rep {rep} {side}: {runs[side][-1]}", flush=True)
    med = {side: {b: {c: statistics.median(r[b][c] for r in rs) for c in rs[0][b]} for b in rs[0]}
           for side, rs in runs.items()}
    result = {"baseline": args.baseline, "repetitions": reps, "tokens": tokens, "prompts": n_prompts,
              "method": args.method, "load_average_1min": round(os.getloadavg()[0], 2), "steps_ms": med,
              "runs": runs, "after_over_before": {b: {c: med["after"][b][c] / med["before"][b][c]
                                                      for c in med["after"][b]} for b in med["after"]}}
    write_json_atomic(AB_RESULTS, result)
    print(json.dumps(result["after_over_before"], indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens, prompts and repetitions")
    parser.add_argument("--skip-llamacpp", action="store_true", help="do not run llama.cpp")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {', '.join(BACKENDS)}")
    parser.add_argument("--method", default="specinfer", help="verification method of the drafted step classes")
    parser.add_argument("--baseline", default=None,
                        help="a checkout of earlier code: time the step classes on both, alternating (module doc)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from data_collection.prompts import load_prompt_set
    from models.loading import gguf_file
    from pipeline.config import load_config

    cfg = load_config("params.yaml" if os.path.exists("params.yaml") else None)
    threads = cfg.model.threads
    torch.set_num_threads(threads)
    reps, tokens, n_prompts = (2, 24, 2) if args.quick else (3, 48, 4)
    tokens, n_prompts = args.tokens or tokens, args.prompts or n_prompts
    if args.child:  # one repetition, printed as one line for the parent
        print(json.dumps(one_repetition(cfg, args.backends.split(","), tokens, n_prompts, args.method)))
        return
    if args.baseline:
        compare_with_baseline(args, reps, tokens, n_prompts)
        return
    tok, models = load_backends(cfg, args.backends.split(","))
    texts = load_prompt_set("humaneval")["text"]
    prompts = decode_prompts(tok, n_prompts)
    classes = step_classes(cfg)
    gguf = gguf_file(cfg.model.target)
    llama = None
    if not args.skip_llamacpp and gguf is not None:
        from benchmarks.bench_llamacpp import LlamaWorker, llama_python

        python = llama_python()
        try:
            llama = LlamaWorker(python, gguf, threads) if python else None
        except RuntimeError as e:
            print(f"llama.cpp skipped: {e}", flush=True)
        if python is None:
            print("llama.cpp skipped: no environment (make llamacpp)", flush=True)
    times: dict[str, dict[str, list[float]]] = {b: {c: [] for c in classes} for b in models}
    llama_runs: list[float] = []
    for rep in range(reps):  # interleaved
        for backend, (target, draft) in models.items():
            for name, ms in class_ms(target, draft, prompts, tokens, args.method, classes).items():
                times[backend][name].append(ms)
            print(f"rep {rep} {backend}: " + ", ".join(f"{c} {v[-1]:.1f} ms" for c, v in times[backend].items()),
                  flush=True)
        if llama is not None:
            llama_runs.append(llama_ms(llama, prompts, tokens))
            print(f"rep {rep} llama.cpp: plain {llama_runs[-1]:.1f} ms", flush=True)
    steps = {b: {c: statistics.median(v) for c, v in cls.items()} for b, cls in times.items()}
    from models.quantized import linear_bytes

    nbytes = {b: linear_bytes(t) for b, (t, _) in models.items()}
    result = {
        "machine": {"threads": threads, "torch": torch.__version__, "cpu_count": os.cpu_count()},
        "prompts": n_prompts, "tokens": tokens, "repetitions": reps, "method": args.method,
        "classes": {c: (str(a) if a else "plain") for c, a in classes.items()},
        "steps_ms": steps,
        "autoregressive_tokens_per_second": {b: 1e3 / s["plain"] for b, s in steps.items()},
        "bytes_per_plain_step": nbytes,
        "implied_gb_per_second": {b: nbytes[b] / (steps[b]["plain"] * 1e-3) / 1e9 for b in steps},
        "llama_cpp": ({"plain_ms": statistics.median(llama_runs),
                       "tokens_per_second": 1e3 / statistics.median(llama_runs), "version": llama.version}
                      if llama_runs else {"skipped": True}),
    }
    if "dense" in steps:
        result["speedup_vs_dense"] = {b: steps["dense"]["plain"] / s["plain"] for b, s in steps.items()}
    if llama_runs:
        result["ours_vs_llama_cpp"] = {b: statistics.median(llama_runs) / s["plain"] for b, s in steps.items()}
    held_out = [tok(t)["input_ids"][:256] for t in texts[:24 if not args.quick else 6]]
    result["perplexity"] = {b: perplexity(t, held_out) for b, (t, _) in models.items()}
    if llama is not None:  # llama.cpp's own arithmetic (8-bit activations per block of 32) on the same texts
        result["perplexity"]["llama_cpp"] = llama.perplexity(held_out)
        llama.close()
    result["perplexity_texts"] = f"HumanEval prompts 0..{len(held_out) - 1}, first 256 tokens each, teacher-forced"
    write_json_atomic(RESULTS, result)
    print(json.dumps({k: result[k] for k in ("steps_ms", "autoregressive_tokens_per_second", "llama_cpp",
                                            "perplexity")}, indent=1))


if __name__ == "__main__":
    main()
