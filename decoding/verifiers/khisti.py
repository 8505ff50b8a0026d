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

`KhistiSolver` implements the per-node solver protocol of the OT verifiers: `sample` draws the emitted
token, `output_distribution` gives its exact law given the realized children (summing over the
tournament's selection randomness and the speculative step).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from ..probability import acceptance, categorical, check_distribution, residual

DEFAULT_TOP_S = 5
MAX_TOP_S = 15
_CACHE_SIZE = 16


@dataclass(frozen=True)
class PairSelection:
    """Pairwise selection between a candidate of law q1 (first) and one of law q2 (second)."""

    rank: np.ndarray  # [V] int64: rank of each token by p - q1*q2 (0 = best)
    top_s: int  # |Omega1|: tokens of rank < top_s are selected by the LP weights
    w: np.ndarray  # [s, s] float64: w[i, j] (i < j) = P(select rank i | distinct candidates of ranks i, j)
    q_I: np.ndarray  # [V] float64: law of the selected token

    def choice_law(self, a: int, b: int) -> list[tuple[int, float]]:
        """Law of the selected token given the realized candidates a (first) and b (second)."""
        if a == b:
            return [(a, 1.0)]
        ra, rb = int(self.rank[a]), int(self.rank[b])
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


def pair_selection(p: np.ndarray, q1: np.ndarray, q2: np.ndarray, top_s: int) -> PairSelection | None:
    """Solve the pairwise selection LP for candidates X1 ~ q1, X2 ~ q2; None if the LP fails."""
    V = p.shape[0]
    order = np.argsort(-(p - q1 * q2), kind="stable")  # [V] tokens best first; ties by token id
    rank = np.empty(V, dtype=np.int64)
    rank[order] = np.arange(V)
    q1s, q2s = q1[order], q2[order]  # [V] laws in rank order
    t1 = np.append(np.cumsum(q1s[::-1])[::-1][1:], 0.0)  # [V] q1-mass ranked strictly worse
    t2 = np.append(np.cumsum(q2s[::-1])[::-1][1:], 0.0)
    base = q1s * q2s + q1s * t2 + t1 * q2s  # [V] law when the better-ranked token always wins
    s = min(top_s, V)
    pairs = [(i, j) for i in range(s) for j in range(i + 1, s)]
    mass = np.array([q1s[i] * q2s[j] + q1s[j] * q2s[i] for i, j in pairs])  # [P] P({X1, X2} = {i, j})
    w = np.ones((s, s))
    if pairs:
        # Variables: v = 1 - w per pair (mass moved from the better to the worse token), then z (s).
        n_pair = len(pairs)
        a_ub = np.zeros((s, n_pair + s))  # row i: z_i + sum_j>i v_ij m_ij - sum_j<i v_ji m_ji <= base_i
        for col, (i, j) in enumerate(pairs):
            a_ub[i, col] = mass[col]
            a_ub[j, col] = -mass[col]
        a_ub[np.arange(s), n_pair + np.arange(s)] = 1.0
        cost = np.concatenate([np.zeros(n_pair), -np.ones(s)])
        bounds = [(0.0, 1.0)] * n_pair + [(0.0, float(p[order[i]])) for i in range(s)]
        try:
            res = linprog(cost, A_ub=a_ub, b_ub=base[:s], bounds=bounds, method="highs")
        except ValueError:
            return None
        if res.status != 0 or res.x is None:
            return None
        v = np.clip(res.x[:n_pair], 0.0, 1.0)
        v[v < 1e-12] = 0.0  # snap solver noise; q_I below is exact for whatever w is used
        v[v > 1.0 - 1e-12] = 1.0
        for col, (i, j) in enumerate(pairs):
            w[i, j] = 1.0 - v[col]
    # Omega1 laws as sums of nonnegative terms (no cancellation): own pair, pairs with Omega2, Omega1 pairs.
    r1, r2 = q1s[s:].sum(), q2s[s:].sum()
    base[:s] = q1s[:s] * q2s[:s] + q1s[:s] * r2 + r1 * q2s[:s]
    for col, (i, j) in enumerate(pairs):
        base[i] += w[i, j] * mass[col]
        base[j] += (1.0 - w[i, j]) * mass[col]
    q_I = np.empty(V)
    q_I[order] = base
    return PairSelection(rank=rank, top_s=s, w=w, q_I=q_I)


def tournament(p: np.ndarray, q: np.ndarray, k: int, top_s: int = DEFAULT_TOP_S) -> Tournament | None:
    """Build the k-candidate tournament for target p and draft q; None if any pair LP fails."""
    stages = []
    q_w = q
    for _ in range(2, k + 1):
        stage = pair_selection(p, q_w, q, top_s)
        if stage is None:
            return None
        stages.append(stage)
        q_w = stage.q_I
    return Tournament(stages=tuple(stages), q_I=q_w)


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


class KhistiSolver:
    """Per-node OT solver of Khisti et al. 2025 (section 3.1b): tournament selection + speculative step."""

    name = "khisti"

    def __init__(self, top_s: int = DEFAULT_TOP_S):
        if not 1 <= top_s <= MAX_TOP_S:
            raise ValueError(f"khisti: top_s must be in 1..{MAX_TOP_S}, got {top_s}")
        self.top_s = top_s
        # content digest of (p, q) -> (stages built so far, True if the next stage's LP failed)
        self._cache: OrderedDict[bytes, tuple[list[PairSelection], bool]] = OrderedDict()

    def tournament(self, p: np.ndarray, q: np.ndarray, k: int) -> Tournament | None:
        """The k-candidate tournament for (p, q); None means the node falls back to naive_tree.

        Stages are cached by content and shared across k (the k-candidate tournament is the first
        k - 1 stages of any longer one), so the result never depends on the call history."""
        if k <= 1:
            return Tournament(stages=(), q_I=q)
        key = hashlib.blake2b(p.tobytes() + q.tobytes(), digest_size=16).digest()
        stages, failed = self._cache.pop(key, ([], False))
        while len(stages) < k - 1 and not failed:
            stage = pair_selection(p, stages[-1].q_I if stages else q, q, self.top_s)
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

    def _prepare(self, p, q, children) -> tuple[np.ndarray, list[int], dict[int, float], np.ndarray]:
        """(p, children, law of the selected token given the children, its proposal law q_I or q)."""
        p, q, toks = _check_inputs(p, q, children)
        tour = self.tournament(p, q, len(toks))
        if tour is None:  # an LP failed: naive_tree on X1 against q
            return p, toks, {toks[0]: 1.0}, q
        law = {toks[0]: 1.0}
        for stage, challenger in zip(tour.stages, toks[1:], strict=True):
            new: dict[int, float] = {}
            for winner, prob in law.items():
                for tok, c in stage.choice_law(winner, challenger):
                    if c > 0.0:
                        new[tok] = new.get(tok, 0.0) + prob * c
            law = new
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
