"""The latency profile of a pair on one machine (ALGORITHMS.md section 6): forward tables and measured step ratios.

Numpy only (no torch): the collection, training and export stages and the ONNX runtime all import it. What a
step costs is priced by `decoding.pricing` from this profile; this module holds the measurements and their
interpolation.

Terms:
- *context length* ``l``: the tokens before the root (`RootFeatures.context_length`); a forward "at
  context c" is one model call whose new query rows attend to ``c`` cached KV slots (plus themselves).
- *draft step* ``t_q(c, rows)``: one draft forward of ``rows`` query rows at context c, including the
  sampling transform of its rows to numpy (what `engine.drafting` does after each forward).
- *target pass* ``t_p(c, tokens)``: one target tree pass over ``tokens`` nodes (root included) at context
  c, including the sampling transform of all its rows.
- *feature cost* ``feature_seconds``: ``{feature set: seconds}``, what deciding computes at one root before the
  selector's network runs (the root's features and `FeatureSchema.vectorize`), timed alone with the quietest-block
  median (`data_collection.forward_tables.time_deciding`): the price of deciding, which load does not move.
- *step ratios* (`StepRatios`, ``step_ratios`` in the file): whole decoded steps measured in the engine's loop as
  ratios to the plain steps decoded right around them (`data_collection.step_prices`), fitted over shapes: the
  coefficients of a drafted step's ratio (``tree``, verified by Traversal) and of a lookup chain's (``chain``) in the
  terms of `decoding.pricing`, and ``plain_scale`` (a whole plain step over the tables' one-token pass).
- *verification cost* ``verify_seconds``: ``{method: {"K,L1,L2": seconds}}``, one `VerificationMethod.verify` call
  on that shape's tree with rows of the pair's vocabulary (`data_collection.verify_cost`).
The tables are measured on a grid by ``branchpoint profile`` (`data_collection.forward_tables`) and saved as JSON.

Interpolation (`t_q`, `t_p`): piecewise linear in the context length, extrapolated linearly beyond the
grid from its end segments and clamped at >= the smallest value measured for that row/token count;
piecewise linear between profiled row/token counts, keeping the measured values as they are, also when
they are not monotonic (on a 2-core CPU a 16-token target pass was measured cheaper than an 8-token
one). Exact at grid points. Counts outside the profiled range are an error (extend the grid).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .actions import Action, parse_action
from .errors import UserInputError
from .files import write_json_atomic

FORMAT = "branchpoint-latency"
FORMAT_VERSION = 4  # 4: feature_seconds per feature set, no decide_ratio (3: step ratios fitted over shapes)
_KEYS = ("contexts", "draft_rows", "draft_seconds", "target_tokens", "target_seconds", "feature_seconds", "meta")


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


def _by_action(values, name: str) -> dict[Action, float]:
    """``{"K,L1,L2": seconds}`` checked: ``"K,L1,L2"`` keys of valid actions (`parse_action`), finite seconds; keyed by
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


def _feature_seconds(values) -> dict[str, float]:
    """``feature_seconds`` checked: a mapping of feature-set names to finite seconds > 0."""
    if not isinstance(values, dict):
        raise LatencyProfileError(f"latency profile: feature_seconds must map feature sets to seconds, got "
                                  f"{str(values)[:80]}; re-run `branchpoint profile`")
    out = {}
    for name, v in values.items():
        try:
            out[str(name)] = float(v)
        except (TypeError, ValueError):
            raise LatencyProfileError(f"latency profile: feature_seconds[{name!r}] must be a number, got {v!r}") from None
        if not (math.isfinite(out[name]) and out[name] > 0):
            raise LatencyProfileError(f"latency profile: feature_seconds[{name!r}] must be finite and > 0, got {v!r}")
    return out


def _verify_seconds(values) -> dict[str, dict[Action, float]]:
    """``verify_seconds`` checked: ``{method: {"K,L1,L2": seconds}}`` with finite seconds >= 0; keyed by `Action`."""
    if not isinstance(values, dict) or not all(isinstance(v, dict) for v in values.values()):
        raise LatencyProfileError("latency profile: verify_seconds must map each method to {\"K,L1,L2\": seconds}, "
                                  f"got {values!r:.80}")
    out: dict[str, dict[Action, float]] = {}
    for method, by_shape in values.items():
        kept = _by_action(by_shape, f"verify_seconds[{method}]")
        negative = [str(a) for a, v in kept.items() if v < 0]
        if negative:
            raise LatencyProfileError(f"latency profile: verify_seconds[{method}][{negative[0]}] is negative")
        out[str(method)] = kept
    return out


TREE_TERMS = ("tables", "step", "forward", "node")  # a drafted step's ratio terms (`decoding.pricing.tree_terms`)
CHAIN_TERMS = ("tables", "step", "node")  # a lookup chain's (`decoding.pricing.chain_terms`)


def _coefficients(d, name: str, terms: tuple[str, ...]) -> dict:
    if d is None:
        return {t: float(t == "tables") for t in terms}
    if not isinstance(d, dict) or set(d) != set(terms):
        raise LatencyProfileError(f"latency profile: step_ratios.{name} must map {list(terms)} to numbers, got {d!r}; "
                                  "re-run `branchpoint profile`")
    try:
        out = {t: float(d[t]) for t in terms}
    except (TypeError, ValueError):
        raise LatencyProfileError(f"latency profile: step_ratios.{name} must be numbers, got {d!r}") from None
    if not all(math.isfinite(v) and v >= 0 for v in out.values()):
        raise LatencyProfileError(f"latency profile: step_ratios.{name} must be finite and >= 0 (a fit of costs), got "
                                  f"{out}; re-run `branchpoint profile`")
    return out


def timed_calls(fn: Callable[[], object], reps: int, warmup: int = 0) -> np.ndarray:
    """``[reps]`` seconds of consecutive ``fn()`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = np.empty(reps)
    for i in range(reps):
        start = time.perf_counter()
        fn()
        times[i] = time.perf_counter() - start
    return times


def quiet_seconds(fn: Callable[[], object], reps: int = 200, blocks: int = 5, warmup: int = 3) -> float:
    """Seconds of one ``fn()`` as a quiet machine pays it: the smallest of ``blocks`` medians of ``reps / blocks``
    consecutive timed calls (`timed_calls`, after ``warmup`` untimed ones; fewer blocks when ``reps < blocks``).
    Load only adds time, so the quietest block is the machine's own speed, and a median ignores the spikes inside
    it: the project's statistic for the small costs a busy machine would swamp (deciding, the selector's forward).
    One mean of in-process timings read 0.24 ms on a quiet machine and 16 ms next to a decode (issue #43)."""
    if reps < 1 or blocks < 1:
        raise ValueError(f"quiet_seconds needs reps >= 1 and blocks >= 1, got reps {reps}, blocks {blocks}")
    times = timed_calls(fn, reps, warmup)
    return float(min(np.median(b) for b in np.array_split(times, min(blocks, reps))))


@dataclass(frozen=True)
class StepRatios:
    """Whole decoded steps as ratios to a plain step (module docstring): the coefficients `decoding.pricing` prices
    with. Empty (`StepRatios()`): the forward tables alone price every step."""

    plain_scale: float = 1.0  # a whole plain step over the tables' one-token target pass at the same contexts
    context: float = 256.0  # mean context length of the measured steps
    tree: dict = field(default_factory=lambda: _coefficients(None, "tree", TREE_TERMS))  # TREE_TERMS -> coefficient
    chain: dict = field(default_factory=lambda: _coefficients(None, "chain", CHAIN_TERMS))  # CHAIN_TERMS -> coefficient

    def tree_vector(self) -> np.ndarray:
        return np.array([self.tree[t] for t in TREE_TERMS])

    def chain_vector(self) -> np.ndarray:
        return np.array([self.chain[t] for t in CHAIN_TERMS])

    @classmethod
    def from_dict(cls, d) -> StepRatios:
        if not isinstance(d, dict):
            raise LatencyProfileError(f"latency profile: step_ratios must be a mapping, got {type(d).__name__}")
        if not d:
            return cls()
        try:
            scalars = {k: float(d[k]) for k in ("plain_scale", "context")}
        except (KeyError, TypeError, ValueError) as e:
            raise LatencyProfileError(f"latency profile: step_ratios needs plain_scale and context as numbers "
                                      f"({e!r}); re-run `branchpoint profile`") from None
        if not all(np.isfinite(v) for v in scalars.values()) or scalars["plain_scale"] <= 0:
            raise LatencyProfileError("latency profile: step_ratios must be finite, with a positive plain_scale; "
                                      "re-run `branchpoint profile`")
        return cls(**scalars, tree=_coefficients(d.get("tree"), "tree", TREE_TERMS),
                   chain=_coefficients(d.get("chain"), "chain", CHAIN_TERMS))

    def to_dict(self) -> dict:
        return {"plain_scale": self.plain_scale, "context": self.context,
                "tree": dict(self.tree), "chain": dict(self.chain)}


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


class _Table:
    """A profiled time table ``seconds [C, N]`` over ``contexts [C]`` x ``counts [N]``, its per-count floor over
    contexts, and the names its errors use (``what``, the profile's grid key)."""

    def __init__(self, contexts: np.ndarray, counts: np.ndarray, seconds: np.ndarray, what: str, grid_key: str):
        self.contexts, self.counts, self.seconds = contexts, counts, seconds
        self.floor = seconds.min(axis=0)  # [N]
        self.what, self.grid_key = what, grid_key


def _interpolate(t: _Table, c, n):
    """``t.seconds`` at context ``c`` and count ``n`` (broadcast); see the module docstring."""
    contexts, counts, table, floor = t.contexts, t.counts, t.seconds, t.floor
    c_arr, n_arr = np.broadcast_arrays(np.asarray(c, dtype=np.float64), np.asarray(n, dtype=np.float64))
    if np.any(~np.isfinite(c_arr)) or np.any(c_arr < 0):
        raise ValueError(f"{t.what}: context length must be finite and >= 0, got {c!r}")
    if np.any(n_arr < counts[0]) or np.any(n_arr > counts[-1]) or np.any(~np.isfinite(n_arr)):
        raise ValueError(f"{t.what}: {n!r} is outside the profiled range {counts[0]:g}..{counts[-1]:g}; "
                         f"extend profile.{t.grid_key} and re-run `branchpoint profile`")
    ci0, ci1, cw = _segments(contexts, c_arr)
    ni0, ni1, nw = _segments(counts, n_arr)

    def at_count(j: np.ndarray) -> np.ndarray:  # linear in context for count index j, clamped below
        v = table[ci0, j] * (1 - cw) + table[ci1, j] * cw
        return np.maximum(v, floor[j])

    out = at_count(ni0) * (1 - nw) + at_count(ni1) * nw
    return float(out) if out.ndim == 0 else out


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
    """Profiled forward times, their interpolation and the measured step ratios (see the module docstring)."""

    contexts: np.ndarray  # [C] profiled context lengths, ascending
    draft_rows: np.ndarray  # [R] profiled draft query-row counts, ascending, starts at 1
    draft_seconds: np.ndarray  # [C, R] one draft forward with that many query rows at that context
    target_tokens: np.ndarray  # [N] profiled target tree-pass token counts (root included), ascending, starts at 1
    target_seconds: np.ndarray  # [C, N] one target tree pass
    # feature set -> seconds deciding computes at one root before the selector's network ({}: none measured)
    feature_seconds: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # machine, cpu, threads, device, versions, model specs, settings, date
    step_ratios: StepRatios | dict = field(default_factory=StepRatios)  # whole steps over a plain step
    verify_seconds: dict = field(default_factory=dict)  # method -> {"K,L1,L2" -> seconds}; {} = none measured (0)

    def __post_init__(self) -> None:
        contexts = _grid("contexts", self.contexts, 0)
        rows = _grid("draft_rows", self.draft_rows, 1, first=1)
        tokens = _grid("target_tokens", self.target_tokens, 1, first=1)
        draft = _times("draft_seconds", self.draft_seconds, (contexts.size, rows.size))
        target = _times("target_seconds", self.target_seconds, (contexts.size, tokens.size))
        feature = _feature_seconds(self.feature_seconds)
        if not isinstance(self.meta, dict):
            raise LatencyProfileError(f"latency profile: meta must be a mapping, got {type(self.meta).__name__}")
        for name, value in (("contexts", contexts), ("draft_rows", rows), ("target_tokens", tokens),
                            ("draft_seconds", draft), ("target_seconds", target)):
            object.__setattr__(self, name, _readonly(value))
        object.__setattr__(self, "feature_seconds", feature)
        if not isinstance(self.step_ratios, StepRatios):
            object.__setattr__(self, "step_ratios", StepRatios.from_dict(self.step_ratios))
        verify_of = _verify_seconds(self.verify_seconds)  # method -> {Action -> seconds} (what pricing reads)
        object.__setattr__(self, "verify_of", verify_of)
        object.__setattr__(self, "verify_seconds", {m: {str(a): v for a, v in by.items()} for m, by in verify_of.items()})
        object.__setattr__(self, "_draft_table", _Table(self.contexts, self.draft_rows, self.draft_seconds,
                                                        "t_q: draft rows", "draft_rows"))
        object.__setattr__(self, "_target_table", _Table(self.contexts, self.target_tokens, self.target_seconds,
                                                         "t_p: target tokens", "target_tokens"))
        object.__setattr__(self, "_root_memo", BlockMemo(self._root_block))  # context length -> root_step_seconds

    # --- interpolation ------------------------------------------------------------------------------------
    def deciding_seconds(self, feature_set: str) -> float:
        """Seconds deciding computes at one root with ``feature_set`` before the selector's network runs."""
        if feature_set not in self.feature_seconds:
            raise LatencyProfileError(f"latency profile: no feature cost for feature set {feature_set!r} (measured: "
                                      f"{sorted(self.feature_seconds) or 'none'}); re-run `branchpoint profile`")
        return self.feature_seconds[feature_set]

    def t_q(self, l, rows) -> float | np.ndarray:  # noqa: E741 (l: context length, as in ALGORITHMS.md)
        """Seconds of one draft forward of ``rows`` query rows at context ``l`` (broadcast over arrays)."""
        return _interpolate(self._draft_table, l, rows)

    def t_p(self, l, tokens) -> float | np.ndarray:  # noqa: E741
        """Seconds of one target tree pass over ``tokens`` nodes (root included) at context ``l``."""
        return _interpolate(self._target_table, l, tokens)

    def root_step_seconds(self, l: int) -> tuple[float, float]:  # noqa: E741
        """``(t_q(l, 1), t_p(l, 1))``: one draft and one target step at context ``l`` (the latency features),
        interpolated for a block of context lengths at once and kept (`BlockMemo`)."""
        return self._root_memo.get(l)

    def _root_block(self, lengths: np.ndarray) -> list[tuple[float, float]]:
        """``(t_q, t_p)`` of one-row / one-token steps at each of ``lengths`` (for `root_step_seconds`)."""
        ls = lengths.astype(np.float64)
        return list(zip(self.t_q(ls, 1).tolist(), self.t_p(ls, 1).tolist(), strict=True))

    # --- persistence --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "contexts": self.contexts.tolist(), "draft_rows": self.draft_rows.tolist(),
            "draft_seconds": self.draft_seconds.tolist(), "target_tokens": self.target_tokens.tolist(),
            "target_seconds": self.target_seconds.tolist(), "feature_seconds": dict(self.feature_seconds),
            "step_ratios": self.step_ratios.to_dict(), "verify_seconds": {m: dict(by) for m, by in self.verify_seconds.items()}, "meta": self.meta,
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
            return cls(**{k: d[k] for k in _KEYS}, step_ratios=d.get("step_ratios") or {},
                       verify_seconds=d.get("verify_seconds") or {})
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
