"""The learned lookup decision (beyond the paper): verify a context lookup chain only where it is predicted to pay.

`decoding.lookup.LookupFirst` verifies a lookup chain wherever a suffix of the context matched: a tuned rule. This
module decides from measured block efficiencies instead:

- `longest_repeat(context, length, cap)`: the proposal after the earlier occurrence that shares the LONGEST suffix
  with the context (up to ``cap`` tokens, root included; the most recent among equals), with that length, the
  *run*. A long run (a copied line of code, a quoted phrase) predicts a long accepted chain; a one-token run
  (a common word seen before) predicts little.
- labels (`chain_block_efficiency`): a proposal x_1..x_N verified as a one-hot chain by ``naive`` accepts x_i with
  probability p_i(x_i) until the first rejection, so the exact Ê of its first n tokens is
  1 + sum_{j <= n} prod_{i <= j} p_i(x_i); one target pass over the proposal gives every p_i
  (`data_collection/lookup_labels.py` measures them at roots of the train/val/test trajectories).
- `LookupGate`: the predicted Ê(n), n = 1..N, as a table over (run bin, bin of H(p_prev)): the TRAIN roots' mean
  per cell, shrunk towards its run bin's mean by ``prior`` pseudo-roots where a cell has few roots. Both inputs
  are free at decode time (the context and the target's last row).
- `LearnedLookup`: the policy. At a root with a repeat it prices the lookup chains (`lookup_step_seconds`: the
  latency model's plain step times the gate's ``step_ratio``, the engine's lookup step of n tokens over its plain
  step as stage lookup measured it on this machine; no draft forward) and verifies the chain of the best predicted Ê(n) / T(n) when that beats the fallback's best predicted
  Ê / T (a `SelectorRuntime`'s ``best``; a plain step's 1 / T without a fallback); elsewhere the fallback decides.

Lossless for the same reason as every lookup chain (`decoding.lookup`): the proposal and the decision to verify it
are functions of the accepted context only (tests/test_lookup_gate.py decodes greedily against autoregressive).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .actions import AR_ACTION, Action
from .lookup import FallbackHooks

RUN_EDGES = (2, 3, 4, 6, 10, 16, 32)  # run bins [1, 2) [2, 3) [3, 4) [4, 6) [6, 10) [10, 16) [16, 32) [32, cap]
ENTROPY_EDGES = (0.25, 1.0, 2.5)  # H(p_prev) bins in nats: [0, .25) [.25, 1) [1, 2.5) [2.5, inf)
MAX_RUN = 64  # the longest repeat `longest_repeat` measures
GATE_FORMAT = 1


class LookupGateError(ValueError):
    """A lookup gate file or table that is malformed."""


@dataclass(frozen=True)
class Repeat:
    """A lookup proposal after the longest earlier repeat of the context's suffix."""

    tokens: tuple[int, ...]  # what followed the earlier occurrence (at most ``length`` tokens)
    run: int  # how many tokens (root included) the occurrence shares with the context's end


def longest_repeat(context: Sequence[int], length: int, cap: int = MAX_RUN) -> Repeat | None:
    """The proposal after the earlier occurrence of the context's last token whose preceding tokens agree with the
    context's for the longest run (at most ``cap``; ties: the most recent), or None when the last token never
    occurred before (or nothing follows it)."""
    if length < 1 or cap < 1:
        raise ValueError(f"longest_repeat needs length >= 1 and cap >= 1, got {length}, {cap}")
    ids = np.asarray(context, dtype=np.int64)
    n = ids.shape[0]
    if n < 2:
        return None
    ends = np.flatnonzero(ids[: n - 1] == ids[n - 1])  # earlier occurrences of the root: each is followed by a token
    if ends.size == 0:
        return None
    run = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for k in range(1, min(cap, n - 1)):
        back = ends - k
        alive &= back >= 0
        alive[alive] = ids[back[alive]] == ids[n - 1 - k]
        if not alive.any():
            break
        run += alive
    best = int(run.max())
    end = int(ends[np.flatnonzero(run == best)[-1]])  # the most recent of the longest
    return Repeat(tuple(int(t) for t in ids[end + 1: end + 1 + length]), best)


def chain_block_efficiency(accept: np.ndarray) -> np.ndarray:
    """``[..., N]`` exact Ê of the first n = 1..N tokens of a one-hot chain verified by ``naive`` from ``accept``
    ``[..., N]`` = p_i(x_i) (NaN past the proposal's end: Ê stays at its last value there)."""
    a = np.nan_to_num(np.asarray(accept, dtype=np.float64), nan=0.0)
    return 1.0 + np.cumsum(np.cumprod(a, axis=-1), axis=-1)


def lookup_step_seconds(latency, context_lengths, max_length: int, features: str | None = None,
                        step_ratio: np.ndarray | None = None) -> np.ndarray:
    """``[L, max_length]`` seconds of a lookup step verifying n = 1..max_length proposed tokens (no draft forward),
    plus the feature cost when ``features`` are computed. With ``step_ratio`` ``[>= max_length]`` (the engine's
    measured lookup step over its plain step, `LookupGate.step_ratio`): the latency model's plain step times it.
    Without: the model's target pass over root + n tokens, the plain step's overhead and the per-node cost."""
    ls = np.asarray(context_lengths, dtype=np.float64).reshape(-1, 1)
    n = np.arange(1, max_length + 1, dtype=np.float64)[None, :]
    shape = (ls.shape[0], n.shape[1])
    o = latency.step_overhead
    if step_ratio is not None:
        plain = latency.step_seconds_at(ls[:, 0], [AR_ACTION])[:, 0]  # the model's plain step
        seconds = plain[:, None] * np.asarray(step_ratio, dtype=np.float64)[None, :max_length]
    else:
        seconds = latency.t_p(np.broadcast_to(ls, shape), 1 + np.broadcast_to(n, shape))
        seconds = np.asarray(seconds, dtype=np.float64) + o["plain"] + o["per_node"] * n
    return seconds + (latency.feature_seconds if features is not None else 0.0)


def _bins(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    return np.searchsorted(np.asarray(edges, dtype=np.float64), np.asarray(values, dtype=np.float64), side="right")


@dataclass
class LookupGate:
    """Predicted Ê(n) of a lookup chain, n = 1..max_length, per (run bin, H(p_prev) bin) (module docstring)."""

    table: np.ndarray  # [run bins, entropy bins, max_length]
    counts: np.ndarray  # [run bins, entropy bins] TRAIN roots per cell
    run_edges: tuple[float, ...] = RUN_EDGES
    entropy_edges: tuple[float, ...] = ENTROPY_EDGES
    cap: int = MAX_RUN
    prior: float = 20.0
    step_ratio: np.ndarray | None = None  # [max_length] measured lookup step / plain step (None: the model's price)

    def __post_init__(self) -> None:
        self.table = np.asarray(self.table, dtype=np.float64)
        self.counts = np.asarray(self.counts, dtype=np.int64)
        shape = (len(self.run_edges) + 1, len(self.entropy_edges) + 1)
        if self.table.ndim != 3 or self.table.shape[:2] != shape or self.table.shape[2] < 1:
            raise LookupGateError(f"lookup gate: table shape {self.table.shape} does not match the bins {shape} x lengths")
        if self.counts.shape != shape:
            raise LookupGateError(f"lookup gate: counts shape {self.counts.shape} is not {shape}")
        if not np.all(np.isfinite(self.table)) or np.any(self.table < 1.0):
            raise LookupGateError("lookup gate: every predicted block efficiency must be finite and >= 1")
        if self.step_ratio is not None:
            self.step_ratio = np.asarray(self.step_ratio, dtype=np.float64)
            if self.step_ratio.shape != (self.max_length,) or not np.all(np.isfinite(self.step_ratio) & (self.step_ratio > 0)):
                raise LookupGateError(f"lookup gate: step_ratio must hold {self.max_length} finite positive numbers, got "
                                      f"{self.step_ratio.tolist()}")

    @property
    def max_length(self) -> int:
        return int(self.table.shape[2])

    @classmethod
    def fit(cls, run: np.ndarray, entropy_p: np.ndarray, accept: np.ndarray, prior: float = 20.0,
            cap: int = MAX_RUN, step_ratio: np.ndarray | None = None) -> LookupGate:
        """The table from roots with a repeat: ``run`` ``[R]``, ``entropy_p`` ``[R]`` (H(p_prev)), ``accept`` ``[R, N]``
        (NaN past each proposal's end; a length a root could not propose is not averaged there); ``step_ratio`` is
        kept as given (`lookup_step_seconds`)."""
        run, entropy_p = np.asarray(run), np.asarray(entropy_p, dtype=np.float64)
        accept = np.asarray(accept, dtype=np.float64)
        if accept.ndim != 2 or accept.shape[0] == 0 or run.shape != (accept.shape[0],) or entropy_p.shape != run.shape:
            raise LookupGateError(f"lookup gate: fit needs [R] runs and entropies and [R, N] acceptances with R > 0, "
                                  f"got {run.shape}, {entropy_p.shape}, {accept.shape}")
        if np.any(run < 1) or not np.all(np.isfinite(entropy_p)):
            raise LookupGateError("lookup gate: fit needs runs >= 1 and finite entropies (roots without a repeat "
                                  "are not lookup roots)")
        value = chain_block_efficiency(accept)  # [R, N]
        has = ~np.isnan(accept)  # [R, N] the proposal reached n
        rb, eb = _bins(run, RUN_EDGES), _bins(entropy_p, ENTROPY_EDGES)
        shape = (len(RUN_EDGES) + 1, len(ENTROPY_EDGES) + 1, accept.shape[1])
        total, count = np.zeros(shape), np.zeros(shape)
        np.add.at(total, (rb, eb), np.where(has, value, 0.0))
        np.add.at(count, (rb, eb), has.astype(np.float64))
        # the prior of a cell: its run bin's mean over entropies, itself shrunk towards the overall mean
        overall = np.where(count.sum((0, 1)) > 0, total.sum((0, 1)) / np.maximum(count.sum((0, 1)), 1), 1.0)  # [N]
        run_total, run_count = total.sum(1), count.sum(1)  # [run bins, N]
        run_mean = np.divide(run_total + prior * overall, run_count + prior, out=np.broadcast_to(overall, run_total.shape)
                             .copy(), where=run_count + prior > 0)
        table = np.divide(total + prior * run_mean[:, None, :], count + prior,
                          out=np.broadcast_to(run_mean[:, None, :], shape).copy(), where=count + prior > 0)
        cells = np.zeros(shape[:2], dtype=np.int64)
        np.add.at(cells, (rb, eb), 1)
        return cls(np.maximum(table, 1.0), cells, prior=float(prior), cap=int(cap), step_ratio=step_ratio)

    def predict(self, run, entropy_p) -> np.ndarray:
        """``[..., max_length]`` predicted Ê(n) for runs and H(p_prev) values (broadcast)."""
        return self.table[_bins(run, self.run_edges), _bins(entropy_p, self.entropy_edges)]

    def to_dict(self) -> dict:
        return {"format": GATE_FORMAT, "kind": "lookup_gate", "run_edges": list(self.run_edges),
                "entropy_edges": list(self.entropy_edges), "cap": self.cap, "prior": self.prior,
                "table": np.round(self.table, 6).tolist(), "counts": self.counts.tolist(),
                "step_ratio": None if self.step_ratio is None else np.round(self.step_ratio, 4).tolist()}

    @classmethod
    def from_dict(cls, d: dict, where: str = "lookup gate") -> LookupGate:
        if not isinstance(d, dict) or d.get("kind") != "lookup_gate" or d.get("format") != GATE_FORMAT:
            raise LookupGateError(f"{where}: not a lookup gate of format {GATE_FORMAT} (run `branchpoint lookup`)")
        if tuple(d.get("run_edges", ())) != RUN_EDGES or tuple(d.get("entropy_edges", ())) != ENTROPY_EDGES:
            raise LookupGateError(f"{where}: its bins {d.get('run_edges')} / {d.get('entropy_edges')} differ from this "
                                  f"code's {list(RUN_EDGES)} / {list(ENTROPY_EDGES)}; rerun `branchpoint lookup`")
        try:
            ratio = d.get("step_ratio")
            return cls(np.array(d["table"], dtype=np.float64), np.array(d["counts"]), cap=int(d["cap"]),
                       prior=float(d["prior"]), step_ratio=None if ratio is None else np.array(ratio, dtype=np.float64))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, LookupGateError):
                raise LookupGateError(f"{where}: {e}") from None
            raise LookupGateError(f"{where}: malformed ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path) -> LookupGate:
        import json
        from pathlib import Path

        p = Path(path)
        if not p.is_file():
            raise LookupGateError(f"{p}: no lookup gate there (run `branchpoint lookup`)")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise LookupGateError(f"{p}: not JSON ({e})") from None
        return cls.from_dict(d, str(p))


class LearnedLookup(FallbackHooks):
    """A lookup chain where the gate predicts it beats the fallback, else the fallback (module docstring).

    ``fallback``: a selector with ``best(features) -> (Choice, predicted Ê / T)`` (`export.runtime.SelectorRuntime`),
    or None for a plain step. ``latency``: the model pricing the lookup chains (and the plain step)."""

    def __init__(self, gate: LookupGate, latency, fallback=None, method: str = "naive", length: int | None = None
                 ) -> None:
        from .latency import BlockMemo
        from .policy import needs_draft, needs_hidden_states

        if fallback is not None and not callable(getattr(fallback, "best", None)):
            raise TypeError(f"LearnedLookup needs a fallback with best(features) (a regression SelectorRuntime), "
                            f"got {fallback!r}")
        self.gate, self.latency, self.fallback, self.method = gate, latency, fallback, method
        self.length = gate.max_length if length is None else min(int(length), gate.max_length)
        self.features = getattr(fallback, "feature_set", None)
        self.needs_draft = needs_draft(fallback) if fallback is not None else False
        self.uses_draft_model = fallback is not None
        self.needs_hidden_states = needs_hidden_states(fallback) if fallback is not None else False
        extra = float(getattr(fallback, "inference_seconds", 0.0) or 0.0)
        self._prices = BlockMemo(lambda ls: self._price(ls, extra), 64, 512)  # context length -> (lookup [N], plain)

    def _price(self, lengths: np.ndarray, extra: float) -> list:
        ratio = None if self.gate.step_ratio is None else self.gate.step_ratio[: self.length]
        look = lookup_step_seconds(self.latency, lengths, self.length, self.features, ratio) + extra
        plain = self.latency.step_seconds_at(lengths, [AR_ACTION], None)[:, 0]
        return list(zip(look, plain, strict=True))

    def select(self, features):
        from .features import entropy
        from .policy import Choice

        found = longest_repeat(features.context, self.length, self.gate.cap) if features.context is not None else None
        if found is None or features.p_prev is None:
            return self.fallback.select(features) if self.fallback is not None else Choice(AR_ACTION)
        h = features.memo.get("entropy_p_prev")
        if h is None:
            h = features.memo["entropy_p_prev"] = float(entropy(features.p_prev))
        look_seconds, plain_seconds = self._prices.get(int(features.context_length))
        n = len(found.tokens)
        rate = self.gate.predict(found.run, h)[:n] / look_seconds[:n]
        best_n = int(np.argmax(rate))
        if self.fallback is not None:
            choice, other = self.fallback.best(features)
        else:
            choice, other = Choice(AR_ACTION), 1.0 / float(plain_seconds)
        if rate[best_n] > other:
            return Choice(Action(1, best_n + 1, 0), self.method, found.tokens[: best_n + 1])
        return choice

    def __repr__(self) -> str:
        return f"LearnedLookup({self.fallback!r}, length <= {self.length}, method={self.method})"
