"""Whole decoded steps as ratios to a plain step: the measurement behind `decoding.pricing` (`LatencyModel.step_ratios`).

`branchpoint profile` runs it after the forward tables. Every *step class* (each action of the grid verified by
Traversal, each lookup chain length, and the plain step itself) is decoded with the engine's own loop, ``new_tokens``
tokens at a time, in *rounds*: each round decodes every class once from the same context, in an order rotated per
round, each class decode between two plain decodes. Each step's seconds are divided by the mean plain step of the plain decodes right before and after it, so a machine that
runs 2-3x slower in one phase than in another (phases last seconds to minutes) moves numerator and denominator alike.
A class's ratio is the mean of its normalised steps (means: throughput pays the mean, right tail included). Deciding is
not a class: it adds ~2% of a step, a difference of whole steps a busy stretch swamps (median decide-over-plain read
0.000, 0.056 and 0.000 in three quiet runs, and 0.237 beside a second decode), so it is timed alone (`time_deciding`,
below).

One class measured alone is noisy (about 12% per shape over 4 rounds: 3,1,0 read 1.24x a plain step and 1,1,0
1.45x, though K does not change a chain's step), so no class prices itself: one non-negative least-squares fit over
the drafted classes, and one over the lookup chains, give the coefficients of `decoding.pricing`'s terms. The
draft's prefill over the prompt is not part of any step (`decoding.policy.StepTiming.step_seconds`).

Deciding (`time_deciding`): what a selector's step computes before its network runs, per feature set: a real root's
features as the decoder hands them over (rows, hidden states, the root's input embedding) and
`FeatureSchema.vectorize`, timed alone with `decoding.latency.quiet_seconds`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decoding.actions import AR_ACTION, Action
from decoding.features import FEATURE_SETS, FeatureSchema, RootFeatures
from decoding.latency import CHAIN_TERMS, TREE_TERMS, LatencyModel, StepRatios, quiet_seconds
from decoding.policy import Choice, Policy, StaticPolicy, StepResult
from decoding.pricing import LOOKUP, PLAIN, VERIFY_REFERENCE, chain_terms, model_ratio, step_ratio, tree_terms
from decoding.sampling import Sampling
from decoding.tree import proposal_tree
from engine.decoder import SpeculativeDecoder
from engine.tree_pass import input_embeddings

from .forward_tables import TimedPair

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
        tokens = [int(t) for t in features.context[-self.n:]]
        return Choice(Action(1, len(tokens), 0), proposal=proposal_tree(tokens, len(features.p_prev)))


@dataclass(frozen=True)
class TimedStep:
    round: int
    klass: str  # `decoding.pricing` step-class key
    context: int
    seconds: float
    slot: int = 0  # the decode's position in its round: a class decode at slot i sits between plain decodes i +- 1


def price_actions(actions: Sequence[Action]) -> list[Action]:
    """The speculative actions that are decoded: all, or `MAX_ACTIONS` evenly spaced ones."""
    spec = [a for a in dict.fromkeys(actions) if a.tree_size]
    if len(spec) <= MAX_ACTIONS:
        return spec
    return [spec[i] for i in np.linspace(0, len(spec) - 1, MAX_ACTIONS).round().astype(int)]


def _classes(actions, lookup_lengths, sink) -> dict[str, tuple[str, Policy]]:
    """Class key -> (method, policy)."""
    out = {PLAIN: (VERIFY_REFERENCE, _Static(AR_ACTION, sink))}
    out.update({f"{VERIFY_REFERENCE}:{a}": (VERIFY_REFERENCE, _Static(a, sink)) for a in actions})
    out.update({f"{LOOKUP}:{n}": ("naive", _Lookup(n, sink)) for n in lookup_lengths})
    return out


@dataclass(frozen=True)
class PriceRounds:
    """What `measure_step_ratios` decodes besides the drafted actions: prompt lookup chains of ``lookup_lengths``,
    ``new_tokens`` per decode, ``rounds`` rounds."""

    lookup_lengths: Sequence[int] = ()
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
    classes = _classes(price_actions(actions), plan.lookup_lengths, sink)
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
    context = float(np.mean([s.context for s in steps]))
    defaults = StepRatios()
    ratios = StepRatios(scale, context, tree or defaults.tree, chain or defaults.chain)
    for a, row in drafted.items():  # what the fit and the tables alone say, for the record
        row["fitted_ratio"] = float(step_ratio(dataclasses.replace(latency, step_ratios=ratios), [row["context"]],
                                               [a])[0, 0])
        row["tables_ratio"] = float(model_ratio(latency, [row["context"]], [a])[0, 0])
    for n, row in chains.items():
        row["fitted_ratio"] = float(chain_terms(latency, [row["context"]], [n])[0, 0] @ ratios.chain_vector())
    return ratios, by_class


class _CaptureRoots(Policy):
    """A plain step at every root that keeps the features the decoder hands a selector (draft rows and hidden states
    included)."""

    needs_hidden_states = True
    needs_draft = True

    def __init__(self) -> None:
        self.roots: list[RootFeatures] = []

    def select(self, features: RootFeatures) -> Action:
        self.roots.append(features)
        return AR_ACTION


def deciding_work(pair: TimedPair, context_ids: Sequence[int], latency: LatencyModel,
                  sampling: Sampling = DEFAULT_SAMPLING) -> dict[str, Callable[[], object]]:
    """``{feature set: fn}``: ``fn()`` computes what deciding computes at one root before the selector's network runs
    (the root's input embedding, then `FeatureSchema.vectorize` with a fresh memo) on a real root of a short decode
    after ``context_ids``; for every feature set the pair can feed."""
    policy = _CaptureRoots()
    SpeculativeDecoder(pair.target, pair.draft, pair.vocab_size).generate(list(context_ids), 4, VERIFY_REFERENCE,
                                                                          policy, sampling, seed=0)
    root = policy.roots[-1]
    token = int(root.context[-1])
    sizes = {h: getattr(root, h).size for h in ("h_p_prev", "h_q_prev") if getattr(root, h) is not None}
    out = {}
    for feature_set in FEATURE_SETS:
        schema = FeatureSchema.for_pair(feature_set, sizes.get("h_p_prev", 0), sizes.get("h_q_prev", 0))
        if any(getattr(root, h) is None for h in schema.hidden if h != "e_root"):
            continue  # the pair gives no such hidden state: no selector of this set can run on it

        def decide_inputs(schema=schema):  # as the decoder's step: the root embedding, then the selector's inputs
            with torch.inference_mode():
                e_root = input_embeddings(pair.target, [token])[0]
            return schema.vectorize(dataclasses.replace(root, e_root=e_root, memo={}), latency)

        out[feature_set] = decide_inputs
    return out


def time_deciding(pair: TimedPair, context_ids: Sequence[int], latency: LatencyModel,
                  sampling: Sampling = DEFAULT_SAMPLING, reps: int = 200) -> dict[str, float]:
    """``{feature set: seconds}`` of `deciding_work`, each timed with `quiet_seconds` (``reps`` calls)."""
    return {k: quiet_seconds(fn, reps) for k, fn in deciding_work(pair, context_ids, latency, sampling).items()}
