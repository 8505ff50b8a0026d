"""Khisti et al. (2025) OT verification in its practical form: a tournament of pairwise LP selections.

Terms (ALGORITHMS.md sections 3.1 and 3.1b):
- children: the k child TOKENS of a node, i.i.d. draws from the draft law q(.|node).
- pair selection: from two independent candidates X1 ~ q1 and X2 ~ q2, pick one. Tokens are ranked by
  `p - q1*q2` (descending, ties by token id); the top s form Omega1, the rest Omega2. Equal tokens
  give that token; two distinct tokens of Omega1 with ranks i < j give rank i with probability w[i, j]
  and rank j otherwise; any other pair gives the better-ranked token.
- selection law q_I: the law of the selected token. It is linear in w; w solves the LP
  `max sum_i z_i  s.t.  z_i <= p(omega_i), z_i <= q_I(omega_i), 0 <= w <= 1`, which maximizes the
  acceptance probability sum_x min(p(x), q_I(x)) of the step below (q_I on Omega2 does not depend on w).
- tournament (k >= 2): winner W = X1 with q_W = q; for m = 2..k select between W and X_m with the pair
  LP for (q_W, q), then q_W <- q_I. The winner is independent of the next i.i.d. draft, so each pair
  selection sees two independent candidates with known laws, and the final winner has law q_I exactly.
  The LP weights depend only on (p, q, k), never on the realized children.
- speculative step: accept the winner Y with probability min(1, p(Y)/q_I(Y)), else emit a token from
  the residual norm((p - q_I)+). Since Y ~ q_I, the emitted token is distributed as p (lossless).
- fallback: if any LP of the tournament fails, the node uses `naive_tree` (standard speculative
  sampling of X1 against q; exact), never an approximate q_I.
- LP solver: the spec names scipy's linprog (HiGHS); its call overhead (~3-5 ms) dwarfed the tiny LP,
  so `solve_pair_lp` solves the same LP exactly as a maximum flow (see there); tests compare its
  optimum with linprog's. It "fails" (-> fallback) on non-finite input.
- speed (V ~ 50k; khisti_numerics.py): stage 1 ranks all tokens with a radix sort; a later
  stage starts from the previous stage's rank order, which the new keys leave nearly sorted, and an
  insertion sort fixes it; ties are always put in token-id order, so the ranking is exactly that of a
  stable argsort by -(p - q1*q2). A stage's arrays stay in rank order, and one compiled pass over the
  ranks gives q_I, the residual mass and the next stage's keys. The label path
  (`KhistiSolver.branch_weights`) runs one tournament per branch row for all K, in reusable buffers
  (each stage takes over the previous one's arrays), and evaluates the emitted law only at the children.

`KhistiSolver` implements the per-node solver protocol of the OT verifiers: `sample` draws the emitted
token, `output_distribution` gives its exact law given the realized children (summing over the
tournament's selection randomness and the speculative step).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from decoding.probability import acceptance, categorical, check_distribution, residual

from .base import StandardChainSolver
from .khisti_numerics import StageBuffers, full_order, hinted_sort, selection_pass, solve_pair_lp
from .ratios import RatioTable

DEFAULT_TOP_S = 5
MAX_TOP_S = 15
_CACHE_SIZE = 16


@dataclass(frozen=True)
class PairSelection:
    """Pairwise selection between a candidate of law q1 (first) and one of law q2 (second).

    Arrays marked "rank order" are indexed by rank (0 = best), i.e. they are the token-order arrays
    taken at ``order``; the token-order views ``rank`` and ``q_I`` are built on first use."""

    order: np.ndarray  # [V] int64: tokens best first (by p - q1*q2 descending, ties by token id)
    top_s: int  # |Omega1|: tokens of rank < top_s are selected by the LP weights
    w: np.ndarray  # [s, s] float64: w[i, j] (i < j) = P(select rank i | distinct candidates of ranks i, j)
    q_I_sorted: np.ndarray  # [V] float64, rank order: law of the selected token
    q1_sorted: np.ndarray  # [V] float64, rank order: law of the first candidate
    key_sorted: np.ndarray  # [V] float64, rank order: q1*q2 - p (ascending)
    p_sorted: np.ndarray  # [V] float64, rank order: target p
    q2_sorted: np.ndarray  # [V] float64, rank order: law of the second candidate
    next_keys: np.ndarray  # [V] float64, rank order: q_I*q2 - p, the keys of the tournament's next stage
    residual_mass: float  # sum_x (p(x) - q_I(x))+: mass of the speculative step's residual

    @cached_property
    def rank(self) -> np.ndarray:
        """[V] int64: rank of each token (0 = best)."""
        rank = np.empty(self.order.shape[0], dtype=np.int64)
        rank[self.order] = np.arange(self.order.shape[0])
        return rank

    @cached_property
    def q_I(self) -> np.ndarray:
        """[V] float64: law of the selected token, in token order."""
        q_I = np.empty(self.order.shape[0])
        q_I[self.order] = self.q_I_sorted
        return q_I

    def ranks_of(self, tokens: list[int], keys: list[float]) -> list[int]:
        """Ranks of ``tokens`` whose keys q1*q2 - p (computed as in the ranking) are ``keys``: O(log V) each."""
        lo = np.searchsorted(self.key_sorted, keys, side="left").tolist()
        hi = np.searchsorted(self.key_sorted, keys, side="right").tolist()
        return [a if b - a == 1 else a + int(np.flatnonzero(self.order[a:b] == t)[0])
                for t, a, b in zip(tokens, lo, hi, strict=True)]

    def choice_law(self, a: int, b: int, ra: int | None = None, rb: int | None = None) -> list[tuple[int, float]]:
        """Law of the selected token given the realized candidates a (first) and b (second);
        ``ra``, ``rb``: their ranks when already known."""
        if a == b:
            return [(a, 1.0)]
        ra = int(self.rank[a]) if ra is None else ra
        rb = int(self.rank[b]) if rb is None else rb
        better, worse = (a, b) if ra < rb else (b, a)
        i, j = min(ra, rb), max(ra, rb)
        if j >= self.top_s:
            return [(better, 1.0)]
        wij = float(self.w[i, j])
        return [(better, wij), (worse, 1.0 - wij)]

    def select(self, a: int, b: int, rng: np.random.Generator) -> int:
        """Sample the selected token given the realized candidates a and b."""
        law = self.choice_law(a, b)
        if len(law) == 1:
            return law[0][0]
        return law[0][0] if rng.random() < law[0][1] else law[1][0]


@dataclass(frozen=True)
class Tournament:
    """The pair selections of a k-candidate tournament and the law of its winner."""

    stages: tuple[PairSelection, ...]  # stage m-2 selects between the winner of X1..X_{m-1} and X_m
    q_I: np.ndarray  # [V] float64: law of the final winner (q itself when k = 1)


def _select_sorted(st: dict[str, np.ndarray], top_s: int) -> PairSelection | None:
    """The pair selection given the stage's arrays ``st`` (khisti_numerics.STAGE_ARRAYS) with order, p,
    q1, q2 filled in rank order; fills key, q_I and next_keys."""
    p_s, q1_s, q2_s, q_I_s, next_keys = st["p"], st["q1"], st["q2"], st["q_I"], st["next_keys"]
    s = min(top_s, p_s.shape[0])
    r1, r2, res = selection_pass((p_s, q1_s, q2_s), s, st["key"], q_I_s, next_keys)  # final for ranks >= s
    a1, a2 = q1_s[:s].tolist(), q2_s[:s].tolist()
    mass = np.zeros((s, s))  # [s, s] P({X1, X2} = {i, j}) for i < j
    for i in range(s):
        for j in range(i + 1, s):
            mass[i, j] = a1[i] * a2[j] + a2[i] * a1[j]
    w = np.ones((s, s))
    if s > 1:
        v = solve_pair_lp(q_I_s[:s], p_s[:s], mass)
        if v is None:
            return None
        v[v < 1e-12] = 0.0  # snap float noise; q_I below is exact for whatever w is used
        v[v > 1.0 - 1e-12] = 1.0
        w = 1.0 - v  # (v is 0 outside i < j)
    # Omega1 laws as sums of nonnegative terms (no cancellation): own pair, pairs with Omega2, Omega1 pairs.
    top = [a1[i] * a2[i] + a1[i] * r2 + r1 * a2[i] for i in range(s)]
    wl, ml = w.tolist(), mass.tolist()
    for i in range(s):
        for j in range(i + 1, s):
            top[i] += wl[i][j] * ml[i][j]
            top[j] += (1.0 - wl[i][j]) * ml[i][j]
    p_top = p_s[:s].tolist()
    q_I_s[:s] = top
    next_keys[:s] = [top[i] * a2[i] - p_top[i] for i in range(s)]
    res += sum(max(p_top[i] - top[i], 0.0) for i in range(s))
    return PairSelection(order=st["order"], top_s=s, w=w, q_I_sorted=q_I_s, q1_sorted=q1_s, key_sorted=st["key"],
                         p_sorted=p_s, q2_sorted=q2_s, next_keys=next_keys, residual_mass=res)


def pair_selection(p: np.ndarray, q1: np.ndarray, q2: np.ndarray, top_s: int,
                   _buf: StageBuffers | None = None) -> PairSelection | None:
    """Solve the pairwise selection LP for candidates X1 ~ q1, X2 ~ q2; None if the LP fails.

    (``_buf``: internal; the stage's arrays are then ``_buf.stage``, valid until they are reused.
    Without ``_buf`` the stage owns fresh arrays.)"""
    buf = StageBuffers(p.shape[0]) if _buf is None else _buf
    st = buf.stage
    neg = np.multiply(q1, q2, out=buf.neg)
    neg -= p  # [V] -(p - q1*q2): ascending = best first
    order = full_order(neg, st["order"], buf)  # [V] tokens best first; ties by token id
    for name, a in (("p", p), ("q1", q1)):
        np.take(a, order, out=st[name], mode="clip")  # ("clip": indices are valid; it avoids buffering)
    if q2 is q1:  # (a separate array all the same: next_stage may reuse q1's in place)
        np.copyto(st["q2"], st["q1"])
    else:
        np.take(q2, order, out=st["q2"], mode="clip")
    return _select_sorted(st, top_s)


def next_stage(prev: PairSelection, top_s: int, in_place: bool = False) -> PairSelection | None:
    """The tournament stage after ``prev``: candidates X1 ~ prev's q_I (the winner so far) and X2 ~ the
    second law of ``prev`` (the draft q). Same result as ``pair_selection(p, prev.q_I, q2, top_s)``,
    faster: the new keys differ from ``prev``'s mostly on a few high-q tokens, so ``prev``'s rank order
    is nearly sorted for them (``prev.next_keys`` are the new keys in that order).

    ``in_place``: the new stage takes over prev's arrays (no copies; prev is invalid afterwards)."""
    st = {"key": prev.next_keys, "order": prev.order, "p": prev.p_sorted, "q1": prev.q_I_sorted,
          "q2": prev.q2_sorted}
    if in_place:  # prev's keys and laws of the first candidate are not needed any more
        st |= {"q_I": prev.key_sorted, "next_keys": prev.q1_sorted}
    else:
        st = {name: a.copy() for name, a in st.items()} | {"q_I": np.empty_like(prev.p_sorted),
                                                           "next_keys": np.empty_like(prev.p_sorted)}
    hinted_sort(st)
    return _select_sorted(st, top_s)


def tournament(p: np.ndarray, q: np.ndarray, k: int, top_s: int = DEFAULT_TOP_S) -> Tournament | None:
    """Build the k-candidate tournament for target p and draft q; None if any pair LP fails."""
    stages: list[PairSelection] = []
    for _ in range(2, k + 1):
        stage = pair_selection(p, q, q, top_s) if not stages else next_stage(stages[-1], top_s)
        if stage is None:
            return None
        stages.append(stage)
    return Tournament(stages=tuple(stages), q_I=stages[-1].q_I if stages else q)


def _advance(law: dict[int, float], stage: PairSelection, challenger: int,
             ranks: dict[int, int] | None = None) -> dict[int, float]:
    """Law of the winner after ``stage`` selects between the current winner (law ``law``) and
    ``challenger``; ``ranks``: the stage's ranks of these tokens, when known."""
    new: dict[int, float] = {}
    rc = None if ranks is None else ranks[challenger]
    for winner, prob in law.items():
        for tok, c in stage.choice_law(winner, challenger, None if ranks is None else ranks[winner], rc):
            if c > 0.0:
                new[tok] = new.get(tok, 0.0) + prob * c
    return new


def _speculative_law(p: np.ndarray, proposal: np.ndarray, selected: dict[int, float]) -> np.ndarray:
    """Exact law of standard speculative sampling of a token with law `selected` against `proposal`."""
    out = np.zeros_like(p)  # [V]
    reject = 1.0
    for tok, prob in selected.items():
        acc = float(acceptance(p[tok], proposal[tok]))
        out[tok] += prob * acc
        reject -= prob * acc
    if reject > 0.0:
        out += reject * residual(p, proposal)  # [V] norm((p - proposal)+)
    return out


def _speculative_sample(p: np.ndarray, proposal: np.ndarray, token: int, rng: np.random.Generator) -> int:
    """Standard speculative sampling of `token` (a draw from `proposal`) against target p."""
    if rng.random() < float(acceptance(p[token], proposal[token])):
        return token
    return categorical(residual(p, proposal), rng)


def _check_inputs(p: np.ndarray, q: np.ndarray, children: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    p, q = check_distribution(p, "khisti: p"), check_distribution(q, "khisti: q")
    if p.shape != q.shape:
        raise ValueError(f"khisti: p has shape {p.shape} but q has shape {q.shape}")
    toks = [int(t) for t in children]
    if not toks:
        raise ValueError("khisti: a node without children needs no solver; emit a bonus token ~ p instead")
    for t in toks:
        if not 0 <= t < p.shape[0] or q[t] <= 0.0:
            raise ValueError(f"khisti: child token {t} is outside the vocabulary or has q = 0; children must "
                             "be draws from q")
    return p, q, toks


class KhistiSolver(StandardChainSolver):
    """Per-node OT solver of Khisti et al. 2025 (section 3.1b): tournament selection + speculative step.
    With one child it is standard speculative sampling (tournament of one: q_I = q)."""

    name = "khisti"

    def __init__(self, top_s: int = DEFAULT_TOP_S):
        if not 1 <= top_s <= MAX_TOP_S:
            raise ValueError(f"khisti: top_s must be in 1..{MAX_TOP_S}, got {top_s}")
        self.top_s = top_s
        # content digest of (p, q) -> (stages built so far, True if the next stage's LP failed)
        self._cache: OrderedDict[bytes, tuple[list[PairSelection], bool]] = OrderedDict()
        self._local = threading.local()  # per-thread scratch buffers of branch_weights

    def tournament(self, p: np.ndarray, q: np.ndarray, k: int) -> Tournament | None:
        """The k-candidate tournament for (p, q); None means the node falls back to naive_tree.

        Stages are cached by content and shared across k (the k-candidate tournament is the first
        k - 1 stages of any longer one), so the result never depends on the call history."""
        if k <= 1:
            return Tournament(stages=(), q_I=q)
        key = hashlib.blake2b(p.tobytes() + q.tobytes(), digest_size=16).digest()
        stages, failed = self._cache.pop(key, ([], False))
        while len(stages) < k - 1 and not failed:
            stage = next_stage(stages[-1], self.top_s) if stages else pair_selection(p, q, q, self.top_s)
            if stage is None:
                failed = True
            else:
                stages.append(stage)
        self._cache[key] = (stages, failed)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        if len(stages) < k - 1:
            return None
        return Tournament(stages=tuple(stages[: k - 1]), q_I=stages[k - 2].q_I)

    def branch_weights(self, p: np.ndarray, q: np.ndarray, tokens: np.ndarray,
                       tables: list[RatioTable] | None = None) -> np.ndarray:
        """[J, Kmax, Kmax] label weights (decoding/labels.py): entry (j, K-1, i) is the probability that
        the node with target p[j], draft q[j] and children tokens[j, :K] emits tokens[j, i] (0 when i >= K
        or tokens[j, i] repeats an earlier child). Same numbers as ``output_distribution`` (it is the
        same law), but only at the children: one tournament per row serves every K, built in reusable
        buffers, and each stage's residual mass comes from its pass over the vocabulary. No input
        checks (the label path validates p_rows itself). ``tables`` is not needed (the tournament ranks
        the whole vocabulary itself)."""
        n_rows, kmax = tokens.shape
        out = np.zeros((n_rows, kmax, kmax))
        buf = self._buffers(p.shape[-1])
        for j in range(n_rows):
            p64, q64 = np.asarray(p[j], dtype=np.float64), np.asarray(q[j], dtype=np.float64)
            toks = [int(t) for t in tokens[j]]
            p_t, q_t = p64[toks].tolist(), q64[toks].tolist()
            diff = np.subtract(p64, q64, out=buf.neg)
            naive_mass = float(np.maximum(diff, 0.0, out=diff).sum())  # sum (p - q)+
            out[j, 0] = self._children_law({toks[0]: 1.0}, toks[:1], p_t, q_t, naive_mass)
            prev: PairSelection | None = None
            law, q1_t = {toks[0]: 1.0}, q_t  # law of the current winner given the children; its proposal there
            for k in range(2, kmax + 1):
                stage = (pair_selection(p64, q64, q64, self.top_s, buf) if prev is None
                         else next_stage(prev, self.top_s, in_place=True))
                if stage is None:  # this and every larger K fall back to naive_tree
                    for kk in range(k, kmax + 1):
                        out[j, kk - 1] = self._children_law({toks[0]: 1.0}, toks[:kk], p_t, q_t, naive_mass)
                    break
                ranks = stage.ranks_of(toks, [q1_t[i] * q_t[i] - p_t[i] for i in range(kmax)])
                law = _advance(law, stage, toks[k - 1], dict(zip(toks, ranks, strict=True)))
                q1_t = stage.q_I_sorted[ranks].tolist()
                out[j, k - 1] = self._children_law(law, toks[:k], p_t, q1_t, stage.residual_mass)
                prev = stage
        return out

    def _buffers(self, V: int) -> StageBuffers:
        """Scratch arrays for branch_weights, kept between calls (vocabulary size V; one set per thread)."""
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.V != V:
            buf = self._local.buf = StageBuffers(V)
        return buf

    @staticmethod
    def _children_law(law: dict[int, float], toks: list[int], p_t: list[float], prop_t: list[float],
                      res_mass: float) -> np.ndarray:
        """[Kmax] ``_speculative_law(p, proposal, law)`` at the children (0 at repeated ones), given p and the
        proposal at the children and ``res_mass = sum (p - proposal)+``."""
        kmax = len(p_t)
        prop = dict(zip(toks, prop_t, strict=False))
        reject = 1.0
        emitted = dict.fromkeys(toks, 0.0)
        for tok, prob in law.items():
            p_x, q_x = p_t[toks.index(tok)], prop[tok]  # acceptance(p_x, q_x) in Python floats
            acc = min(p_x / q_x, 1.0) if q_x > 0 else (1.0 if p_x > 0 else 0.0)
            emitted[tok] += prob * acc
            reject -= prob * acc
        row = np.zeros(kmax)
        seen: set[int] = set()
        for i, t in enumerate(toks):
            if t in seen:
                continue
            seen.add(t)
            val = emitted[t]
            if reject > 0.0:
                res = max(p_t[i] - prop[t], 0.0) / res_mass if res_mass > 0 else p_t[i]
                val += reject * res
            row[i] = val
        return row

    def _prepare(self, p, q, children) -> tuple[np.ndarray, list[int], dict[int, float], np.ndarray]:
        """(p, children, law of the selected token given the children, its proposal law q_I or q)."""
        p, q, toks = _check_inputs(p, q, children)
        tour = self.tournament(p, q, len(toks))
        if tour is None:  # an LP failed: naive_tree on X1 against q
            return p, toks, {toks[0]: 1.0}, q
        law = {toks[0]: 1.0}
        for stage, challenger in zip(tour.stages, toks[1:], strict=True):
            law = _advance(law, stage, challenger)
        return p, toks, law, tour.q_I

    def winner_law(self, p: np.ndarray, q: np.ndarray, children: Sequence[int]) -> tuple[dict[int, float], np.ndarray]:
        """(exact law of the selected token given the children, its proposal law: q_I, or q on fallback)."""
        _, _, law, proposal = self._prepare(p, q, children)
        return law, proposal

    def output_distribution(self, p: np.ndarray, q: np.ndarray, children: Sequence[int]) -> np.ndarray:
        """[V] exact law of the emitted token given these children (i.i.d. draws from q)."""
        p, _, law, proposal = self._prepare(p, q, children)
        return _speculative_law(p, proposal, law)

    def sample(self, p: np.ndarray, q: np.ndarray, children: Sequence[int], rng: np.random.Generator) -> int:
        """Emitted token: tournament selection among the children, then speculative sampling against q_I."""
        p, q, toks = _check_inputs(p, q, children)
        tour = self.tournament(p, q, len(toks))
        if tour is None:
            return _speculative_sample(p, q, toks[0], rng)
        winner = toks[0]
        for stage, challenger in zip(tour.stages, toks[1:], strict=True):
            winner = stage.select(winner, challenger, rng)
        return _speculative_sample(p, tour.q_I, winner, rng)
