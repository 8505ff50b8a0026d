"""Exact-enumeration harness (ALGORITHMS.md section 7): proves a verifier lossless with no sampling.

- ``TablePair``: tiny-vocabulary target/draft conditionals p(.|seq), q(.|seq), generated
  deterministically per sequence, with exact zeros in both (q = 0 where p > 0 and vice versa),
  identical rows (p == q) and disjoint supports among the cases.
- ``enumerate_trees``: every draft outcome of an action with its probability.
- ``step_law``: exact law of one step's tokens (accepted + emitted), summing the method's exact
  ``outcome_distribution`` over all draft outcomes.
- ``chained_law``: exact law of the first n tokens from any per-context step law (a new step starts after each
  step); ``emitted_law``: the same for one action and method at every step;
  lossless means it equals ``target_law`` (p(a) p(b|a) for n = 2).
Works for every registry method, OT-based or not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from verifiers import VerificationMethod, get_method
from verifiers.ot import OTMethod

from .actions import Action
from .tree import DraftTree, children_lists, tree_layout

Law = dict[tuple[int, ...], float]


# Every distinct delayed tree of ALGORITHMS.md section 7: L1 + L2 <= 3, K <= 3 (K is moot when L2 = 0).
SECTION7_SHAPES: tuple[Action, ...] = tuple(
    Action(k, l1, l2) for l1 in range(4) for l2 in range(4 - l1) for k in (1, 2, 3) if l2 > 0 or k == 1
)


@lru_cache(maxsize=200_000)
def _table_rows(vocab: int, seed: int, seq: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, vocab, len(seq), *seq])

    def sparse_row() -> np.ndarray:
        row = rng.random(vocab) ** 2 * (rng.random(vocab) < 0.7)
        if row.sum() == 0:
            row[rng.integers(vocab)] = 1.0
        return row / row.sum()

    mode = int(rng.integers(6))
    p = sparse_row()
    if mode == 3:  # identical rows
        q = p.copy()
    elif mode == 4 and vocab >= 2:  # disjoint supports
        support = rng.permutation(vocab)
        cut = int(rng.integers(1, vocab))
        p, q = np.zeros(vocab), np.zeros(vocab)
        p[support[:cut]] = rng.random(cut) + 0.1
        q[support[cut:]] = rng.random(vocab - cut) + 0.1
        p, q = p / p.sum(), q / q.sum()
    elif mode == 5:  # deterministic draft
        q = np.zeros(vocab)
        q[rng.integers(vocab)] = 1.0
    else:
        q = sparse_row()
    p.flags.writeable = False
    q.flags.writeable = False
    return p, q


@dataclass(frozen=True)
class TablePair:
    """Target and draft conditionals over ``vocab_size`` tokens, a pure function of (seed, seq)."""

    vocab_size: int = 3
    seed: int = 0

    def p(self, seq: tuple[int, ...]) -> np.ndarray:
        return _table_rows(self.vocab_size, self.seed, tuple(seq))[0]

    def q(self, seq: tuple[int, ...]) -> np.ndarray:
        return _table_rows(self.vocab_size, self.seed, tuple(seq))[1]


def enumerate_trees(action: Action, pair: TablePair, context: tuple[int, ...] = ()) -> Iterator[tuple[DraftTree, float]]:
    """Every tree ``sample_tree(action, q)`` can draft at ``context``, with its probability (> 0)."""
    parents, depths = tree_layout(action)
    children = children_lists(parents)
    n, vocab = parents.shape[0], pair.vocab_size
    tokens = np.full(n, -1, dtype=np.int64)
    paths: list[tuple[int, ...]] = [()] * n

    def rec(i: int, prob: float) -> Iterator[tuple[DraftTree, float]]:
        if i == n:
            q_rows = np.zeros((n, vocab))
            for j in range(n):
                if children[j] or j == 0:
                    q_rows[j] = pair.q(context + paths[j])
            yield DraftTree(action, tokens.copy(), parents, depths, children, q_rows), prob
            return
        parent_path = paths[parents[i]]
        q = pair.q(context + parent_path)
        for t in np.flatnonzero(q > 0):
            tokens[i] = t
            paths[i] = parent_path + (int(t),)
            yield from rec(i + 1, prob * float(q[t]))

    yield from rec(1, 1.0)


class _CachedSolver:
    """Memoises ``output_distribution`` of an OT solver (many enumerated trees share a node)."""

    def __init__(self, solver) -> None:
        self.solver, self.name, self._memo = solver, solver.name, {}

    def sample(self, p, q, children, rng):
        return self.solver.sample(p, q, children, rng)

    def output_distribution(self, p, q, children):
        key = (p.tobytes(), q.tobytes(), tuple(children))
        if key not in self._memo:
            self._memo[key] = self.solver.output_distribution(p, q, children)
        return self._memo[key]

    def chain_acceptance(self, p_x, q_x):
        return self.solver.chain_acceptance(p_x, q_x)

    def branch_weights(self, p, q, tokens, tables=None):
        return self.solver.branch_weights(p, q, tokens, tables)


def with_cache(method: VerificationMethod) -> VerificationMethod:
    """Same method; OT solvers memoised for enumeration (others returned unchanged)."""
    if isinstance(method, OTMethod) and not isinstance(method.solver, _CachedSolver):
        return dataclasses.replace(method, solver=_CachedSolver(method.solver))
    return method


def tree_p_rows(tree: DraftTree, pair: TablePair, context: tuple[int, ...] = ()) -> np.ndarray:
    """``[n, V]`` target rows of ``tree`` drafted at ``context``."""
    return np.stack([pair.p(context + tree.path_tokens(i)) for i in range(tree.num_nodes)])


def step_law(action: Action, pair: TablePair, method: str | VerificationMethod,
             context: tuple[int, ...] = ()) -> Law:
    """Exact law of one step's ``res.tokens`` at ``context`` (drafting and verification randomness)."""
    m = with_cache(get_method(method))
    law: Law = {}
    for tree, prob in enumerate_trees(action, pair, context):
        for key, mass in m.outcome_distribution(tree, tree_p_rows(tree, pair, context)).items():
            law[key] = law.get(key, 0.0) + prob * mass
    return law


def chained_law(step: Callable[[tuple[int, ...]], Law], n_tokens: int, context: tuple[int, ...] = ()) -> Law:
    """Exact law of the first ``n_tokens`` tokens after ``context`` when each step's tokens (accepted + emitted) at a
    context follow ``step(context)`` and a new step starts after each one (``step`` is called once per context)."""
    steps: dict[tuple[int, ...], Law] = {}

    def rec(ctx: tuple[int, ...], need: int) -> Law:
        if ctx not in steps:
            steps[ctx] = step(ctx)
        out: Law = {}
        for toks, mass in steps[ctx].items():
            if len(toks) >= need:
                out[toks[:need]] = out.get(toks[:need], 0.0) + mass
            else:
                for rest, m2 in rec(ctx + toks, need - len(toks)).items():
                    out[toks + rest] = out.get(toks + rest, 0.0) + mass * m2
        return out

    return rec(tuple(context), n_tokens)


def emitted_law(action: Action, pair: TablePair, method: str | VerificationMethod, n_tokens: int = 2) -> Law:
    """Exact law of the first ``n_tokens`` emitted tokens, starting new steps as needed."""
    m = with_cache(get_method(method))
    return chained_law(lambda ctx: step_law(action, pair, m, ctx), n_tokens)


def target_law(pair: TablePair, n_tokens: int = 2, context: tuple[int, ...] = ()) -> Law:
    """Law of ``n_tokens`` tokens sampled from the target alone: p(a) p(b|a) ..."""
    if n_tokens == 0:
        return {(): 1.0}
    p = pair.p(context)
    out: Law = {}
    for t in np.flatnonzero(p > 0):
        for rest, mass in target_law(pair, n_tokens - 1, context + (int(t),)).items():
            out[(int(t),) + rest] = float(p[t]) * mass
    return out


def law_distance(a: Law, b: Law) -> float:
    """Largest absolute difference between two laws (missing keys count as 0)."""
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)), default=0.0)


def exact_block_efficiency(tree: DraftTree, p_rows: np.ndarray, method: str | VerificationMethod) -> float:
    """E[accepted + 1] from the exact outcome law (any method; small trees only)."""
    law = get_method(method).outcome_distribution(tree, p_rows)
    return float(sum(mass * len(toks) for toks, mass in law.items()))
