"""Exact losslessness of every registered verifier (ALGORITHMS.md section 7), with no sampling.

Tiny vocabularies, explicit conditional tables with exact zeros (decoding/exact.py), every tree shape
with L1 + L2 <= 3 and K <= 3: the exact law of the first two emitted tokens must equal the target's
p(a) p(b|a) within 1e-12. Parametrized over the registry, so new methods are picked up automatically.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from decoding import METHODS, Action
from decoding.exact import (
    TablePair,
    emitted_law,
    enumerate_trees,
    exact_block_efficiency,
    law_distance,
    step_law,
    target_law,
    tree_p_rows,
)
from decoding.tree import DraftTree, children_lists
from verifiers import chain_equivalent_methods
from verifiers.ot import OTMethod, spectr_params
from verifiers.ratios import RatioTable

TOL = 1e-12
SHAPES = [Action(k, l1, l2) for k in (1, 2, 3) for l1 in range(4) for l2 in range(4 - l1)]
CHAIN_SHAPES = [a for a in SHAPES if a.is_chain and a.tree_size > 0]


def _pairs(action: Action) -> list[TablePair]:
    """Vocabulary 4 where the enumeration is small, 3 for the largest trees (keeps the file fast)."""
    if action.tree_size <= 4:
        return [TablePair(4, seed) for seed in (0, 1, 2)]
    return [TablePair(3, seed) for seed in (0, 1)]


def _cases() -> list:
    """(method, shape) pairs; chain-only methods (naive, bv) only on chains."""
    return [pytest.param(n, a, id=f"{n}-{a}") for n in sorted(METHODS) for a in SHAPES
            if a.is_chain or not METHODS[n].chains_only]


@pytest.mark.parametrize(("name", "action"), _cases())
def test_first_two_tokens_exact(name: str, action: Action) -> None:
    method = METHODS[name]
    for pair in _pairs(action):
        trees = list(enumerate_trees(action, pair))
        assert abs(sum(prob for _, prob in trees) - 1.0) < TOL
        assert all(method.supports(t) for t, _ in trees)
        law = step_law(action, pair, method)
        assert min(law.values()) >= -TOL and abs(sum(law.values()) - 1.0) < TOL
        err = law_distance(emitted_law(action, pair, method, n_tokens=2), target_law(pair, 2))
        assert err < TOL, f"{name} {action} tables seed {pair.seed}: joint law of 2 tokens off by {err:.3g}"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_first_three_tokens_exact(name: str) -> None:
    pair = TablePair(3, 7)
    for action in (Action(1, 1, 1), Action(2, 0, 1), Action(2, 1, 1)):
        if METHODS[name].supports(next(enumerate_trees(action, pair))[0]):
            err = law_distance(emitted_law(action, pair, name, n_tokens=3), target_law(pair, 3))
            assert err < TOL, f"{name} {action}: 3-token law off by {err:.3g}"


def _chain_gaps(name: str, action: Action) -> tuple[float, float]:
    """Largest difference from naive's, over the pairs and contexts of ``action`` (a chain): of the step law, and
    of the exact label E[accepted + 1] of each drafted chain."""
    law_gap = label_gap = 0.0
    for pair in _pairs(action):
        for ctx in ((), (0,), (1,)):
            law_gap = max(law_gap, law_distance(step_law(action, pair, name, ctx), step_law(action, pair, "naive", ctx)))
            for tree, _ in enumerate_trees(action, pair, ctx):
                p_rows = tree_p_rows(tree, pair, ctx)
                label_gap = max(label_gap, abs(exact_block_efficiency(tree, p_rows, name)
                                               - exact_block_efficiency(tree, p_rows, "naive")))
    return law_gap, label_gap


@pytest.mark.parametrize("action", CHAIN_SHAPES, ids=str)
@pytest.mark.parametrize("name", chain_equivalent_methods())
def test_chain_equivalent_methods_verify_a_chain_as_naive(name: str, action: Action) -> None:
    """On chains the step law and every chain's label equal standard speculative sampling's (ALGORITHMS.md 3: with
    one child every OT solver reduces to it)."""
    law_gap, label_gap = _chain_gaps(name, action)
    assert law_gap < TOL and label_gap < TOL, f"{name} {action}: differs from naive by {law_gap:.3g} / {label_gap:.3g}"


@pytest.mark.parametrize("name", sorted(set(METHODS) - set(chain_equivalent_methods())))
def test_the_other_methods_do_not_verify_chains_as_naive(name: str) -> None:
    """nss (emits y ~ p, accepting x with p(x) <= min(1, p(x)/q(x))), traversal and bv (Block Verification), gbv
    (with K = 1, Block Verification) each differ from naive on some chain, in law and in labels."""
    gaps = [_chain_gaps(name, a) for a in CHAIN_SHAPES]
    assert max(g[0] for g in gaps) > 1e-3 and max(g[1] for g in gaps) > 1e-3, (name, gaps)


def test_chain_equivalent_methods_are_registered():
    assert set(chain_equivalent_methods()) <= set(METHODS) and "naive" in chain_equivalent_methods()


@pytest.mark.parametrize("name", sorted(n for n, m in METHODS.items() if m.exact_block_efficiency))
def test_block_efficiency_equals_outcome_law(name: str) -> None:
    """expected_block_efficiency (the DP, or Traversal's schedule) = E[len(tokens)] under the exact law."""
    method = METHODS[name]
    for action in (Action(1, 2, 1), Action(3, 1, 2), Action(2, 0, 3), Action(3, 2, 1)):
        pair = TablePair(3, 11)
        for tree, _ in enumerate_trees(action, pair):
            if not method.supports(tree):
                break
            p_rows = tree_p_rows(tree, pair)
            assert abs(method.expected_block_efficiency(tree, p_rows) - exact_block_efficiency(tree, p_rows, method)) < TOL


@pytest.mark.parametrize("name", sorted(METHODS))
def test_verify_samples_the_exact_law(name: str) -> None:
    """Chi-square: frequencies of verify()'s res.tokens on fixed trees match outcome_distribution,
    so the sampling path and the exact law describe the same algorithm."""
    method = METHODS[name]
    pair = TablePair(4, 3)
    rng = np.random.default_rng(5)
    action = Action(3, 1, 1) if not method.chains_only else Action(1, 1, 2)
    trees = [t for t, _ in enumerate_trees(action, pair)]
    n = 3000
    for tree in (trees[0], trees[len(trees) // 2]):
        p_rows = tree_p_rows(tree, pair)
        law = method.outcome_distribution(tree, p_rows)
        counts: dict = {}
        for _ in range(n):
            accepted, token = method.verify(tree, p_rows, rng)
            key = tuple(int(tree.tokens[i]) for i in accepted) + (token,)
            counts[key] = counts.get(key, 0) + 1
        assert set(counts) <= {k for k, m in law.items() if m > 0}, "sampled an outcome of probability 0"
        chi2 = sum((counts.get(k, 0) - n * m) ** 2 / (n * m) for k, m in law.items() if m > 0)
        dof = max(sum(m > 0 for m in law.values()) - 1, 1)
        assert chi2 < dof + 6 * np.sqrt(2 * dof), (name, chi2, dof)


# ---------------------------------------------------------------- the harness has power


def _stitched_trunk_trees(pair: TablePair, k: int):
    """The known third-party bug: K copies of the ONE trunk draw under the root, each with its own
    rollout token. Not a valid i.i.d. tree."""
    parents = np.array([-1] + [0] * k + list(range(1, k + 1)), dtype=np.int64)
    depths = np.array([0] + [1] * k + [2] * k, dtype=np.int64)
    q0 = pair.q(())
    for x in np.flatnonzero(q0 > 0):
        q1 = pair.q((int(x),))
        for ys in np.ndindex(*(pair.vocab_size,) * k):
            prob = float(q0[x]) * float(np.prod([q1[y] for y in ys]))
            if prob == 0:
                continue
            tokens = np.array([-1] + [x] * k + list(ys), dtype=np.int64)
            q_rows = np.zeros((2 * k + 1, pair.vocab_size))
            q_rows[0] = q0
            q_rows[1 : k + 1] = q1
            yield DraftTree(Action(k, 0, 2), tokens, parents, depths, children_lists(parents), q_rows), prob


@pytest.mark.parametrize("name", [n for n in ("spectr", "khisti") if n in METHODS])
def test_trunk_multiplicity_trap_is_lossy(name: str) -> None:
    """Copies of one draw are not i.i.d. draws. (SpecInfer happens to be immune at such a node: after
    rejecting x its residual has r(x) = 0, so a copy of x is never accepted; spectr and khisti are not.)"""
    pair = TablePair(3, 6)
    law: dict = {}
    for tree, prob in _stitched_trunk_trees(pair, 2):
        for key, mass in METHODS[name].outcome_distribution(tree, tree_p_rows(tree, pair)).items():
            law[key[:1]] = law.get(key[:1], 0.0) + prob * mass
    assert law_distance(law, target_law(pair, 1)) > 1e-3


class _LossySolver:
    """Speculative sampling that emits y ~ p (not the residual) after a rejection: biased."""

    name = "lossy"

    def sample(self, p, q, children, rng):  # pragma: no cover - only the law is used
        raise NotImplementedError

    def output_distribution(self, p, q, children):
        x = children[0]
        a = min(1.0, p[x] / q[x])
        out = (1 - a) * np.asarray(p, dtype=np.float64)
        out[x] += a
        return out


def test_harness_detects_a_lossy_solver() -> None:
    lossy = OTMethod("lossy", _LossySolver())
    pair = TablePair(3, 0)
    assert law_distance(emitted_law(Action(1, 0, 2), pair, lossy), target_law(pair)) > 1e-3
    assert dataclasses.is_dataclass(lossy)


# ---------------------------------------------------------------- spectr's rho*


def _c(beta: float, k: int) -> float:
    return sum((1 - beta) ** i for i in range(k))


def _beta(p, q, rho):
    return float(np.minimum(q, p / rho).sum())


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_spectr_rho_solves_the_equation(k: int) -> None:
    rng = np.random.default_rng(k)
    for _ in range(200):
        v = int(rng.integers(2, 40))
        p = rng.dirichlet(np.full(v, 0.5)) * (rng.random(v) < 0.8)
        q = rng.dirichlet(np.full(v, 0.5)) * (rng.random(v) < 0.8)
        if p.sum() == 0 or q.sum() == 0:
            continue
        p, q = p / p.sum(), q / q.sum()
        rho = spectr_params(p, q, k)[0]
        assert 1.0 <= rho <= k
        g = _c(_beta(p, q, rho), k) - rho
        assert g <= 1e-12, "residual would be negative"
        assert g > -1e-9 or rho == 1.0, f"rho {rho} is not a root (g = {g})"


def test_spectr_rho_edge_cases() -> None:
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.0, 0.0, 0.3, 0.7])
    assert spectr_params(p, q, 3)[0] == pytest.approx(3.0)  # beta = 0: no token can be accepted
    assert spectr_params(p, p, 3)[0] == 1.0  # p == q: accept everything
    assert spectr_params(p, q, 1)[0] == 1.0
    onehot = np.array([0.0, 1.0, 0.0, 0.0])
    assert spectr_params(onehot, onehot, 4)[0] == 1.0


def _reference_spectr(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, float, float]:
    """(rho*, c, mass) from the definitions over the whole vocabulary: the same search rule as
    spectr_numerics (first edge 1 + i/16 with g <= 0, then the first ratio inside that bucket with
    g <= 0, then the root on that piece) but with g evaluated directly and the root by bisection."""
    def g(rho: float) -> float:
        return _c(_beta(p, q, rho), k) - rho

    rho = 1.0
    if k > 1 and g(1.0) > 0:
        edge = next(e for e in 1 + np.arange(1, 16 * (k - 1) + 1) / 16 if g(e) <= 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = p / q
        inside = np.sort(s[(s > edge - 1 / 16) & (s < edge)])
        hi = next((x for x in inside if g(x) <= 0), edge)
        lo = max([edge - 1 / 16, *inside[inside < hi]])
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if g(mid) <= 0 else (mid, hi)
        rho = hi
    c = _c(_beta(p, q, rho), k)
    return rho, c, float(np.maximum(p - c * np.minimum(q, p / rho), 0.0).sum())


def _rows_with_zeros_and_ties(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    v = int(rng.integers(2, 40))
    q = rng.dirichlet(np.full(v, 0.5)) * (rng.random(v) < 0.8)
    p = rng.dirichlet(np.full(v, 0.5)) * (rng.random(v) < 0.8)
    tied = rng.random(v) < 0.4  # one shared ratio (1.1875 = 1 + 3/16, a bucket edge, before normalizing)
    p[tied] = q[tied] * rng.choice([1.0, 1.1875, 2.0])
    return p / max(p.sum(), 1e-300), q / max(q.sum(), 1e-300)


@pytest.mark.parametrize("kmax", [1, 2, 4, 8])
def test_spectr_kernel_matches_the_definitions(kmax: int) -> None:
    """RatioTable.spectr (compiled buckets, pieces, one residual pass for every k) against a direct
    evaluation; entries for k <= kmax do not depend on kmax."""
    rng = np.random.default_rng(100 + kmax)
    for _ in range(150):
        p, q = _rows_with_zeros_and_ties(rng)
        if p.sum() == 0 or q.sum() == 0:
            continue
        rho, c, mass = RatioTable.build(p, q).spectr(kmax)
        for k in range(1, kmax + 1):
            ref = _reference_spectr(p, q, k)
            assert rho[k - 1] == pytest.approx(ref[0], rel=1e-12, abs=0), f"k={k}: rho"
            assert c[k - 1] == pytest.approx(ref[1], rel=1e-12, abs=0), f"k={k}: c"
            assert mass[k - 1] == pytest.approx(ref[2], rel=0, abs=1e-12), f"k={k}: mass"
            alone = RatioTable.build(p, q).spectr(k)
            assert (alone[0][k - 1], alone[1][k - 1], alone[2][k - 1]) == (rho[k - 1], c[k - 1], mass[k - 1])


def test_spectr_rho_when_q_is_p_up_to_rounding():
    """A draft equal to the target up to float noise (e.g. the target as its own draft) once made the
    bracketed root solver divide by zero: g was positive at both ends of its bracket by ~1e-16."""
    from verifiers.ratios import RatioTable

    rng = np.random.default_rng(0)
    for trial in range(500):
        p = rng.dirichlet(np.ones(50) * 0.3)
        q = np.abs(p * (1 + rng.normal(size=50) * 10 ** rng.uniform(-9, -5)))
        q /= q.sum()
        if trial % 3 == 0:
            p[rng.integers(50)] = 0
            p /= p.sum()
        rho, c, mass = RatioTable.build(p, q).spectr(3)
        assert np.all((rho >= 1) & (rho <= np.arange(1, 4) + 1e-12)) and np.all(np.isfinite(mass)), trial
