"""The step overhead of the latency model: what a whole decoding step of our engine costs beyond the forwards
the profile times (verification, sampling, pruning both caches, bookkeeping). `branchpoint profile` measures it
after the tables and stores it as `decoding.latency.LatencyModel.step_overhead`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decoding.actions import Action
from decoding.engine.generate import SpeculativeDecoder
from decoding.latency import VERIFY_REFERENCE, LatencyModel, draft_forwards
from decoding.policy import StaticPolicy, StepTiming
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
# rounds: each decodes every action once (seed = round); four short rounds track a drifting machine closer than two
# long ones
OVERHEAD_SEEDS = (0, 1, 2, 3)
# the tree-less action decodes this many times the tokens: every speculative shape is compared with the plain step, and
# at one token per step it had the fewest steps of all (three profiles read its residual at -4.7 to -8.9 ms)
PLAIN_TOKENS = 3


@dataclass(frozen=True)
class TimedStep:
    """One decoded step of the overhead measurement: its round (one decode of every action), shape, context, and
    its whole and target-pass seconds as the engine timed them (`decoding.policy.StepTiming`)."""

    round: int
    action: Action
    context: int
    seconds: float
    target_seconds: float


def speed_factors(steps: Sequence[TimedStep], model: LatencyModel) -> dict[int, float]:
    """Per round: how much slower the machine ran than when the tables were timed, read off the target passes,
    the bulk of every step: their measured seconds summed over the round (every action) over the table's
    ``t_p`` at the same contexts and tree sizes. 1.0 = the tables' speed."""
    measured: dict[int, float] = {}
    modelled: dict[int, float] = {}
    for s in steps:
        measured[s.round] = measured.get(s.round, 0.0) + s.target_seconds
        modelled[s.round] = modelled.get(s.round, 0.0) + float(model.t_p(s.context, 1 + s.action.tree_size))
    return {r: measured[r] / modelled[r] for r in measured}


class _TimedStatic(StaticPolicy):
    """A static action that keeps the engine's own timing of every step (the ``observe_step`` hook)."""

    def __init__(self, action: Action, sink: list) -> None:
        super().__init__(action)
        self.sink = sink

    def observe_step(self, action: Action, context_length: int, timing: StepTiming) -> None:
        self.sink.append((context_length, timing))


def measure_step_overhead(target: torch.nn.Module, draft: torch.nn.Module, vocab_size: int, prompt_ids: Sequence[int],
                          model: LatencyModel, actions: Sequence[Action] = OVERHEAD_ACTIONS, new_tokens: int = 16,
                          seeds: Sequence[int] = OVERHEAD_SEEDS, sampling: Sampling = DEFAULT_SAMPLING,
                          fit_terms: int = FIT_TERMS) -> tuple[dict, dict]:
    """What a whole engine step costs beyond its forwards: decode ``new_tokens`` after ``prompt_ids`` with each
    static action that the profiled grid prices (verified by traversal; the tree-less one takes plain steps, and
    decodes ``PLAIN_TOKENS`` times the tokens), once per seed (a round),
    time every step but the first (it holds the draft's prefill), bring each round to the tables' speed (divide by
    its `speed_factors`) and subtract ``model.step_seconds`` at the step's context. Returns ``(overhead,
    by_action)``: the `LatencyModel.step_overhead` mapping (``plain`` = the mean residual of the tree-less steps;
    ``speculative``, ``per_forward`` and ``per_node`` = a least-squares fit of each speculative action's mean
    residual by its number of draft forwards and its tree size, the first ``fit_terms`` of these three terms, the
    others 0) and, per action, the measured (raw mean and median, and the mean at the tables' speed), modelled and
    fitted step times and the speed factor of its rounds (for the record).

    Means, not medians: step times have a right tail (a slow step in ten costs 30-40% more on this CPU), and
    throughput pays the mean. With medians the model priced the online steps 1-3 ms too cheap.

    Why the speed factor: the residual is a few ms of an 30-80 ms step, so a machine a few percent slower while
    decoding than while timing the tables lands whole in it. Without the factor, profiles of the same pair fitted
    (plain, speculative) at (+4, -13) and (-8, +20) ms: the second priced every speculative step above a plain one
    and the selector never drafted. Dividing by one factor per round keeps what differs between shapes (a grid cell
    that reads slow, work the forwards leave out) and drops what the whole machine did."""
    actions = [a for a in dict.fromkeys(actions)  # once each, in the given order
               if a.tree_size + 1 <= model.target_tokens[-1] and a.K <= model.draft_rows[-1]]
    if not 1 <= fit_terms <= 3:
        raise ValueError(f"measure_step_overhead: fit_terms must be 1, 2 or 3, got {fit_terms}")
    if not any(a.tree_size == 0 for a in actions) or not any(a.tree_size for a in actions):
        raise ValueError("measure_step_overhead needs the tree-less action and at least one speculative action")
    decoder = SpeculativeDecoder(target, draft, vocab_size)
    for action in actions:
        decoder.generate(list(prompt_ids), 4, VERIFY_REFERENCE, action, sampling, seed=99)  # warm-up
    steps: list[TimedStep] = []
    # interleaved: each seed (a round) decodes every action, in an order rotated per round, so a slow phase of a
    # shared machine lands on all actions alike instead of on the few measured during it
    for si, seed in enumerate(seeds):
        for action in actions[si % len(actions):] + actions[:si % len(actions)]:
            timed: list[tuple[int, StepTiming]] = []
            # the tree-less action decodes as autoregressive does (a plain step); "autoregressive" would drop
            # the policy and its timing hook
            tokens = new_tokens if action.tree_size else PLAIN_TOKENS * new_tokens
            decoder.generate(list(prompt_ids), tokens, VERIFY_REFERENCE, _TimedStatic(action, timed), sampling,
                             seed=seed)
            steps += [TimedStep(si, action, ctx, t.seconds, t.target_seconds) for ctx, t in timed[1:]]
    return fit_step_overhead(steps, model, actions, fit_terms)


def fit_step_overhead(steps: Sequence[TimedStep], model: LatencyModel, actions: Sequence[Action],
                      fit_terms: int = FIT_TERMS) -> tuple[dict, dict]:
    """`measure_step_overhead`'s result from its timed steps (see there)."""
    speed = speed_factors(steps, model)
    by_action = {}  # str(action) -> its row (keys in grid order)
    for action in actions:
        mine = [s for s in steps if s.action == action]
        raw = np.array([s.seconds for s in mine])
        at_table_speed = np.array([s.seconds / speed[s.round] for s in mine])
        modelled = np.array([float(model.step_seconds(s.context, [action])[0]) for s in mine])
        by_action[str(action)] = {"steps": len(mine), "speed_factor": float(np.mean([speed[s.round] for s in mine])),
                                  "measured_ms": float(np.mean(raw)) * 1e3,
                                  "measured_median_ms": float(np.median(raw)) * 1e3,
                                  "at_table_speed_ms": float(np.mean(at_table_speed)) * 1e3,
                                  "modelled_ms": float(np.mean(modelled)) * 1e3,
                                  "overhead_ms": float(np.mean(at_table_speed - modelled)) * 1e3}
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
