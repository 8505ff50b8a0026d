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
from decoding.latency import VERIFY_REFERENCE, LatencyModel, draft_forwards
from decoding.sampling import Sampling

DEFAULT_SAMPLING = Sampling()
# the tree-less step and speculative shapes of varied draft-forward counts (1-4) and tree sizes (1-6)
OVERHEAD_ACTIONS = (Action(1, 0, 0), Action(1, 0, 1), Action(3, 0, 1), Action(1, 1, 1), Action(2, 1, 2),
                    Action(1, 2, 1), Action(3, 1, 1), Action(2, 0, 2), Action(1, 3, 0))


# Terms of the speculative fit: 1 = one constant per speculative step (the mean residual of the speculative
# shapes). Two profiles of the same machine, minutes apart, fitted the per-forward term at +0.7 and -4.0 ms and the
# per-node term at -0.1 and +1.6 ms: 8 shapes with residuals that swing by +-5 ms between runs cannot tell those
# apart, and the -4.0 ms fit priced every speculative step ~12% too cheap (static 1,0,1 1.10x autoregressive
# offline, 0.98x online). The grid's own forward times carry how a step's cost grows with its forwards and nodes.
FIT_TERMS = 1


def measure_step_overhead(target: torch.nn.Module, draft: torch.nn.Module, vocab_size: int, prompt_ids: Sequence[int],
                          model: LatencyModel, actions: Sequence[Action] = OVERHEAD_ACTIONS, new_tokens: int = 24,
                          seeds: Sequence[int] = (0, 1), sampling: Sampling = DEFAULT_SAMPLING,
                          fit_terms: int = FIT_TERMS) -> tuple[dict, dict]:
    """What a whole engine step costs beyond its forwards: decode ``new_tokens`` after ``prompt_ids`` with each
    static action that the profiled grid prices (traversal; AR for the tree-less one), time every step but the
    first (it holds the prefill) and subtract ``model.step_seconds`` at the step's context. Returns ``(overhead, by_action)``: the
    `LatencyModel.step_overhead` mapping (``plain`` = the mean residual of the tree-less steps;
    ``speculative``, ``per_forward`` and ``per_node`` = a least-squares fit of each speculative action's mean
    residual by its number of draft forwards and its tree size, the first ``fit_terms`` of these three terms, the
    others 0) and, per action, the measured (mean and median), modelled and fitted step times (for the record).

    Means, not medians: step times have a right tail (a slow step in ten costs 30-40% more on this CPU), and
    throughput pays the mean. With medians the model priced the online steps 1-3 ms too cheap."""
    actions = [a for a in dict.fromkeys(actions)  # once each, in the given order
               if a.tree_size + 1 <= model.target_tokens[-1] and a.K <= model.draft_rows[-1]]
    if not 1 <= fit_terms <= 3:
        raise ValueError(f"measure_step_overhead: fit_terms must be 1, 2 or 3, got {fit_terms}")
    if not any(a.tree_size == 0 for a in actions) or not any(a.tree_size for a in actions):
        raise ValueError("measure_step_overhead needs the tree-less action and at least one speculative action")
    decoder = SpeculativeDecoder(target, draft, vocab_size)
    method = {a: "autoregressive" if not a.tree_size else VERIFY_REFERENCE for a in actions}
    for action in actions:
        decoder.generate(list(prompt_ids), 4, method[action], action, sampling, seed=99)  # warm-up
    measured = {a: [] for a in actions}
    modelled = {a: [] for a in actions}

    # interleaved: each seed decodes every action, in an order rotated per seed, so a slow phase of a shared
    # machine lands on all actions alike instead of on the few measured during it
    for si, seed in enumerate(seeds):
        for action in actions[si % len(actions):] + actions[:si % len(actions)]:
            marks: list[tuple[float, int]] = []  # (when step i ended, the context step i + 1 starts at)
            record = marks.append
            decoder.generate(list(prompt_ids), new_tokens, method[action], action, sampling, seed=seed,
                             on_step=lambda state, _r, record=record: record((time.perf_counter(),
                                                                               state.context_length)))
            for (t0, ctx), (t1, _) in zip(marks, marks[1:], strict=False):
                measured[action].append(t1 - t0)
                modelled[action].append(float(model.step_seconds(ctx, [action])[0]))
    by_action = {}  # str(action) -> its row (keys in grid order)
    for action in actions:
        residual = float(np.mean(np.subtract(measured[action], modelled[action])))  # the mean: what tokens/s pay
        steps = measured[action]
        by_action[str(action)] = {"steps": len(steps), "measured_ms": float(np.mean(steps)) * 1e3,
                                  "measured_median_ms": float(np.median(steps)) * 1e3,
                                  "modelled_ms": float(np.mean(modelled[action])) * 1e3, "overhead_ms": residual * 1e3}
    plain = [by_action[str(a)]["overhead_ms"] / 1e3 for a in actions if a.tree_size == 0]
    spec = [a for a in actions if a.tree_size]
    forwards = np.bincount(draft_forwards(0, spec)[0], minlength=len(spec))
    columns = np.stack([np.ones(len(spec)), forwards, [a.tree_size for a in spec]], axis=1).astype(np.float64)
    residuals = np.array([by_action[str(a)]["overhead_ms"] / 1e3 for a in spec])
    used = fit_terms  # a small grid may price too few shapes to tell forwards from nodes: then fewer terms
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
