"""The step overhead of the latency model: what a whole decoding step of our engine costs beyond the forwards
the profile times (verification, sampling, pruning both caches, bookkeeping). `branchpoint profile` measures it
after the tables and stores it as `decoding.latency.LatencyModel.step_overhead`."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from decoding.actions import Action
from decoding.engine.generate import SpeculativeDecoder
from decoding.latency import LatencyModel, draft_forwards
from decoding.sampling import Sampling

DEFAULT_SAMPLING = Sampling()
# the tree-less step and speculative shapes of varied draft-forward counts (1-4) and tree sizes (1-6)
OVERHEAD_ACTIONS = (Action(1, 0, 0), Action(1, 0, 1), Action(3, 0, 1), Action(1, 1, 1), Action(2, 1, 2),
                    Action(1, 2, 1), Action(3, 1, 1), Action(2, 0, 2), Action(1, 3, 0))


def measure_step_overhead(target: torch.nn.Module, draft: torch.nn.Module, vocab_size: int, prompt_ids: Sequence[int],
                          model: LatencyModel, actions: Sequence[Action] = OVERHEAD_ACTIONS, new_tokens: int = 24,
                          seeds: Sequence[int] = (0, 1), sampling: Sampling = DEFAULT_SAMPLING
                          ) -> tuple[dict, dict]:
    """What a whole engine step costs beyond its forwards: decode ``new_tokens`` after ``prompt_ids`` with each
    static action that the profiled grid prices (traversal; AR for the tree-less one), time every step but the
    first (it holds the prefill) and subtract ``model.step_seconds`` at the step's context. Returns ``(overhead, by_action)``: the
    `LatencyModel.step_overhead` mapping (``plain`` = the mean residual of the tree-less steps;
    ``speculative``, ``per_forward`` and ``per_node`` = a least-squares fit of each speculative action's mean
    residual by its number of draft forwards and its tree size) and, per action, the measured (mean and median),
    modelled and fitted step times (for the record).

    Means, not medians: step times have a right tail (a slow step in ten costs 30-40% more on this CPU), and
    throughput pays the mean. With medians the model priced the online steps 1-3 ms too cheap."""
    actions = [a for a in actions if a.tree_size + 1 <= model.target_tokens[-1] and a.K <= model.draft_rows[-1]]
    decoder = SpeculativeDecoder(target, draft, vocab_size)
    by_action, measured_actions = {}, {}  # str(action) -> its row / the Action itself (keys in measuring order)
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
        residual = float(np.mean(np.subtract(measured, modelled)))  # the mean: what tokens per second pay
        by_action[str(action)] = {"steps": len(measured), "measured_ms": float(np.mean(measured)) * 1e3,
                                  "measured_median_ms": float(np.median(measured)) * 1e3,
                                  "modelled_ms": float(np.mean(modelled)) * 1e3, "overhead_ms": residual * 1e3}
        measured_actions[str(action)] = action
    plain = [by_action[str(a)]["overhead_ms"] / 1e3 for a in measured_actions.values() if a.tree_size == 0]
    spec = [a for a in measured_actions.values() if a.tree_size]
    if not plain or not spec:
        raise ValueError("measure_step_overhead needs the tree-less action and at least one speculative action")
    forwards = np.bincount(draft_forwards(0, spec)[0], minlength=len(spec))
    columns = np.stack([np.ones(len(spec)), forwards, [a.tree_size for a in spec]], axis=1).astype(np.float64)
    residuals = np.array([by_action[str(a)]["overhead_ms"] / 1e3 for a in spec])
    used = 3  # a small grid may price too few shapes to tell forwards from nodes: then fewer terms (0 for the rest)
    while used > 1 and np.linalg.matrix_rank(columns[:, :used]) < used:
        used -= 1
    design = columns[:, :used]
    coef = np.zeros(3)
    coef[:used] = np.linalg.lstsq(design, residuals, rcond=None)[0]
    base, per_forward, per_node = coef
    for a, fit in zip(spec, columns @ coef, strict=True):
        by_action[str(a)]["fitted_overhead_ms"] = float(fit) * 1e3
    # plain: the mean over the tree-less actions of their mean residuals (means, as above); with the one tree-less
    # action of OVERHEAD_ACTIONS (AR) that is its own mean residual
    overhead = {"plain": float(np.mean(plain)), "speculative": float(base), "per_forward": float(per_forward),
                "per_node": float(per_node)}
    return overhead, by_action
