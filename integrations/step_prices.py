"""Step prices measured inside transformers' ``generate()`` loop, for the chain selector that decides there.

The chain selector picks the draft length ``n`` with the best Ê / T, and T comes from a latency profile's step
ratios (`decoding.pricing`): whole steps of *our* engine, each over a plain step. transformers' assisted loop
(`integrations.transformers`) spends its own time per step: the candidate generator, the assistant's cache, the
acceptance and the cache crop are its code, not ours. This module measures that loop's prices on this machine and
writes them into a copy of the profile, so the selector decides with the costs of the loop it runs in:

1. ``measure``: each TRAIN prompt is decoded by `BranchpointDecoding` with a fixed length (``FixedLength``):
   0 (plain steps of the assisted loop), then each ``n`` of ``lengths``, each between two plain decodes (the
   sandwich of `data_collection.step_prices`: a machine phase that lasts seconds cancels). A step is timed
   from its ``get_candidates`` to the next one (`SelectorCandidateGenerator.trace`), the prefill step left
   out; a decode's step seconds are their mean, and its ratio divides them by the mean of its two plain decodes'.
2. ``fit``: a drafted chain's ratio is ``step + node * n`` (non-negative least squares over every sandwich);
3. ``with_prices``: the profile with ``step_ratios.tree = {tables: 0, step, forward: 0, node}``; its forward
   tables (and so the selector's latency features) stay as measured by ``branchpoint profile``.

    .venv/bin/python -m benchmarks.bench_transformers --prices-only  # -> artifacts/latency_transformers.json
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from decoding.actions import Action
from decoding.latency import TREE_TERMS, LatencyModel, StepRatios


class FixedLength:
    """A stand-in chain selector: the same draft length at every step (0: a plain step)."""

    def __init__(self, n: int) -> None:
        self.action = Action(1, int(n), 0)
        self.actions = [self.action]  # what `SelectorCandidateGenerator.num_drafting_tokens` reads

    def select(self, features) -> Action:
        return self.action


def step_seconds(trace: list[tuple[float, str, int]], end: float) -> np.ndarray:
    """``[steps - 1]`` seconds of each step of one decode but the first (the prompt's prefill), from
    `SelectorCandidateGenerator.trace` and the decode's end (``perf_counter``)."""
    starts = [t for t, _, _ in trace] + [end]
    return np.diff(starts)[1:]


def _decode_steps(model, assistant, prompt_ids: list[int], n: int, tokens: int, temperature: float,
                  seed: int) -> np.ndarray:
    """Step seconds of one ``generate()`` of ``tokens`` new tokens drafting ``n`` tokens at every step."""
    import torch

    from integrations.transformers import BranchpointDecoding

    decoding = BranchpointDecoding(FixedLength(n), assistant)
    ids = torch.tensor([prompt_ids], device=model.device)
    torch.manual_seed(seed)
    model.generate(ids, do_sample=temperature > 0, temperature=temperature or None, top_k=0, top_p=1.0,
                   max_new_tokens=tokens, min_new_tokens=tokens, custom_generate=decoding)
    end = time.perf_counter()
    return step_seconds(decoding.last_generator.trace, end)


def measure(model, assistant, prompts: list[list[int]], lengths=(1, 2, 3, 4), tokens: int = 48,
            temperature: float = 1.0, seed: int = 0, progress=print) -> dict:
    """``{"ratios": {n: [ratio of each sandwich]}, "plain_step_seconds": [...]}`` (see the module docstring)."""
    if not prompts or not lengths or min(lengths) < 1:
        raise ValueError("measure needs at least one prompt and draft lengths >= 1")
    ratios: dict[int, list[float]] = {int(n): [] for n in lengths}
    plains: list[float] = []
    for i, prompt in enumerate(prompts):
        before = _decode_steps(model, assistant, prompt, 0, tokens, temperature, seed + i).mean()
        plains.append(float(before))
        for n in lengths:
            drafted = _decode_steps(model, assistant, prompt, n, tokens, temperature, seed + i).mean()
            after = _decode_steps(model, assistant, prompt, 0, tokens, temperature, seed + i).mean()
            ratios[int(n)].append(float(drafted / ((before + after) / 2)))
            plains.append(float(after))
            before = after
        progress(f"step prices in generate(): prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"n={n} {r[-1]:.3f}" for n, r in ratios.items()) + " x a plain step")
    return {"ratios": {str(n): r for n, r in ratios.items()}, "plain_step_seconds": plains}


def fit(ratios: dict) -> dict:
    """``{"step", "node", "residual"}``: the non-negative line ``step + node * n`` through every measured ratio."""
    from scipy.optimize import nnls

    n = np.array([int(k) for k, rs in ratios.items() for _ in rs], dtype=np.float64)
    y = np.array([r for rs in ratios.values() for r in rs], dtype=np.float64)
    if n.size < 2 or len(set(n.tolist())) < 2:
        raise ValueError("fit needs ratios of at least two draft lengths")
    (step, node), _ = nnls(np.stack([np.ones_like(n), n], axis=1), y)
    residual = float(np.sqrt(np.mean((step + node * n - y) ** 2)))
    return {"step": float(step), "node": float(node), "residual": residual}


def with_prices(latency: LatencyModel, line: dict, measured: dict | None = None) -> LatencyModel:
    """``latency`` whose drafted steps cost ``step + node * n`` plain steps (the forward tables kept)."""
    tree = dict.fromkeys(TREE_TERMS, 0.0) | {"step": line["step"], "node": line["node"]}
    ratios = dataclasses.replace(latency.step_ratios, tree=tree)
    meta = {**latency.meta, "step_ratios_source": "transformers generate() (integrations.step_prices)",
            "step_ratios_transformers": {"fit": line, **(measured or {})}}
    return dataclasses.replace(latency, step_ratios=StepRatios.from_dict(ratios.to_dict()), meta=meta)
