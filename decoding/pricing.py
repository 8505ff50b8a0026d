"""One price for a decoding step, and the decision that uses it (numpy only, no torch).

Every consumer prices steps here: training costs (`selector.data`), the exported runtime
(`export.runtime`), offline evaluation and the pricing audit (`evaluation`), collect's and train's oracle
reports. ``step_seconds`` is the one name for the seconds of one step; means are the one statistic
(throughput pays the mean step, right tail included).

Step classes (what a step is priced as):
- *plain*: no tree, one target pass on the root (autoregressive, or a declined step);
- *drafted* ``(method, action)``: the draft's forwards for the action's tree, one target pass, verification;
- *lookup* ``n``: a chain of n tokens copied from the context (`policies.lookup`): one target pass, no draft.

The price of a step at context length c (tokens before the root) is a ratio to a plain step at the same
context, linear in a few terms of its shape, with coefficients fitted on whole decoded steps
(`data_collection.step_prices`):

    plain(c)            = t_p(c, 1) * plain_scale
    step_seconds(c, a)  = plain(c) * (tables * model_ratio(c, a) + step + forward * F(a) + node * N(a))
                          [+ verify_offset(method, a)]
    lookup(c, n)        = plain(c) * (tables' * t_p(c, 1 + n) / t_p(c, 1) + step' + node' * n)

``model_ratio(c, a)`` is the forward tables' ratio of the action's forwards (`draft_forwards` and one target pass
of ``1 + L1 + K * L2`` tokens) to one plain target pass: it carries what the forwards cost and how that grows with
the context. ``F(a)`` counts the step's draft forwards and ``N(a) = L1 + K * L2`` its tree nodes: what the loop pays
around the forwards (sampling each forward's rows, the tree mask, verification per node, cache bookkeeping). The
coefficients (`StepRatios.tree` / ``chain``) are one least-squares fit over every decoded shape, so one noisy shape
does not set its own price, and a shape the profile never decoded is priced by the same line. Each decoded step is
divided by the plain steps decoded right before and after it, so the fit survives the machine's 2-3x speed phases:
a phase moves a plain and a drafted step alike. ``plain_scale`` brings the tables' one-token pass to a whole plain
step (sampling, bookkeeping). Without measured ratios the coefficients are (1, 0, 0, 0): the tables alone.

A step the policy decided (``select`` ran) also pays for deciding: the profile's ``feature_seconds`` of the policy's
feature set (the root's features and their vectorizing, `LatencyModel.deciding_seconds`) plus the selector's own
inference seconds (`pipeline.training_data.inference_seconds`); ``paper`` features add the draft's root step when the
step declines. Both are timed alone with the quietest-block median (`decoding.latency.quiet_seconds`): a
difference of whole steps, ~2% of one, is what a second process on the cores swamps (issue #43).

The decision rule (`decide`): the output of the highest predicted ``Ê / step_seconds`` (expected tokens per second)
among the valid ones; ties go to the first.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from .actions import Action, ActionSpace

FEATURE_MODES = (None, "target_only", "paper")
VERIFY_REFERENCE = "traversal"  # the method the measured steps verify with; others add their verify offset
PLAIN = "plain"  # step-class key of a plain step
LOOKUP = "lookup"  # step-class key prefix of a lookup chain: "lookup:3"


def action_arrays(actions: ActionSpace | Sequence[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(K, L1, L2)``, each ``[A]`` int64, in the order of ``actions``."""
    if isinstance(actions, ActionSpace):
        return actions.arrays()[:3]
    actions = list(actions)
    if not all(isinstance(a, Action) for a in actions):
        raise TypeError("actions must be an ActionSpace or a sequence of Action")
    return tuple(np.array([getattr(a, f) for a in actions], dtype=np.int64).reshape(-1) for f in ("K", "L1", "L2"))


def draft_forwards(actions: ActionSpace | Sequence[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The draft forwards the engine makes in one step of each action: ``(action index, context offset, rows)``,
    each ``[F]``, grouped by action. The root's one-row step at offset 0 (when the tree is not empty); the fed trunk
    nodes at offsets 1..L1 (the last trunk node is a leaf when ``L2 = 0``); ``L2 - 1`` rollout levels of K rows at
    offset ``1 + L1 + K * i`` (leaves are not fed)."""
    k, l1, l2 = action_arrays(actions)
    return _forward_layout(tuple(k.tolist()), tuple(l1.tolist()), tuple(l2.tolist()))


@functools.lru_cache(maxsize=64)
def _forward_layout(k: tuple[int, ...], l1: tuple[int, ...], l2: tuple[int, ...]):
    parts = []
    for a, (ka, l1a, l2a) in enumerate(zip(k, l1, l2, strict=True)):
        if l1a + ka * l2a > 0:
            parts.append((a, 0, 1))
        trunk = l1a if l2a > 0 else max(l1a - 1, 0)
        parts += [(a, j, 1) for j in range(1, trunk + 1)]
        parts += [(a, 1 + l1a + ka * i, ka) for i in range(max(l2a - 1, 0))]
    out = np.array(parts, dtype=np.int64).reshape(-1, 3)
    for col in out.T:
        col.setflags(write=False)
    return out[:, 0], out[:, 1], out[:, 2]


def model_ratio(latency, context_lengths, actions: ActionSpace | Sequence[Action]) -> np.ndarray:
    """``[L, A]``: the tables' seconds of each action's forwards over one plain target pass, at each context."""
    ls = np.asarray(context_lengths, dtype=np.float64).reshape(-1)
    k, l1, l2 = action_arrays(actions)
    idx, rel, rows = draft_forwards(actions)
    draft = np.zeros((k.shape[0], ls.size))  # [A, L]
    if idx.size:
        np.add.at(draft, idx, latency.t_q(rel[:, None] + ls[None, :], rows[:, None]))
    size = l1 + k * l2
    target = latency.t_p(np.broadcast_to(ls[:, None], (ls.size, k.shape[0])), np.broadcast_to(1 + size, (ls.size,
                                                                                                          k.shape[0])))
    return (draft.T + target) / np.asarray(latency.t_p(ls, 1)).reshape(-1, 1)


def plain_seconds(latency, context_lengths) -> np.ndarray:
    """``[L]`` seconds of one plain step at each context length."""
    ls = np.asarray(context_lengths, dtype=np.float64).reshape(-1)
    return np.asarray(latency.t_p(ls, 1)).reshape(-1) * latency.step_ratios.plain_scale


def tree_terms(latency, context_lengths, actions: ActionSpace | Sequence[Action]) -> np.ndarray:
    """``[L, A, 4]``: the terms a drafted step's ratio to a plain step is linear in (`StepRatios.TREE_TERMS`): the
    tables' ratio (`model_ratio`), 1 (the step's fixed work: tree, mask, verification), its draft forwards, its tree
    nodes ``L1 + K * L2``. All zero for the empty tree (a plain step is 1 by definition)."""
    k, l1, l2 = action_arrays(actions)
    idx, _, _ = draft_forwards(actions)
    forwards = np.bincount(idx, minlength=k.shape[0]).astype(np.float64)
    mr = model_ratio(latency, context_lengths, actions)
    tree = (l1 + k * l2 > 0).astype(np.float64)
    fixed = np.stack([tree, forwards, (l1 + k * l2).astype(np.float64)], axis=-1)  # [A, 3]
    out = np.concatenate([mr[..., None], np.broadcast_to(fixed, (*mr.shape, 3))], axis=-1)
    return out * tree[None, :, None]


def chain_terms(latency, context_lengths, lengths: Sequence[int]) -> np.ndarray:
    """``[L, N, 3]``: the terms a lookup chain's ratio to a plain step is linear in (`StepRatios.CHAIN_TERMS`): the
    tables' ratio of one target pass over ``1 + n`` tokens, 1, and ``n``."""
    ls = np.asarray(context_lengths, dtype=np.float64).reshape(-1)
    n = np.asarray(lengths, dtype=np.int64).reshape(-1)
    ratio = latency.t_p(ls[:, None], 1 + n[None, :]) / np.asarray(latency.t_p(ls, 1)).reshape(-1, 1)
    return np.stack([ratio, np.ones_like(ratio), np.broadcast_to(n.astype(np.float64), ratio.shape)], axis=-1)


def step_ratio(latency, context_lengths, actions: ActionSpace | Sequence[Action]) -> np.ndarray:
    """``[L, A]`` each action's step over a plain step at each context (module docstring): 1 for the empty tree."""
    ratio = tree_terms(latency, context_lengths, actions) @ latency.step_ratios.tree_vector()
    k, l1, l2 = action_arrays(actions)
    return np.where((l1 + k * l2 > 0)[None, :], ratio, 1.0)


def verify_offset(latency, method: str | None, actions: Sequence[Action]) -> np.ndarray:
    """``[A]`` seconds a step verified by ``method`` costs beyond one verified by `VERIFY_REFERENCE` (the profile's
    ``verify_seconds``); 0 for the empty tree, an unmeasured method or shape, and ``method`` None."""
    mine = latency.verify_of.get(method) if method is not None else None
    ref = latency.verify_of.get(VERIFY_REFERENCE, {})
    if not mine:
        return np.zeros(len(actions))
    return np.array([mine[a] - ref[a] if a.tree_size and a in mine and a in ref else 0.0 for a in actions])


def decide_seconds(latency, context_lengths, actions: Sequence[Action], features: str | None,
                   inference_seconds: float = 0.0) -> np.ndarray:
    """``[L, A]`` what deciding adds to a step (module docstring): 0 without features (a static policy)."""
    ls = np.asarray(context_lengths, dtype=np.float64).reshape(-1)
    if features not in FEATURE_MODES:
        raise ValueError(f"features must be one of {FEATURE_MODES}, got {features!r}")
    out = np.zeros((ls.size, len(actions)))
    if features is None:
        return out
    out += latency.deciding_seconds(features) + float(inference_seconds)
    if features == "paper":  # the draft's root step, also where the step declines
        empty = np.array([a.tree_size == 0 for a in actions])
        root = np.asarray(latency.t_q(ls, 1)).reshape(-1) * latency.step_ratios.plain_scale
        out[:, empty] += root[:, None]
    return out


def step_seconds(latency, context_lengths, actions: ActionSpace | Sequence[Action], methods: Sequence[str] | None = None,
                 features: str | None = None, inference_seconds: float = 0.0) -> np.ndarray:
    """``[L, A]`` (``methods`` None: verified by `VERIFY_REFERENCE`) or ``[L, M * A]`` (method-major) seconds of one
    step of each action at each context length; ``features`` / ``inference_seconds``: what deciding adds
    (`decide_seconds`). Computed once per distinct length: a per-root array of lengths may repeat them."""
    ctx = np.asarray(context_lengths, dtype=np.int64).reshape(-1)
    actions = list(actions)
    uniq, inverse = np.unique(ctx, return_inverse=True)
    if not uniq.size:
        return np.zeros((0, len(actions) * (len(methods) if methods else 1)))
    base = plain_seconds(latency, uniq)[:, None] * step_ratio(latency, uniq, actions)
    base += decide_seconds(latency, uniq, actions, features, inference_seconds)
    if methods:
        base = np.concatenate([base + verify_offset(latency, m, actions)[None, :] for m in methods], axis=1)
    return base[inverse.reshape(-1)]


def lookup_seconds(latency, context_lengths, lengths: Sequence[int]) -> np.ndarray:
    """``[L, N]`` seconds of one lookup chain step of each of ``lengths`` tokens at each context length."""
    ratio = chain_terms(latency, context_lengths, lengths) @ latency.step_ratios.chain_vector()
    return plain_seconds(latency, context_lengths)[:, None] * ratio


def decide(predicted: np.ndarray, seconds: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """The decision rule: per root, ``argmax_o predicted[o] / seconds[o]`` over the ``valid`` outputs (``[O]`` bool;
    default all; NaN predictions are never chosen). ``predicted`` ``[N, O]`` or ``[O]``, seconds broadcast to it."""
    predicted = np.asarray(predicted, dtype=np.float64)
    score = np.where(np.isfinite(predicted), predicted, -np.inf) / np.asarray(seconds, dtype=np.float64)
    if valid is not None:
        score = np.where(np.asarray(valid, dtype=bool), score, -np.inf)
    return np.argmax(score, axis=-1)


def step_class(action: Action, method: str | None, proposed: bool) -> str:
    """The class key of a step (module docstring): ``plain``, ``lookup:n`` (a chain the policy proposed: no draft
    forward, priced as a lookup chain) or ``<method>:K,L1,L2``."""
    if not action.tree_size:
        return PLAIN
    if proposed:
        return f"{LOOKUP}:{action.L1}"
    return f"{method}:{action}"


STEP_KINDS = (PLAIN, LOOKUP, "draft")  # the coarse grouping of step classes (`step_kind`)


def step_kind(klass: str) -> str:
    """The coarse kind of a step class (`step_class`): ``plain``, ``lookup`` (a chain proposed without the draft) or
    ``draft`` (a drafted tree)."""
    if klass == PLAIN:
        return PLAIN
    return LOOKUP if klass.startswith(f"{LOOKUP}:") else "draft"


def kind_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Steps per step class -> steps per `step_kind` (every kind present, 0 when none)."""
    out = dict.fromkeys(STEP_KINDS, 0)
    for klass, n in counts.items():
        out[step_kind(klass)] += n
    return out


def price_step(latency, step, features: str | None = None, inference_seconds: float = 0.0) -> float:
    """Seconds the model prices one decoded step (`decoding.policy.StepResult`) at; ``features``: the feature set of
    the selector that decides the policy's drafted and plain steps (None: a policy that computes no features), charged
    where ``select`` ran and no lookup chain was proposed."""
    c = [step.context_length]
    if step.proposed:  # the chain was proposed before any selector ran: no deciding to pay
        return float(lookup_seconds(latency, c, [step.action.L1])[0, 0])
    feats = features if step.selected else None
    method = step.method if step.action.tree_size else None
    return float(step_seconds(latency, c, [step.action], [method or VERIFY_REFERENCE], feats, inference_seconds)[0, 0])
