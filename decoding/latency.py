"""The latency model ``T(c, a)`` of ALGORITHMS.md section 6: seconds of one decoding step of action a at a root.

Numpy only (no torch): the collection, training and export stages and the ONNX runtime all import it.

Terms:
- *context length* ``l``: the tokens before the root (`RootFeatures.context_length`); a forward "at
  context c" is one model call whose new query rows attend to ``c`` cached KV slots (plus themselves).
- *draft step* ``t_q(c, rows)``: one draft forward of ``rows`` query rows at context c, including the
  sampling transform of its rows to numpy (what `decoding.engine.drafting` does after each forward).
- *target pass* ``t_p(c, tokens)``: one target tree pass over ``tokens`` nodes (root included) at context
  c, including the sampling transform of all its rows (`decoding.engine.generate`, step 4).
- *feature cost* ``feature_seconds``: computing the section-5 scalars at one root from ``[V]`` rows
  already on the CPU.
- *step overhead* ``step_overhead``: what a whole decoding step of our engine costs beyond its forwards
  (verification, sampling, pruning both caches, bookkeeping), measured by decoding with the engine, dividing
  each round of decodes by how much slower than the tables the machine ran (its target passes' measured over
  modelled seconds) and subtracting the forwards' modelled times: ``plain`` for a step with no tree, ``speculative + per_forward *
  draft_forwards + per_node * tree_size`` for a step that drafted a tree
  (`data_collection.step_overhead.measure_step_overhead`). It also absorbs what the isolated grid timings get
  wrong about the same forwards inside the loop (a draft forward timed right after a 40-token target pass
  reads slower than in the engine), so it may be negative. A profile without it (an older file) charges
  nothing.
- *measured shapes* ``action_overhead``: for each shape the profile decoded (``"K,L1,L2"`` -> seconds), its own
  mean residual, which replaces the fitted overhead for that shape. The grid's cells carry structure the sum of
  forwards misses (on the 2-core CPU a 2-token target pass read slower than a 4-token one, and a one-row draft
  step right after a long target pass 40% slower than in the loop), so a fit over 8 shapes left residuals of
  -9 ms for 1,0,1 and -1 ms for 3,0,1 around its constant, enough to reverse which of the two a selector or the
  best static picks. Each measured shape's own mean (60-120 steps over four rounds; the plain step ~370) prices it as
  the engine runs it.
- *verification cost* ``verify_seconds``: ``{method: {"K,L1,L2": seconds}}``, one `VerificationMethod.verify` call
  on that shape's tree with rows of the pair's vocabulary (`data_collection.verify_cost`). The step overhead
  was measured with `VERIFY_REFERENCE` (Traversal), so a step verified by method m costs ``verify_offset(m, a)
  = verify_seconds[m][a] - verify_seconds[VERIFY_REFERENCE][a]`` more (0 for a shape or method not measured,
  and for the empty tree). On the 2-core CPU GBV's verification of a 2,0,1 tree took 5.2 ms against
  Traversal's 0.3 ms: the same tree, one in ten of a step's time.
The tables are measured on a grid by ``branchpoint profile`` (`data_collection.profile`) and saved as JSON.

Interpolation (`t_q`, `t_p`): piecewise linear in the context length, extrapolated linearly beyond the
grid from its end segments and clamped at >= the smallest value measured for that row/token count;
piecewise linear between profiled row/token counts, keeping the measured values as they are, also when
they are not monotonic (on a 2-core CPU a 16-token target pass was measured cheaper than an 8-token
one). Exact at grid points. Counts outside the profiled range are an error (extend the grid).

Pricing (`step_seconds`) counts the forwards our engine makes for action ``(K, L1, L2)`` at context l:
- the draft forward on the root: ``t_q(l, 1)``;
- the fed trunk nodes, one row each: node j (1-based) at context ``l + j``. With ``L2 > 0`` all ``L1``
  trunk nodes are fed (the last one is the branch node); with ``L2 = 0`` the last trunk node is a leaf;
- ``L2 - 1`` batched rollout forwards of K rows (the leaves are not fed); rollout level i (0-based) at
  context ``l + 1 + L1 + K * i`` (each level adds K slots to the draft cache);
- one target pass over ``1 + L1 + K * L2`` tokens at context l;
- the step overhead (above).
A tree of size 0 (``L1 = 0`` and ``L2 = 0``, e.g. autoregressive ``Action(1, 0, 0)``) is one target
pass on 1 token and no draft step. This is section 6's formula
``sum_{j<L1} t_q(l+j, 1) + sum_{j<L2} t_q(l+L1+j, K) + t_p(l, 1 + L1 + K*L2)`` with the same number
of draft forwards (L1 + L2 when L2 > 0, counting the root's), except that the branch node is fed once
with one row (its K children are drawn from its single q row), so the engine makes ``L1 + 1`` one-row
forwards and ``L2 - 1`` K-row forwards where the formula has L1 and L2; and each forward is priced
at the engine's actual cache length. (When the previous step accepted an unfed leaf, the engine feeds
it together with the root as 2 rows at context l - 1; priced as 1 row at l.)

`output_seconds_at` / `output_seconds_matrix` price a selector's outputs, method-major ``(method, action)``: each
method's block is `step_seconds_at` plus that method's `verify_offset`.

``features`` adds the cost of computing the selector's inputs: None (a static policy) adds nothing;
``"target_only"`` adds ``feature_seconds`` to every action; ``"paper"`` adds ``feature_seconds`` to
every action and the root's draft step ``t_q(l, 1)`` to actions with no tree (the draft features need
the root's draft step even when the selector declines to speculate).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .actions import Action, ActionSpace, parse_action
from .errors import UserInputError
from .files import write_json_atomic

FORMAT = "branchpoint-latency"
FORMAT_VERSION = 1
FEATURE_MODES = (None, "target_only", "paper")
_KEYS = ("contexts", "draft_rows", "draft_seconds", "target_tokens", "target_seconds", "feature_seconds", "meta")
OVERHEAD_KEYS = ("plain", "speculative", "per_forward", "per_node")  # step_overhead: seconds (module docstring)
VERIFY_REFERENCE = "traversal"  # the method the step-overhead decodes verify with (module docstring)


class LatencyProfileError(UserInputError):
    """A latency profile (file or arrays) is malformed; the message says what and where."""


def _numbers(name: str, values) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise LatencyProfileError(f"latency profile: {name} must be numbers in a regular (not ragged) array, "
                                  f"got {str(values)[:80]}") from None


def _grid(name: str, values, minimum: float, first: float | None = None) -> np.ndarray:
    arr = _numbers(name, values)
    if arr.ndim != 1 or arr.size == 0:
        raise LatencyProfileError(f"latency profile: {name} must be a non-empty list, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr[0] < minimum:
        raise LatencyProfileError(f"latency profile: {name} must be finite and >= {minimum}, got {arr.tolist()}")
    if np.any(np.diff(arr) <= 0):
        raise LatencyProfileError(f"latency profile: {name} must be strictly ascending, got {arr.tolist()}")
    if first is not None and arr[0] != first:
        raise LatencyProfileError(f"latency profile: {name} must start at {first:g} (measure it), got {arr.tolist()}")
    return arr


def _times(name: str, values, shape: tuple[int, int]) -> np.ndarray:
    arr = _numbers(name, values)
    if arr.shape != shape:
        raise LatencyProfileError(f"latency profile: {name} must have shape {list(shape)} "
                                  f"(contexts x counts), got {list(arr.shape)}")
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise LatencyProfileError(f"latency profile: {name}[{i}][{j}] = {float(arr[i, j])!r}; times must be finite "
                                  "and > 0 seconds (re-run `branchpoint profile`)")
    return arr


def _overhead(values) -> dict:
    """``step_overhead`` checked: {} (none measured) or every OVERHEAD_KEYS key, finite seconds (an overhead
    may be negative: the isolated forwards can time slower than inside the engine's loop)."""
    if not isinstance(values, dict):
        raise LatencyProfileError(f"latency profile: step_overhead must be a mapping, got {type(values).__name__}")
    if not values:
        return dict.fromkeys(OVERHEAD_KEYS, 0.0)
    if set(values) != set(OVERHEAD_KEYS):
        raise LatencyProfileError(f"latency profile: step_overhead must have the keys {list(OVERHEAD_KEYS)}, "
                                  f"got {sorted(values)}")
    out = {k: _numbers(f"step_overhead.{k}", values[k]) for k in OVERHEAD_KEYS}
    bad = [k for k, v in out.items() if v.ndim or not np.isfinite(v)]
    if bad:
        raise LatencyProfileError(f"latency profile: step_overhead.{bad[0]} must be a finite number of seconds, "
                                  f"got {values[bad[0]]!r}")
    return {k: float(v) for k, v in out.items()}


def _action_overhead(values, name: str = "action_overhead") -> dict[Action, float]:
    """``action_overhead`` checked: ``"K,L1,L2"`` keys of valid actions (`parse_action`), finite seconds; keyed by
    the parsed `Action`."""
    if not isinstance(values, dict):
        raise LatencyProfileError(f"latency profile: {name} must be a mapping, got {type(values).__name__}")
    out = {}
    for key, v in values.items():
        try:
            action = parse_action(key)
        except UserInputError as e:
            raise LatencyProfileError(f"latency profile: {name} key {key!r} is not an action ({e})") from None
        seconds = _numbers(f"{name}[{key}]", v)
        if seconds.ndim or not np.isfinite(seconds):
            raise LatencyProfileError(f"latency profile: {name}[{key}] must be a finite number of seconds, "
                                      f"got {v!r}")
        out[action] = float(seconds)
    return out


def _verify_seconds(values) -> dict[str, dict[Action, float]]:
    """``verify_seconds`` checked: ``{method: {"K,L1,L2": seconds}}`` with finite seconds >= 0; keyed by `Action`."""
    if not isinstance(values, dict) or not all(isinstance(v, dict) for v in values.values()):
        raise LatencyProfileError("latency profile: verify_seconds must map each method to {\"K,L1,L2\": seconds}, "
                                  f"got {values!r:.80}")
    out: dict[str, dict[Action, float]] = {}
    for method, by_shape in values.items():
        kept = _action_overhead(by_shape, f"verify_seconds[{method}]")  # the per-shape overheads' checks
        negative = [str(a) for a, v in kept.items() if v < 0]
        if negative:
            raise LatencyProfileError(f"latency profile: verify_seconds[{method}][{negative[0]}] is negative")
        out[str(method)] = kept
    return out


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.array(arr, dtype=np.float64)
    arr.setflags(write=False)
    return arr


def _segments(grid: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each x: the grid segment ``(i0, i1)`` holding it (end segments beyond the grid) and the weight
    of ``i1``; a one-point grid gives ``i0 = i1 = 0`` and weight 0 (constant)."""
    if grid.size == 1:
        zero = np.zeros(x.shape, dtype=np.int64)
        return zero, zero, np.zeros(x.shape)
    i0 = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, grid.size - 2)
    w = (x - grid[i0]) / (grid[i0 + 1] - grid[i0])
    return i0, i0 + 1, w


def _interpolate(contexts: np.ndarray, counts: np.ndarray, table: np.ndarray, floor: np.ndarray,
                 c, n, what: str, grid_key: str):
    """``table`` ``[C, N]`` at context ``c`` and count ``n`` (broadcast); see the module docstring."""
    c_arr, n_arr = np.broadcast_arrays(np.asarray(c, dtype=np.float64), np.asarray(n, dtype=np.float64))
    if np.any(~np.isfinite(c_arr)) or np.any(c_arr < 0):
        raise ValueError(f"{what}: context length must be finite and >= 0, got {c!r}")
    if np.any(n_arr < counts[0]) or np.any(n_arr > counts[-1]) or np.any(~np.isfinite(n_arr)):
        raise ValueError(f"{what}: {n!r} is outside the profiled range {counts[0]:g}..{counts[-1]:g}; "
                         f"extend profile.{grid_key} and re-run `branchpoint profile`")
    ci0, ci1, cw = _segments(contexts, c_arr)
    ni0, ni1, nw = _segments(counts, n_arr)

    def at_count(j: np.ndarray) -> np.ndarray:  # linear in context for count index j, clamped below
        v = table[ci0, j] * (1 - cw) + table[ci1, j] * cw
        return np.maximum(v, floor[j])

    out = at_count(ni0) * (1 - nw) + at_count(ni1) * nw
    return float(out) if out.ndim == 0 else out


def _action_arrays(actions: ActionSpace | Sequence[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(K, L1, L2)``, each ``[A]`` int64, in the order of ``actions``."""
    if isinstance(actions, ActionSpace):
        return actions.arrays()[:3]
    actions = list(actions)
    if not all(isinstance(a, Action) for a in actions):
        raise TypeError("actions must be an ActionSpace or a sequence of Action")
    return tuple(np.array([getattr(a, f) for a in actions], dtype=np.int64).reshape(-1) for f in ("K", "L1", "L2"))


def draft_forwards(l: int, actions: ActionSpace | Sequence[Action],  # noqa: E741
                   features: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The draft forwards the engine makes in one step of each action at context length ``l`` (see the
    module docstring): ``(action index, context, rows)``, each ``[F]``, grouped by action."""
    if features not in FEATURE_MODES:
        raise ValueError(f"features must be one of {FEATURE_MODES}, got {features!r}")
    k, l1, l2 = _action_arrays(actions)
    idx, rel, rows = _forward_layout(tuple(k.tolist()), tuple(l1.tolist()), tuple(l2.tolist()), features)
    return idx, l + rel, rows


@functools.lru_cache(maxsize=64)
def _forward_layout(k: tuple[int, ...], l1: tuple[int, ...], l2: tuple[int, ...],
                    features: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`draft_forwards` at ``l = 0`` (contexts relative to l), cached per action list."""
    parts = []
    for a, (ka, l1a, l2a) in enumerate(zip(k, l1, l2, strict=True)):
        if l1a + ka * l2a > 0 or features == "paper":  # the root's draft step
            parts.append((a, 0, 1))
        trunk = l1a if l2a > 0 else max(l1a - 1, 0)  # fed trunk nodes, one row each
        parts += [(a, j, 1) for j in range(1, trunk + 1)]
        parts += [(a, 1 + l1a + ka * i, ka) for i in range(max(l2a - 1, 0))]  # rollout levels; leaves not fed
    out = np.array(parts, dtype=np.int64).reshape(-1, 3)
    for col in out.T:
        col.setflags(write=False)
    return out[:, 0], out[:, 1], out[:, 2]


class BlockMemo:
    """Prices kept per context length, computed a block of ``block`` lengths at a time: a decode asks for every
    length once, in order, so one vectorized pricing of ``c .. c + block - 1`` serves the next ``block`` asks.
    ``price_block(lengths)`` gets the int64 lengths ``[block]`` and returns one entry per length (a list or an
    array's rows); `get` hands back the kept entry itself (copy a mutable one before giving it out). The memo
    is emptied before a block is added once it holds more than ``max_entries`` lengths (a long run of decodes
    does not grow it without bound)."""

    def __init__(self, price_block, block: int = 64, max_entries: int = 4096) -> None:
        self.price_block = price_block
        self.block = block
        self.max_entries = max_entries
        self._kept: dict[int, object] = {}  # context length -> its entry

    def get(self, c: int):
        """The entry of context length ``c`` (pricing the block that starts at ``c`` when it is not kept)."""
        kept = self._kept
        if c not in kept:
            if len(kept) > self.max_entries:
                kept.clear()
            lengths = np.arange(c, c + self.block)
            kept.update(zip(lengths.tolist(), self.price_block(lengths), strict=True))
        return kept[c]


@dataclass(frozen=True, eq=False)
class LatencyModel:
    """Profiled step times and their interpolation (see the module docstring)."""

    contexts: np.ndarray  # [C] profiled context lengths, ascending
    draft_rows: np.ndarray  # [R] profiled draft query-row counts, ascending, starts at 1
    draft_seconds: np.ndarray  # [C, R] one draft forward with that many query rows at that context
    target_tokens: np.ndarray  # [N] profiled target tree-pass token counts (root included), ascending, starts at 1
    target_seconds: np.ndarray  # [C, N] one target tree pass
    feature_seconds: float  # computing the section-5 scalars at one root (rows already on CPU)
    meta: dict = field(default_factory=dict)  # machine, cpu, threads, device, versions, model specs, settings, date
    step_overhead: dict = field(default_factory=dict)  # OVERHEAD_KEYS -> seconds; {} = none measured (0)
    action_overhead: dict = field(default_factory=dict)  # "K,L1,L2" -> seconds: measured shapes (module docstring)
    verify_seconds: dict = field(default_factory=dict)  # method -> {"K,L1,L2" -> seconds}; {} = none measured (0)

    def __post_init__(self) -> None:
        contexts = _grid("contexts", self.contexts, 0)
        rows = _grid("draft_rows", self.draft_rows, 1, first=1)
        tokens = _grid("target_tokens", self.target_tokens, 1, first=1)
        draft = _times("draft_seconds", self.draft_seconds, (contexts.size, rows.size))
        target = _times("target_seconds", self.target_seconds, (contexts.size, tokens.size))
        try:
            feature = float(self.feature_seconds)
        except (TypeError, ValueError):
            raise LatencyProfileError(f"latency profile: feature_seconds must be a number, "
                                      f"got {self.feature_seconds!r}") from None
        if not (math.isfinite(feature) and feature > 0):
            raise LatencyProfileError(f"latency profile: feature_seconds must be finite and > 0, got {feature!r}")
        if not isinstance(self.meta, dict):
            raise LatencyProfileError(f"latency profile: meta must be a mapping, got {type(self.meta).__name__}")
        for name, value in (("contexts", contexts), ("draft_rows", rows), ("target_tokens", tokens),
                            ("draft_seconds", draft), ("target_seconds", target)):
            object.__setattr__(self, name, _readonly(value))
        object.__setattr__(self, "feature_seconds", feature)
        object.__setattr__(self, "step_overhead", _overhead(self.step_overhead))
        overhead_of = _action_overhead(self.action_overhead)  # Action -> seconds (the pricing reads this one)
        object.__setattr__(self, "_overhead_of", overhead_of)
        object.__setattr__(self, "action_overhead", {str(a): v for a, v in overhead_of.items()})  # JSON form
        verify_of = _verify_seconds(self.verify_seconds)  # method -> {Action -> seconds}
        object.__setattr__(self, "_verify_of", verify_of)
        object.__setattr__(self, "verify_seconds", {m: {str(a): v for a, v in by.items()} for m, by in verify_of.items()})
        object.__setattr__(self, "_draft_floor", draft.min(axis=0))  # [R]
        object.__setattr__(self, "_target_floor", target.min(axis=0))  # [N]
        object.__setattr__(self, "_root_memo", BlockMemo(self._root_block))  # context length -> root_step_seconds

    # --- interpolation ------------------------------------------------------------------------------------
    def t_q(self, l, rows) -> float | np.ndarray:  # noqa: E741 (l: context length, as in ALGORITHMS.md)
        """Seconds of one draft forward of ``rows`` query rows at context ``l`` (broadcast over arrays)."""
        return _interpolate(self.contexts, self.draft_rows, self.draft_seconds, self._draft_floor, l, rows,
                            "t_q: draft rows", "draft_rows")

    def t_p(self, l, tokens) -> float | np.ndarray:  # noqa: E741
        """Seconds of one target tree pass over ``tokens`` nodes (root included) at context ``l``."""
        return _interpolate(self.contexts, self.target_tokens, self.target_seconds, self._target_floor, l, tokens,
                            "t_p: target tokens", "target_tokens")

    def root_step_seconds(self, l: int) -> tuple[float, float]:  # noqa: E741
        """``(t_q(l, 1), t_p(l, 1))``: one draft and one target step at context ``l`` (the latency features),
        interpolated for a block of context lengths at once and kept (`BlockMemo`)."""
        return self._root_memo.get(l)

    def _root_block(self, lengths: np.ndarray) -> list[tuple[float, float]]:
        """``(t_q, t_p)`` of one-row / one-token steps at each of ``lengths`` (for `root_step_seconds`)."""
        ls = lengths.astype(np.float64)
        return list(zip(self.t_q(ls, 1).tolist(), self.t_p(ls, 1).tolist(), strict=True))

    # --- T(c, a) ------------------------------------------------------------------------------------------
    def step_seconds(self, l: int, actions: ActionSpace | Sequence[Action],  # noqa: E741
                     features: str | None = None) -> np.ndarray:
        """``[A]`` seconds of one decoding step of each action at context length ``l``: ``T(c, a)``."""
        return self.step_seconds_at(np.array([l]), actions, features)[0]

    def step_seconds_at(self, context_lengths, actions: ActionSpace | Sequence[Action],
                        features: str | None = None) -> np.ndarray:
        """``[L, A]`` T(c, a) at each of ``L`` context lengths, vectorized over them (the same sums, in the same
        order, as one `step_seconds` call per length)."""
        return self.step_parts_at(context_lengths, actions, features)[2]

    def step_parts_at(self, context_lengths, actions: ActionSpace | Sequence[Action], features: str | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(draft, target, total)``, each ``[L, A]``: the draft forwards' seconds, the target pass's, and the whole
        `step_seconds_at` (which adds the step overhead and the feature cost to their sum); what the online
        calibration scales part by part (`decoding.calibration`)."""
        ls = np.asarray(context_lengths, dtype=np.float64).reshape(-1)
        k, l1, l2 = _action_arrays(actions)
        num = k.shape[0]
        idx, rel, rows = draft_forwards(0, actions, features)
        draft = np.zeros((num, ls.size))  # [A, L]; forwards are added in order, as np.bincount adds them
        if idx.size:
            np.add.at(draft, idx, self.t_q(rel[:, None] + ls[None, :], rows[:, None]))
        draft = draft.T.copy()  # [L, A]
        size = l1 + k * l2
        target = self.t_p(np.broadcast_to(ls[:, None], draft.shape), np.broadcast_to(1 + size, draft.shape))
        seconds = draft + target
        o = self.step_overhead
        forwards = np.bincount(draft_forwards(0, actions)[0], minlength=num)  # the action's own draft forwards
        overhead = np.where(size > 0, o["speculative"] + o["per_forward"] * forwards + o["per_node"] * size,
                            o["plain"])
        if self._overhead_of:  # measured shapes: their own residual
            overhead = np.array([self._overhead_of.get(a, fit) for a, fit in zip(actions, overhead.tolist(),
                                                                                 strict=True)])
        seconds += overhead
        if features is not None:
            seconds += self.feature_seconds
        return draft, np.asarray(target, dtype=np.float64), seconds

    def verify_offset(self, method: str | None, actions: ActionSpace | Sequence[Action]) -> np.ndarray:
        """``[A]`` seconds a step verified by ``method`` costs beyond one verified by `VERIFY_REFERENCE` (module
        docstring); 0 for the empty tree, an unmeasured method or shape, and ``method`` None."""
        mine = self._verify_of.get(method) if method is not None else None
        ref = self._verify_of.get(VERIFY_REFERENCE, {})
        if not mine:
            return np.zeros(len(actions))
        return np.array([mine[a] - ref[a] if a.tree_size and a in mine and a in ref else 0.0 for a in actions])

    def output_seconds_at(self, context_lengths, actions: ActionSpace | Sequence[Action], methods: Sequence[str],
                          features: str | None = None) -> np.ndarray:
        """``[L, M * A]`` T of every (method, action) output, method-major: `step_seconds_at` plus each method's
        `verify_offset`."""
        return self._with_verify(self.step_seconds_at(context_lengths, actions, features), actions, methods)

    def output_seconds_matrix(self, context_lengths, actions: ActionSpace | Sequence[Action], methods: Sequence[str],
                              features: str | None = None) -> np.ndarray:
        """``[N, M * A]`` `output_seconds_at` at each root's context length."""
        return self._with_verify(self.step_seconds_matrix(context_lengths, actions, features), actions, methods)

    def _with_verify(self, step_seconds: np.ndarray, actions, methods: Sequence[str]) -> np.ndarray:
        """``[R, A]`` step seconds -> ``[R, M * A]``: each method's `verify_offset` added, method-major."""
        return np.concatenate([step_seconds + self.verify_offset(m, actions)[None, :] for m in methods], axis=1)

    def step_seconds_matrix(self, context_lengths, actions: ActionSpace | Sequence[Action],
                            features: str | None = None) -> np.ndarray:
        """``[N, A]`` T(c, a) at each root's context length (`step_seconds_at`, once per distinct length)."""
        ctx = np.asarray(context_lengths, dtype=np.int64).reshape(-1)
        uniq, inverse = np.unique(ctx, return_inverse=True)
        if not uniq.size:
            return np.zeros((0, len(actions)))
        return self.step_seconds_at(uniq, actions, features)[inverse.reshape(-1)]

    # --- persistence --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "contexts": self.contexts.tolist(), "draft_rows": self.draft_rows.tolist(),
            "draft_seconds": self.draft_seconds.tolist(), "target_tokens": self.target_tokens.tolist(),
            "target_seconds": self.target_seconds.tolist(), "feature_seconds": self.feature_seconds,
            "step_overhead": dict(self.step_overhead), "action_overhead": dict(self.action_overhead),
            "verify_seconds": {m: dict(by) for m, by in self.verify_seconds.items()}, "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = "latency profile") -> LatencyModel:
        if not isinstance(d, dict):
            raise LatencyProfileError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("format", FORMAT) != FORMAT or d.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
            raise LatencyProfileError(f"{where}: format {d.get('format')!r} version {d.get('format_version')!r}, "
                                      f"expected {FORMAT!r} version {FORMAT_VERSION}; re-run `branchpoint profile`")
        missing = [k for k in _KEYS if k not in d]
        if missing:
            raise LatencyProfileError(f"{where}: missing keys {missing}; re-run `branchpoint profile`")
        try:
            return cls(**{k: d[k] for k in _KEYS}, step_overhead=d.get("step_overhead") or {},
                       action_overhead=d.get("action_overhead") or {}, verify_seconds=d.get("verify_seconds") or {})
        except LatencyProfileError as e:
            raise LatencyProfileError(str(e).replace("latency profile", where, 1)) from None

    def save(self, path: str | Path) -> Path:
        """Write the JSON to a temp file next to ``path``, then rename it into place."""
        return write_json_atomic(path, self.to_dict(), sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> LatencyModel:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no latency profile at {path}; build it with `branchpoint profile` "
                                    "(or `dvc repro profile`)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise LatencyProfileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(raw, where=str(path))
