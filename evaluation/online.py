"""End-to-end evaluation: decode held-out prompts with every policy through the same decoder, and the offline
numbers of the same static policies from labels (the stage ``branchpoint evaluate``).

Terms:
- a *policy* (`policies.registry.BuiltPolicy`, built by the registry, named for the metrics): what decides each step's
  tree shape and method: autoregressive; *chain* speculative decoding (``naive`` on K = 1 chains) with its best
  static length; a method with its *best static* action; an exported selector (``auto``: it picks method and action,
  or restricted to one method).
- *best static*: the speculating action (tree size >= 1) of the highest path TPS on the TRAIN roots'
  labels with the latency model's step times (`throughput.best_static`; ALGORITHMS.md section 6). The
  chain's labels are those of a collected method that verifies a chain as naive (standard speculative sampling;
  `claims.chain_source`, from the registry's `chain_equivalent_methods()`) on K = 1 chains.
- *adaptive chain* (`ADAPTIVE_CHAIN`): ``naive`` chains whose length follows a moving average of recent
  accepted lengths (`policies.adaptive_chain.AdaptiveChain`, SGLang / vLLM style), started at the chain's best
  static length, at most the grid's longest chain.
- *threshold chain* (`THRESHOLD_CHAIN`): the confidence-threshold dynamic chain of HF assisted generation
  (`policies.threshold_chain.ThresholdChain`: draft up to N tokens, stop below a top-1 probability), ``naive``,
  with N and the threshold tuned on TRAIN prompts (`tune_threshold_chain`: highest tokens/s of a small grid).
- *prompt lookup* (`PROMPT_LOOKUP`): prompt lookup decoding (HF transformers' ``prompt_lookup_num_tokens``;
  `policies.lookup`): a chain copied from the context after the longest matching suffix, no draft model, a plain
  step where nothing matched; ``naive``; the chain's length and the shortest suffix tuned on TRAIN prompts
  (`tune_prompt_lookup`). The selector is also decoded with the same lookup first (``<selector>:lookup``): where a
  lookup matched it verifies that chain, elsewhere the selector decides.
- the *best static* of all (`BEST_STATIC`, the hardware-aware best static tree: Sequoia's idea with our
  latency model): of the methods' best static policies, the one of the highest path TPS on TRAIN.
- a *unit*: one TEST trajectory's prompt (at its own sampling setting) and one seed; every policy decodes
  every unit, in an order rotated per unit, so slow phases of a shared machine hit all policies alike.
- a *run*: one (unit, policy) decode: its tokens, seconds, block-efficiency counts and per-depth counts, and per step
  class its steps' measured and modelled seconds (`decoding.pricing.price_step`; the pricing audit,
  `evaluation.audit`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from decoding import pricing, throughput
from decoding.actions import AR_ACTION, AUTOREGRESSIVE, Action, ActionSpace
from decoding.latency import LatencyModel
from decoding.sampling import Sampling
from policies.registry import CHAIN_METHOD, BuiltPolicy, build_policy

from .claims import chain_source

if TYPE_CHECKING:
    from data_collection.offline_table import OfflineTable

CHAIN_STATIC = "chain"
ADAPTIVE_CHAIN = "adaptive_chain"
THRESHOLD_CHAIN = "threshold_chain"
PROMPT_LOOKUP = "prompt_lookup"
BEST_STATIC = "best_static"
LOOKUP_FIRST = "lookup"  # the suffix of a policy decoded behind prompt lookup's rule ("selector:auto:lookup")


def selector_policy(name: str, spec: dict, lookup: dict | None = None) -> BuiltPolicy:
    """The selector of ``spec`` (`policies.registry`: ``folder``, ``latency``, ``methods``), behind prompt lookup when
    ``lookup`` (``length``, ``min_ngram``) is given; reported as a selector either way."""
    built = build_policy("prompt_lookup", {**lookup, "fallback": {"name": "selector", **spec}}) if lookup else \
        build_policy("selector", spec)
    return built.named(name, "selector")


def best_statics(table: OfflineTable, methods: Sequence[str], chain: bool = True) -> dict[str, tuple[str, int]]:
    """``{policy name: (method, action index)}``: each method's best speculating static action on these (TRAIN)
    roots, and the chain's (`CHAIN_METHOD` on K = 1 / L2 = 0 actions, labels of `chain_source`); each priced as its
    method's steps (the table's ``seconds`` of every method and of `CHAIN_METHOD`)."""
    labels, T, space = table.labels, table.seconds, table.space
    size = np.array([a.tree_size for a in space])
    out: dict[str, tuple[str, int]] = {}
    src = chain_source(labels)
    if chain and src is not None:
        chain_ok = np.array([a.is_chain for a in space]) & (size > 0)
        E = np.where(chain_ok, labels[src], np.nan)
        out[CHAIN_STATIC] = (CHAIN_METHOD, throughput.best_static(E, T[CHAIN_METHOD]))
    for m in methods:
        E = np.where(size > 0, labels[m], np.nan)
        out[f"static:{m}"] = (m, throughput.best_static(E, T[m]))
    return out


def adaptive_chain_policy(space: ActionSpace, statics: dict[str, tuple[str, int]]) -> BuiltPolicy:
    """The adaptive chain over the grid's chains (``K = 1, L2 = 0``), started at the best static chain's length."""
    lengths = [a.L1 for a in space if a.is_chain and a.tree_size > 0]
    if not lengths:
        raise ValueError("the action grid has no chain (K = 1, L2 = 0, L1 >= 1) for the adaptive chain")
    start = space[statics[CHAIN_STATIC][1]].L1 if CHAIN_STATIC in statics else min(lengths)
    return build_policy(ADAPTIVE_CHAIN, {"max_length": max(lengths), "initial": min(max(start, 1), max(lengths))})


def threshold_chain_policy(max_length: int, threshold: float, name: str = THRESHOLD_CHAIN) -> BuiltPolicy:
    return build_policy(THRESHOLD_CHAIN, {"max_length": max_length, "threshold": threshold}).named(name)


def static_policy(name: str, method: str, action: Action) -> BuiltPolicy:
    """A method's static action, reported as ``chain`` when it is the chain's static (`CHAIN_STATIC`)."""
    built = build_policy("static", {"action": str(action), "method": method})
    return built.named(name, CHAIN_STATIC if name == CHAIN_STATIC else "static")


def prompt_lookup_policy(length: int, min_ngram: int, name: str = PROMPT_LOOKUP) -> BuiltPolicy:
    """Prompt lookup decoding alone (`policies.registry`: a lookup chain where a suffix of ``min_ngram`` to
    `policies.lookup.MAX_NGRAM` tokens matched, verified by ``naive``; a plain step elsewhere)."""
    return build_policy(PROMPT_LOOKUP, {"length": length, "min_ngram": min_ngram}).named(name)


def _tune(decoder, units: Sequence, grid: Sequence[tuple[dict, BuiltPolicy]], max_new_tokens: int,
          warmup: bool) -> dict:
    """Decode ``units`` (TRAIN prompts, seed 0) with every grid point's policy, each unit by all points in a rotated
    order (`decode_units`); returns the grid (its parameters, tokens, seconds, tokens/s) and the parameters of the
    point of the highest tokens/s (sum tokens / sum seconds) at the top level."""
    if not units or not grid:
        raise ValueError("tuning needs at least one prompt and one grid point")
    start = time.perf_counter()
    runs = decode_units(decoder, units, [p for _, p in grid], DecodePlan(max_new_tokens, (0,), warmup))
    rows = []
    for params, p in grid:
        mine = [r for r in runs if r["policy"] == p.name]
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
        rows.append({**params, "tokens": tokens, "seconds": seconds, "steps": sum(r["steps"] for r in mine),
                     "tokens_per_second": tokens / seconds if seconds > 0 else 0.0})
    best = max(rows, key=lambda r: r["tokens_per_second"])
    return {**{k: best[k] for k in grid[0][0]}, "grid": rows, "prompts": len(units),
            "max_new_tokens": int(max_new_tokens), "seconds": time.perf_counter() - start}


def tune_threshold_chain(decoder, units: Sequence, lengths: Sequence[int], thresholds: Sequence[float],
                         max_new_tokens: int, warmup: bool = True) -> dict:
    """N (``max_length``) and ``threshold`` of the threshold chain of the highest tokens/s on ``units`` (`_tune`)."""
    if not lengths or not thresholds:
        raise ValueError("tune_threshold_chain needs at least one prompt, one length and one threshold")
    grid = [({"max_length": int(n), "threshold": float(t)}, threshold_chain_policy(n, t, f"N={n},threshold={t}"))
            for n in lengths for t in thresholds]
    return _tune(decoder, units, grid, max_new_tokens, warmup)


def tune_prompt_lookup(decoder, units: Sequence, lengths: Sequence[int], min_ngrams: Sequence[int],
                       max_new_tokens: int, warmup: bool = True) -> dict:
    """``length`` and ``min_ngram`` of prompt lookup decoding of the highest tokens/s on ``units`` (`_tune`)."""
    if not lengths or not min_ngrams:
        raise ValueError("tune_prompt_lookup needs at least one prompt, one length and one n-gram size")
    grid = [({"length": int(n), "min_ngram": int(g)}, prompt_lookup_policy(n, g, f"N={n},ngram={g}"))
            for n in lengths for g in min_ngrams]
    return _tune(decoder, units, grid, max_new_tokens, warmup)


def best_static_name(offline_fit: dict[str, dict]) -> str | None:
    """The static policy of the highest path TPS in ``offline_tps`` of TRAIN roots: a speculating one
    (``static:<method>``) or autoregressive (the static action 1,0,0) where no speculating static beats it."""
    names = [n for n in offline_fit if n.startswith("static:") or n == AUTOREGRESSIVE]
    return max(names, key=lambda n: offline_fit[n]["tps"]) if names else None


def offline_tps(table: OfflineTable, statics: dict[str, tuple[str, int]]) -> dict[str, dict]:
    """Realized TPS (along the decode path) of autoregressive and of each static policy on these (TEST) roots, each
    priced as its method's steps, and the ratio to AR."""
    labels, T, space = table.labels, table.seconds, table.space
    n = len(table)
    if n == 0:
        return {}
    ar = float(n / next(iter(T.values()))[:, space.index(AR_ACTION)].sum())
    out = {AUTOREGRESSIVE: {"tps": ar, "vs_autoregressive": 1.0, "mean_label": 1.0}}
    src = chain_source(labels)
    for name, (method, a) in statics.items():
        E = labels[src if method == CHAIN_METHOD else method]
        tps = throughput.path_tps(E, T[method], np.full(n, a))
        out[name] = {"tps": tps, "vs_autoregressive": tps / ar, "mean_label": float(np.mean(E[:, a])),
                     "action": str(space[a])}
    return out


def _run_record(unit, seed: int, policy: BuiltPolicy, result, latency: LatencyModel | None) -> dict:
    """One decode (``result``: `engine.decoder.DecodeResult`) of ``unit`` as a row of the evaluation: its counts,
    times, step classes, and (with a profile) the pricing audit's per-class prices and deciding cost."""
    stats = result.stats
    choices = step_choices(result.steps)
    decided = deciding(result.steps, policy, latency)
    return {"policy": policy.name, "prompt_id": unit.prompt_id, "source": unit.source,
            "temperature": float(unit.temperature), "top_p": float(unit.top_p), "seed": int(seed),
            "tokens": int(stats.new_tokens), "seconds": float(stats.time_total),
            "decode_seconds": float(stats.decode_seconds), "emitted": int(stats.emitted),
            "steps": int(stats.steps), "depth_offered": list(stats.depth_offered),
            "depth_accepted": list(stats.depth_accepted), "choices": dict(choices),
            "time_s": {"draft": stats.time_draft, "target": stats.time_target, "verify": stats.time_verify,
                       "selector": stats.time_selector, "prefill": stats.time_prefill},
            "priced": priced(result.steps, policy, latency), **({"deciding": decided} if decided else {})}


def step_choices(steps: Sequence) -> Counter:
    """How often one run's steps (`decoding.policy.StepResult`) took each step class (`decoding.pricing.step_class`)."""
    return Counter(pricing.step_class(step.action, step.method, step.proposed) for step in steps)


def priced(steps: Sequence, policy: BuiltPolicy, latency: LatencyModel | None) -> dict[str, list[float]]:
    """Per step class (`decoding.pricing.step_class`) of one run's steps: ``[steps, measured seconds (prefill
    excluded), modelled seconds]`` (`decoding.pricing.price_step`, with what deciding costs ``policy``); {} without a
    profile."""
    out: dict[str, list[float]] = {}
    for step in steps if latency is not None else ():
        row = out.setdefault(pricing.step_class(step.action, step.method, step.proposed), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += step.timing.step_seconds
        row[2] += pricing.price_step(latency, step, policy.features, policy.inference_seconds)
    return out


def deciding(steps: Sequence, policy: BuiltPolicy, latency: LatencyModel | None) -> list[float] | None:
    """What deciding cost one run of a policy that computes features: ``[decided steps, measured seconds, modelled
    seconds]`` over the steps its selector decided (``select`` ran and no chain was proposed before it). Measured is
    the decoder's own timing of choosing at those steps (`decoding.policy.StepTiming.choose_seconds`: the features as
    the engine assembles them, then ``select``, cache-cold after the previous step's target pass); modelled is
    `decoding.pricing.decide_seconds` at each. None for a policy without features or without a profile."""
    if latency is None or policy.features is None:
        return None
    decided = [s for s in steps if s.selected and not s.proposed]
    modelled = sum(float(pricing.decide_seconds(latency, [s.context_length], [s.action], policy.features,
                                                policy.inference_seconds)[0, 0]) for s in decided)
    return [len(decided), sum(s.timing.choose_seconds for s in decided), modelled]


@dataclass(frozen=True)
class DecodePlan:
    """How long each run decodes, with which seeds, and whether one untimed warm-up run per policy comes first."""

    max_new_tokens: int
    seeds: tuple[int, ...] = (0,)
    warmup: bool = True


def decode_units(decoder, units: Sequence, policies: Sequence[BuiltPolicy], plan: DecodePlan,
                 progress: Callable[[int, int], None] | None = None, latency: LatencyModel | None = None) -> list[dict]:
    """Every policy decodes every (unit, seed) with `SpeculativeDecoder.generate`; one record per run (each step
    priced by ``latency`` when given: `priced`)."""
    max_new_tokens, seeds = plan.max_new_tokens, plan.seeds
    if plan.warmup and units:  # first calls pay one-time costs (allocator, kernels, ONNX session): untimed
        u = units[0]
        for p in policies:
            decoder.generate(list(u.prompt_ids), min(4, max_new_tokens), p.method, p.policy,
                             Sampling(u.temperature, u.top_p), 0)
    runs, total, done = [], len(units) * len(seeds) * len(policies), 0
    for k, (u, seed) in enumerate((u, s) for u in units for s in seeds):
        order = list(policies[k % len(policies):]) + list(policies[: k % len(policies)])
        for p in order:
            p.policy.reset()  # a stateful policy starts every run fresh
            res = decoder.generate(list(u.prompt_ids), max_new_tokens, p.method, p.policy,
                                   Sampling(u.temperature, u.top_p), int(seed))
            runs.append(_run_record(u, seed, p, res, latency))
            done += 1
            if progress is not None:
                progress(done, total)
    return runs


def depth_acceptance(runs: Sequence[dict]) -> dict[str, list[float]]:
    """Per policy: acceptance at depth d = 1.. (sum accepted / sum offered over its runs; NaN if never offered)."""
    by: dict[str, list[tuple[list[int], list[int]]]] = {}
    for r in runs:
        by.setdefault(r["policy"], []).append((r["depth_offered"], r["depth_accepted"]))
    out = {}
    for p, pairs in by.items():
        n = max(len(o) for o, _ in pairs)
        off = sum(np.pad(np.asarray(o, float), (0, n - len(o))) for o, _ in pairs)
        acc = sum(np.pad(np.asarray(a, float), (0, n - len(a))) for _, a in pairs)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[p] = (np.asarray(acc)[1:] / np.asarray(off)[1:]).tolist()
    return out


def chosen(runs: Sequence[dict], policy: str) -> dict[str, float]:
    """Fraction of the policy's steps per step class (`decoding.pricing.step_class`)."""
    counts: Counter = Counter()
    for r in runs:
        if r["policy"] == policy:
            counts.update(r["choices"])
    total = sum(counts.values())
    return {k: v / total for k, v in counts.most_common()} if total else {}


def choices_by(runs: Sequence[dict], policy: str, column: str, top: int = 3) -> dict[str, dict]:
    """Per value of ``column`` (temperature, source): where the policy speculates (fraction of its steps with
    a tree), its ``top`` most used step classes with their share of steps, and its steps."""
    by: dict[str, Counter] = {}
    for r in runs:
        if r["policy"] == policy:
            by.setdefault(str(r[column]), Counter()).update(r["choices"])
    out = {}
    for value, counts in sorted(by.items()):
        total = sum(counts.values())
        if not total:
            continue
        out[value] = {"steps": int(total), "speculate_fraction": 1.0 - counts.get(pricing.PLAIN, 0) / total,
                      "top": {k: v / total for k, v in counts.most_common(top)}}
    return out


class Progress:
    """A one-line progress report with an ETA (printed at most every ``every`` seconds)."""

    def __init__(self, label: str, every: float = 15.0) -> None:
        self.label, self.every, self.start, self.last = label, every, time.perf_counter(), 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter() - self.start
        if now - self.last >= self.every or done == total:
            self.last = now
            eta = now / done * (total - done) if done else float("nan")
            print(f"{self.label}: {done}/{total} runs, {now:.0f} s, ETA {eta:.0f} s", flush=True)
