"""Parts of `benchmarks.bench_engine` that compare the stock and the prepacked (models/fast_path.py) paths.

- `linear_candidates`: one linear layer of the target (MLP up, LM head) at 1-16 rows with each kernel
  tried: stock ``F.linear`` (MKL; re-packs the weight per call for >= 2 rows), oneDNN prepacked
  (`models.fast_path.PackedLinear`, the one kept), MKL's own prepacked GEMM, and per-tensor dynamic int8
  (the old draft path: not batch-invariant);
- `pass_ratios`: a target pass over a tree of n tokens / one plain decode step, context 256, n = 1..16;
- `step_split`: where one decode step's time goes (draft root, draft tree, target mask, target forward,
  p rows, verification).
Every part interleaves its candidates per repetition and reports medians; compare ratios within one run.
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings

import numpy as np
import torch
from torch import nn

from decoding.actions import Action
from decoding.sampling import Sampling
from decoding.tree import build_tree
from engine.cache import KVState
from engine.drafting import DraftRoot, DraftRule, draft_tree
from engine.torch_sampling import prob_rows
from engine.tree_pass import (
    attention_mask,
    causal_allowed,
    forward_nodes,
    prefill,
    target_tree_pass,
    tree_allowed,
)
from models.fast_path import PackedLinear
from verifiers import get_method

DEFAULT_SAMPLING = Sampling(1.0)


def _medians(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each callable, the candidates interleaved within every repetition (1 warm-up)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for rep in range(reps + 1):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if rep:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _int8(linear: nn.Linear) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)


def _kernels(w: torch.Tensor, b, packed: PackedLinear, int8: nn.Module, n: int) -> dict:
    """The candidate kernels for ``x @ w.T + b`` with ``n`` rows."""
    x = torch.randn(1, n, w.shape[1])
    mkl_w = torch.ops.mkl._mkl_reorder_linear_weight(w, n)
    return {"stock": lambda: nn.functional.linear(x, w, b), "onednn_packed": lambda: packed(x),
            "mkl_packed": lambda: torch.ops.mkl._mkl_linear(x, mkl_w, w, b, n), "int8_dynamic": lambda: int8(x)}


@torch.inference_mode()
def linear_candidates(target: nn.Module, rows: list[int], reps: int) -> list[dict]:
    """Milliseconds per call of each candidate kernel for the MLP up projection and the LM head."""
    out = []
    layers = {"mlp.up_proj": target.model.layers[0].mlp.up_proj, "lm_head": target.lm_head}
    for name, layer in layers.items():
        w = layer.weight.detach()
        b = None if layer.bias is None else layer.bias.detach()
        plain = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
        plain.weight = nn.Parameter(w.clone(), requires_grad=False)
        packed = PackedLinear(plain)
        int8 = _int8(copy.deepcopy(plain))
        for n in rows:
            med = _medians(_kernels(w, b, packed, int8, n), reps)
            out.append({"layer": name, "rows": n, **{f"{k}_ms": 1e3 * v for k, v in med.items()}})
            print(f"linear {name} rows={n}: " + ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in med.items()), flush=True)
    return out


def _chain_tree(n: int):
    """A chain of n tokens (root included): the profile's tree; dense attention makes the shape irrelevant."""
    tokens = np.arange(10, 10 + n, dtype=np.int64)
    tokens[0] = -1
    return build_tree(Action(1, n - 1, 0), tokens, np.zeros((n, 1)))


@torch.inference_mode()
def pass_ratios(models: dict[str, nn.Module], context: list[int], sizes: list[int], reps: int) -> list[dict]:
    """Per model: median target pass over n tree tokens (mask + forward) / one plain decode step."""
    states = {}
    for name, model in models.items():
        kv = KVState(model)
        prefill(kv, context)
        states[name] = kv
    ctx = len(context)

    def step(kv):
        forward_nodes(kv, [7], [ctx], causal_allowed(ctx, 1))
        kv.crop(ctx)

    def tree_pass(kv, tree):
        target_tree_pass(kv, 7, tree)
        kv.crop(ctx)

    fns = {f"{name}|step": (lambda kv=kv: step(kv)) for name, kv in states.items()}
    for n in sizes:
        tree = _chain_tree(n)
        fns.update({f"{name}|{n}": (lambda kv=kv, tree=tree: tree_pass(kv, tree)) for name, kv in states.items()})
    med = _medians(fns, reps)
    out = []
    for n in sizes:
        row = {"n": n, "context": ctx}
        for name in models:
            row[f"{name}_step_ms"] = 1e3 * med[f"{name}|step"]
            row[f"{name}_pass_ms"] = 1e3 * med[f"{name}|{n}"]
            row[f"{name}_ratio"] = med[f"{name}|{n}"] / med[f"{name}|step"]
        out.append(row)
        print(f"pass n={n}: " + ", ".join(f"{k} {row[f'{k}_ratio']:.2f}x ({row[f'{k}_pass_ms']:.1f} ms)"
                                          for k in models), flush=True)
    return out


@torch.inference_mode()
def step_split(target: nn.Module, draft: nn.Module, vocab: int, context: list[int], action: Action,
               reps: int, sampling: Sampling = DEFAULT_SAMPLING) -> dict[str, float]:
    """Median milliseconds of each part of one decode step at ``len(context)`` (root = context[-1])."""
    kv_t, kv_d = KVState(target), KVState(draft)
    prefill(kv_t, context[:-1])
    prefill(kv_d, context[:-1])
    ctx = len(context) - 1
    rng = np.random.default_rng(0)
    verifier = get_method("traversal")
    state: dict = {}

    def root():
        logits, _ = forward_nodes(kv_d, [context[-1]], [ctx], causal_allowed(ctx, 1))
        state["q_root"] = prob_rows(logits[-1], sampling, vocab)

    def tree():
        state["tree"] = draft_tree(DraftRoot(kv_d, state["q_root"]), action, DraftRule(sampling, vocab), rng).tree
        kv_d.crop(ctx + 1)

    def mask():
        t = state["tree"]
        state["mask"] = attention_mask(kv_t, tree_allowed(ctx, t.parents), (ctx + t.depths).tolist())

    def target_forward():
        t = state["tree"]
        toks = t.tokens.copy()
        toks[0] = context[-1]
        ids = torch.as_tensor(toks, device=kv_t.device)
        state["logits"] = kv_t.forward(ids, (ctx + t.depths).tolist(), state["mask"]).logits[0]
        kv_t.crop(ctx)

    def p_rows():
        state["p"] = prob_rows(state["logits"], sampling, vocab)

    def verify():
        verifier.verify(state["tree"], state["p"], rng)
        kv_d.crop(ctx)

    parts = {"draft_root": root, "draft_tree": tree, "target_mask": mask, "target_forward": target_forward,
             "p_rows": p_rows, "verify": verify}
    times: dict[str, list[float]] = {k: [] for k in parts}
    for rep in range(reps + 1):  # the parts must run in order: each feeds the next
        for name, fn in parts.items():
            t0 = time.perf_counter()
            fn()
            if rep:
                times[name].append(time.perf_counter() - t0)
    out = {f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()}
    out["total_ms"] = sum(out.values())
    return out
