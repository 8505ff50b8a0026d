"""The step overhead of the latency model: what a whole decoding step of our engine costs beyond the forwards
the profile times (verification, sampling, pruning both caches, bookkeeping). `branchpoint profile` measures it
after the tables and stores it as `decoding.latency.LatencyModel.step_overhead`."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from decoding.actions import Action, parse_action
from decoding.engine.generate import SpeculativeDecoder
from decoding.latency import LatencyModel
from decoding.sampling import Sampling

DEFAULT_SAMPLING = Sampling()
OVERHEAD_ACTIONS = (Action(1, 0, 0), Action(1, 0, 1), Action(3, 0, 1), Action(1, 1, 1), Action(2, 1, 2))


def measure_step_overhead(target: torch.nn.Module, draft: torch.nn.Module, vocab_size: int, prompt_ids: Sequence[int],
                          model: LatencyModel, actions: Sequence[Action] = OVERHEAD_ACTIONS, new_tokens: int = 24,
                          seeds: Sequence[int] = (0, 1), sampling: Sampling = DEFAULT_SAMPLING
                          ) -> tuple[dict, dict]:
    """What a whole engine step costs beyond its forwards: decode ``new_tokens`` after ``prompt_ids`` with each
    static action that the profiled grid prices (traversal; AR for the tree-less one), time every step but the first (it holds the prefill)
    and subtract ``model.step_seconds`` at the step's context. Returns ``(overhead, by_action)``: the
    `LatencyModel.step_overhead` mapping (``plain`` = the median residual of the tree-less steps;
    ``speculative`` and ``per_node`` = a least-squares line through each speculative action's median
    residual against its tree size) and, per action, the measured and modelled medians (for the record)."""
    actions = [a for a in actions if a.tree_size + 1 <= model.target_tokens[-1] and a.K <= model.draft_rows[-1]]
    decoder = SpeculativeDecoder(target, draft, vocab_size)
    by_action, sizes, residuals = {}, [], []
    for action in actions:
        method = "autoregressive" if not action.tree_size else "traversal"
        decoder.generate(list(prompt_ids), 4, method, action, sampling, seed=99)  # warm-up
        measured, modelled = [], []
        for seed in seeds:
            marks: list[tuple[float, int]] = []  # (when step i ended, the context step i + 1 starts at)
            record = marks.append
            decoder.generate(list(prompt_ids), new_tokens, method, action, sampling, seed=seed,
                             on_step=lambda state, _r, record=record: record((time.perf_counter(),
                                                                               state.context_length)))
            for (t0, ctx), (t1, _) in zip(marks, marks[1:], strict=False):
                measured.append(t1 - t0)
                modelled.append(float(model.step_seconds(ctx, [action])[0]))
        residual = float(np.median(np.subtract(measured, modelled)))
        by_action[str(action)] = {"steps": len(measured), "measured_ms": float(np.median(measured)) * 1e3,
                                  "modelled_ms": float(np.median(modelled)) * 1e3, "overhead_ms": residual * 1e3}
        if action.tree_size:
            sizes.append(action.tree_size)
            residuals.append(residual)
    plain = [v["overhead_ms"] / 1e3 for a, v in by_action.items() if parse_action(a).tree_size == 0]
    if not plain or len(set(sizes)) < 2:
        raise ValueError("measure_step_overhead needs a tree-less action and speculative actions of two tree sizes")
    per_node, base = np.polyfit(np.asarray(sizes, dtype=np.float64), np.asarray(residuals), 1)
    return {"plain": float(np.median(plain)), "speculative": float(base), "per_node": float(per_node)}, by_action
