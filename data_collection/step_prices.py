"""Whole decoded steps as ratios to a plain step: the measurement behind `decoding.pricing` (`LatencyModel.step_ratios`).

`branchpoint profile` runs it after the forward tables. Every *step class* (each action of the grid verified by
Traversal, each lookup chain length, a plain step that decides with the target_only features, and the plain step
itself) is decoded with the engine's own loop, ``new_tokens`` tokens at a time, in *rounds*: each round decodes every
class once from the same context, in an order rotated per round, with plain decodes spread through the round. Each
step's seconds are divided by the mean plain step of its round, so a machine that runs 2-3x slower in one phase
than in another moves numerator and denominator alike; the class's ratio is the mean of its normalised steps (means:
throughput pays the mean, right tail included). The draft's prefill over the prompt is not part of any step
(`decoding.policy.StepTiming.step_seconds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from decoding.actions import AR_ACTION, Action
from decoding.engine.decoder import SpeculativeDecoder
from decoding.features import FeatureSchema
from decoding.latency import LatencyModel, StepRatios
from decoding.policy import Choice, Policy, StaticPolicy, StepResult
from decoding.pricing import LOOKUP, PLAIN, VERIFY_REFERENCE, model_ratio
from decoding.sampling import Sampling

DECIDE = "decide"  # the class of plain steps that compute the target_only features first
DEFAULT_SAMPLING = Sampling()
MAX_ACTIONS = 64  # at most this many actions of the grid are decoded (evenly spaced); the rest get the mean correction
PLAIN_EVERY = 8  # a plain decode after every this many classes of a round (and at its start)


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


def price_actions(actions: Sequence[Action]) -> list[Action]:
    """The speculative actions that are decoded: all, or `MAX_ACTIONS` evenly spaced ones."""
    spec = [a for a in dict.fromkeys(actions) if a.tree_size]
    if len(spec) <= MAX_ACTIONS:
        return spec
    return [spec[i] for i in np.linspace(0, len(spec) - 1, MAX_ACTIONS).round().astype(int)]


def _classes(actions, lookup_lengths, schema, latency, sink) -> dict[str, tuple[str, Policy, int]]:
    """Class key -> (method, policy, tokens-per-decode factor)."""
    out = {PLAIN: (VERIFY_REFERENCE, _Static(AR_ACTION, sink), 2)}
    if schema is not None:
        out[DECIDE] = (VERIFY_REFERENCE, _Decide(schema, latency, sink), 1)
    out.update({f"{VERIFY_REFERENCE}:{a}": (VERIFY_REFERENCE, _Static(a, sink), 1) for a in actions})
    out.update({f"{LOOKUP}:{n}": ("naive", _Lookup(n, sink), 1) for n in lookup_lengths})
    return out


@torch.inference_mode()
def measure_step_ratios(target: torch.nn.Module, draft: torch.nn.Module, vocab_size: int,
                        contexts: Sequence[Sequence[int]], latency: LatencyModel, actions: Sequence[Action],
                        lookup_lengths: Sequence[int] = (), schema: FeatureSchema | None = None, new_tokens: int = 16,
                        rounds: int = 4, sampling: Sampling = DEFAULT_SAMPLING, progress: str | None = None
                        ) -> tuple[StepRatios, dict]:
    """Decode every step class in ``rounds`` interleaved rounds (module docstring; round r starts from
    ``contexts[r % len(contexts)]``) and return ``(StepRatios, by_class)``: the ratios `decoding.pricing` prices with,
    and per class its steps, mean ratio and its spread over rounds (for the record)."""
    from tqdm.auto import tqdm

    if rounds < 1 or new_tokens < 1 or not contexts:
        raise ValueError("measure_step_ratios needs rounds >= 1, new_tokens >= 1 and at least one context")
    sink: list = []
    classes = _classes(price_actions(actions), lookup_lengths, schema, latency, sink)
    decoder = SpeculativeDecoder(target, draft, vocab_size)
    keys = [k for k in classes if k != PLAIN]
    steps: list[TimedStep] = []
    bar = tqdm(total=rounds * (len(keys) + 1 + len(keys) // PLAIN_EVERY), desc=progress, unit="decode",
               disable=progress is None, mininterval=1.0)
    try:
        for method, policy, _ in classes.values():  # warm-up, untimed
            decoder.generate(list(contexts[0]), 2, method, policy, sampling, seed=99)
        for r in range(rounds):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            plan = [k for i, k in enumerate(order) for k in ([PLAIN, k] if i % PLAIN_EVERY == 0 else [k])]
            for key in plan:
                method, policy, factor = classes[key]
                sink.clear()
                decoder.generate(list(contexts[r % len(contexts)]), factor * new_tokens, method, policy, sampling,
                                 seed=r)
                steps += [TimedStep(r, key, c, s) for c, s in sink]
                bar.update()
    finally:
        bar.close()
    return fit_step_ratios(steps, latency)


def fit_step_ratios(steps: Sequence[TimedStep], latency: LatencyModel) -> tuple[StepRatios, dict]:
    """`measure_step_ratios`' result from its timed steps (see there)."""
    plain_mean = {r: float(np.mean([s.seconds for s in steps if s.round == r and s.klass == PLAIN]))
                  for r in {s.round for s in steps}}
    by_class: dict[str, dict] = {}
    for key in dict.fromkeys(s.klass for s in steps):
        mine = [s for s in steps if s.klass == key]
        norm = np.array([s.seconds / plain_mean[s.round] for s in mine])
        per_round = [float(np.mean([s.seconds for s in mine if s.round == r]) / plain_mean[r])
                     for r in sorted({s.round for s in mine})]
        by_class[key] = {"steps": len(mine), "ratio": float(norm.mean()), "round_min": min(per_round),
                         "round_max": max(per_round), "mean_ms": float(np.mean([s.seconds for s in mine])) * 1e3}
    plain = [s for s in steps if s.klass == PLAIN]
    scale = float(np.mean([s.seconds / latency.t_p(s.context, 1) for s in plain]))
    context = float(np.mean([s.context for s in steps]))
    actions, lookup = {}, {}
    for key, row in by_class.items():
        kind, _, rest = key.partition(":")
        if kind == LOOKUP:
            lookup[int(rest)] = row["ratio"]
        elif rest:
            actions[Action(*(int(x) for x in rest.split(",")))] = row["ratio"]
    decide = by_class.get(DECIDE, {}).get("ratio", 1.0) - 1.0
    ratios = StepRatios(scale, max(decide, 0.0), context, actions, lookup)
    for key, row in by_class.items():  # what the tables alone would have said, for the record
        if key.startswith(f"{VERIFY_REFERENCE}:"):
            a = Action(*(int(x) for x in key.split(":")[1].split(",")))
            row["tables_ratio"] = float(model_ratio(latency, [context], [a])[0, 0])
    return ratios, by_class
