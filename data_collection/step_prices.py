"""Whole decoded steps as ratios to a plain step: the measurement behind `decoding.pricing` (`LatencyModel.step_ratios`).

`branchpoint profile` runs it after the forward tables. Every *step class* (each action of the grid verified by
Traversal, each lookup chain length, a plain step that decides with the target_only features, and the plain step
itself) is decoded with the engine's own loop, ``new_tokens`` tokens at a time, in *rounds*: each round decodes every
class once from the same context, in an order rotated per round, each class decode between two plain decodes. Each
step's seconds are divided by the mean plain step of the plain decodes right before and after it, so a machine that
runs 2-3x slower in one phase than in another (phases last seconds to minutes) moves numerator and denominator alike.
A class's ratio is the mean of its normalised steps (means: throughput pays the mean, right tail included); deciding's
price is a median difference instead (`decide_ratio`: a small difference a busy stretch would swamp).

One class measured alone is noisy (about 12% per shape over 4 rounds: 3,1,0 read 1.24x a plain step and 1,1,0
1.45x, though K does not change a chain's step), so no class prices itself: one non-negative least-squares fit over
the drafted classes, and one over the lookup chains, give the coefficients of `decoding.pricing`'s terms. The
draft's prefill over the prompt is not part of any step (`decoding.policy.StepTiming.step_seconds`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decoding.actions import AR_ACTION, Action
from decoding.engine.decoder import SpeculativeDecoder
from decoding.features import FeatureSchema
from decoding.latency import CHAIN_TERMS, TREE_TERMS, LatencyModel, StepRatios
from decoding.policy import Choice, Policy, StaticPolicy, StepResult
from decoding.pricing import LOOKUP, PLAIN, VERIFY_REFERENCE, chain_terms, model_ratio, step_ratio, tree_terms
from decoding.sampling import Sampling

from .profile import TimedPair

DECIDE = "decide"  # the class of plain steps that compute the target_only features first
DEFAULT_SAMPLING = Sampling()
MAX_ACTIONS = 64  # at most this many actions of the grid are decoded (evenly spaced); the fit prices the rest


class _Recorder(Policy):
    """Mixin: keeps every step's context length and whole seconds (prefill excluded) in ``sink``."""

    sink: list

    def observe(self, step: StepResult) -> None:
        self.sink.append((step.context_length, step.timing.step_seconds))


class _Static(_Recorder, StaticPolicy):
    def __init__(self, action: Action, sink: list) -> None:
        StaticPolicy.__init__(self, action)
        self.sink = sink


class _Lookup(_Recorder):
    """Proposes the context's last ``n`` tokens as a chain at every step (what a lookup step costs; the tokens only
    change how many are accepted)."""

    needs_draft = False
    uses_draft_model = False

    def __init__(self, n: int, sink: list) -> None:
        self.n, self.sink = n, sink

    def select(self, features) -> Choice:
        tokens = tuple(int(t) for t in features.context[-self.n:])
        return Choice(Action(1, len(tokens), 0), proposal=tokens)


class _Decide(_Recorder):
    """A plain step that first computes the selector's target_only inputs (what deciding costs beyond the ONNX call)."""

    needs_draft = False
    needs_hidden_states = True
    uses_draft_model = False

    def __init__(self, schema: FeatureSchema, latency: LatencyModel, sink: list) -> None:
        self.schema, self.latency, self.sink = schema, latency, sink

    def select(self, features) -> Action:
        self.schema.vectorize(features, self.latency)
        return AR_ACTION


@dataclass(frozen=True)
class TimedStep:
    round: int
    klass: str  # `decoding.pricing` step-class key, or DECIDE
    context: int
    seconds: float
    slot: int = 0  # the decode's position in its round: a class decode at slot i sits between plain decodes i +- 1


def price_actions(actions: Sequence[Action]) -> list[Action]:
    """The speculative actions that are decoded: all, or `MAX_ACTIONS` evenly spaced ones."""
    spec = [a for a in dict.fromkeys(actions) if a.tree_size]
    if len(spec) <= MAX_ACTIONS:
        return spec
    return [spec[i] for i in np.linspace(0, len(spec) - 1, MAX_ACTIONS).round().astype(int)]


def _classes(actions, lookup_lengths, schema, latency, sink) -> dict[str, tuple[str, Policy]]:
    """Class key -> (method, policy)."""
    out = {PLAIN: (VERIFY_REFERENCE, _Static(AR_ACTION, sink))}
    if schema is not None:
        out[DECIDE] = (VERIFY_REFERENCE, _Decide(schema, latency, sink))
    out.update({f"{VERIFY_REFERENCE}:{a}": (VERIFY_REFERENCE, _Static(a, sink)) for a in actions})
    out.update({f"{LOOKUP}:{n}": ("naive", _Lookup(n, sink)) for n in lookup_lengths})
    return out


@dataclass(frozen=True)
class PriceRounds:
    """What `measure_step_ratios` decodes besides the drafted actions: prompt lookup chains of ``lookup_lengths``,
    a deciding step with ``schema``'s features (None: not measured), ``new_tokens`` per decode, ``rounds`` rounds."""

    lookup_lengths: Sequence[int] = ()
    schema: FeatureSchema | None = None
    new_tokens: int = 16
    rounds: int = 4
    sampling: Sampling = DEFAULT_SAMPLING


@torch.inference_mode()
def measure_step_ratios(pair: TimedPair, contexts: Sequence[Sequence[int]], latency: LatencyModel,
                        actions: Sequence[Action], plan: PriceRounds = PriceRounds(),
                        progress: str | None = None) -> tuple[StepRatios, dict]:
    """Decode every step class in ``plan.rounds`` rounds (module docstring; round r starts from
    ``contexts[r % len(contexts)]``, the classes in an order rotated per round, each between two plain decodes) and
    return ``(StepRatios, by_class)``: the coefficients `decoding.pricing` prices with, and per class its steps, mean
    ratio, its spread over rounds and the fitted ratio (for the record)."""
    from tqdm.auto import tqdm

    rounds, new_tokens, sampling = plan.rounds, plan.new_tokens, plan.sampling

    if rounds < 1 or new_tokens < 1 or not contexts:
        raise ValueError("measure_step_ratios needs rounds >= 1, new_tokens >= 1 and at least one context")
    sink: list = []
    classes = _classes(price_actions(actions), plan.lookup_lengths, plan.schema, latency, sink)
    decoder = SpeculativeDecoder(pair.target, pair.draft, pair.vocab_size)
    keys = [k for k in classes if k != PLAIN]
    steps: list[TimedStep] = []
    bar = tqdm(total=rounds * (2 * len(keys) + 1), desc=progress, unit="decode", disable=progress is None,
               mininterval=1.0)
    try:
        for method, policy in classes.values():  # warm-up, untimed
            decoder.generate(list(contexts[0]), 2, method, policy, sampling, seed=99)
        for r in range(rounds):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            plan = [PLAIN] + [k for key in order for k in (key, PLAIN)]
            for slot, key in enumerate(plan):
                method, policy = classes[key]
                sink.clear()
                decoder.generate(list(contexts[r % len(contexts)]), new_tokens, method, policy, sampling,
                                 seed=r * 1000 + slot)
                steps += [TimedStep(r, key, c, s, slot) for c, s in sink]
                bar.update()
    finally:
        bar.close()
    return fit_step_ratios(steps, latency)


def normalised(steps: Sequence[TimedStep]) -> list[tuple[TimedStep, float]]:
    """Each non-plain step with its seconds over the mean plain step of the plain decodes at slots ``slot +- 1`` of its
    round (those that exist); plain steps over the mean of their own round's plain steps."""
    plain: dict[tuple[int, int], list[float]] = {}
    for s in steps:
        if s.klass == PLAIN:
            plain.setdefault((s.round, s.slot), []).append(s.seconds)
    by_round = {r: float(np.mean([x for (rr, _), v in plain.items() if rr == r for x in v]))
                for r in {r for r, _ in plain}}
    out = []
    for s in steps:
        if s.klass == PLAIN:
            out.append((s, s.seconds / by_round[s.round]))
            continue
        near = [x for d in (-1, 1) for x in plain.get((s.round, s.slot + d), [])]
        ref = float(np.mean(near)) if near else by_round.get(s.round)
        if ref is None:
            raise ValueError(f"step class {s.klass} in round {s.round} has no plain steps to be measured against")
        out.append((s, s.seconds / ref))
    return out


def decide_ratio(norm: Sequence[tuple[TimedStep, float]]) -> float:
    """What deciding adds to a plain step, from normalised steps (`normalised`): the median decide step over the median
    plain step, minus 1; 0 when no decide step was timed. Medians, not means: deciding adds ~2% of a step, and one
    busy stretch (a test run on the cores) read a mean of 1.107 with rounds from 0.96 to 1.39 (stop 54; the median
    0.020 quiet), which moves 2.2% of the selector's TEST decisions (issue #43). A spike lands in the tail a median
    ignores; a plain step, as slow in a busy phase, is measured the same way. A sustained second decode still swamps
    it (docs/selector.md)."""
    decide = [v for s, v in norm if s.klass == DECIDE]
    plain = [v for s, v in norm if s.klass == PLAIN]
    if not decide or not plain:
        return 0.0
    return max(float(np.median(decide) / np.median(plain)) - 1.0, 0.0)


def _fit(terms: np.ndarray, ratios: np.ndarray, names: tuple[str, ...]) -> dict:
    """Non-negative least squares of ``ratios`` ``[C]`` on ``terms`` ``[C, T]`` (costs do not go negative)."""
    from scipy.optimize import nnls

    coef, _ = nnls(terms, ratios)
    return {n: float(c) for n, c in zip(names, coef, strict=True)}


def fit_step_ratios(steps: Sequence[TimedStep], latency: LatencyModel) -> tuple[StepRatios, dict]:
    """`measure_step_ratios`' result from its timed steps (see there): each class's mean normalised step at its mean
    context, then one fit over the drafted classes and one over the lookup chains (`decoding.pricing`'s terms)."""
    by_class: dict[str, dict] = {}
    norm = normalised(steps)
    for key in dict.fromkeys(s.klass for s in steps):
        mine = [(s, v) for s, v in norm if s.klass == key]
        per_round = [float(np.mean([v for s, v in mine if s.round == r])) for r in sorted({s.round for s, _ in mine})]
        by_class[key] = {"steps": len(mine), "ratio": float(np.mean([v for _, v in mine])),
                         "context": float(np.mean([s.context for s, _ in mine])), "round_min": min(per_round),
                         "round_max": max(per_round), "mean_ms": float(np.mean([s.seconds for s, _ in mine])) * 1e3}
    plain = [s for s in steps if s.klass == PLAIN]
    if not plain:
        raise ValueError("step prices need plain steps to measure the other classes against")
    scale = float(np.mean([s.seconds / latency.t_p(s.context, 1) for s in plain]))
    drafted = {Action(*(int(x) for x in k.split(":")[1].split(","))): row for k, row in by_class.items()
               if k.startswith(f"{VERIFY_REFERENCE}:")}
    chains = {int(k.split(":")[1]): row for k, row in by_class.items() if k.startswith(f"{LOOKUP}:")}
    tree = chain = None
    if drafted:
        terms = np.stack([tree_terms(latency, [row["context"]], [a])[0, 0] for a, row in drafted.items()])
        tree = _fit(terms, np.array([row["ratio"] for row in drafted.values()]), TREE_TERMS)
    if chains:
        terms = np.stack([chain_terms(latency, [row["context"]], [n])[0, 0] for n, row in chains.items()])
        chain = _fit(terms, np.array([row["ratio"] for row in chains.values()]), CHAIN_TERMS)
    decide = decide_ratio(norm)
    context = float(np.mean([s.context for s in steps]))
    defaults = StepRatios()
    ratios = StepRatios(scale, decide, context, tree or defaults.tree, chain or defaults.chain)
    for a, row in drafted.items():  # what the fit and the tables alone say, for the record
        row["fitted_ratio"] = float(step_ratio(dataclasses.replace(latency, step_ratios=ratios), [row["context"]],
                                               [a])[0, 0])
        row["tables_ratio"] = float(model_ratio(latency, [row["context"]], [a])[0, 0])
    for n, row in chains.items():
        row["fitted_ratio"] = float(chain_terms(latency, [row["context"]], [n])[0, 0] @ ratios.chain_vector())
    return ratios, by_class

