"""GBV (ALGORITHMS.md 3.3, verifiers/gbv.py): exact losslessness on every section-7 shape,
K = 1 is ``bv`` exactly, the scaled lexicographic-maximum law against brute force, the sort-free
numerics against the sorted reference, and the label against repeated verification.
(The registry-wide suites also cover ``gbv``: test_verifiers_exact.py, test_labels.py.)"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from decoding import METHODS, Action, ActionSpace, target_rows
from decoding.exact import (
    SECTION7_SHAPES,
    TablePair,
    emitted_law,
    enumerate_trees,
    law_distance,
    target_law,
    tree_p_rows,
)
from decoding.labels import union_labels
from decoding.tree import DraftTree, children_lists
from decoding.union_tree import sample_union_tree
from verifiers.gbv import greater, lexmax_row, ratio_keys
from verifiers.gbv_numerics import LO, NB, NodeBuffers, excess, lexmax_at

TOL = 1e-12


@pytest.mark.parametrize("action", SECTION7_SHAPES, ids=str)
def test_first_two_tokens_exact(action: Action) -> None:
    """Every shape with L1 + L2 <= 3, K <= 3; tables with zeros in p and q, identical rows, disjoint
    supports and one-hot drafts (exact.TablePair)."""
    pairs = [TablePair(4, s) for s in (20, 21)] if action.tree_size <= 4 else [TablePair(3, s) for s in (20, 21, 22)]
    for pair in pairs:
        err = law_distance(emitted_law(action, pair, "gbv", 2), target_law(pair, 2))
        assert err < TOL, f"gbv {action} seed {pair.seed}: off by {err:.3g}"


@pytest.mark.parametrize("action", [a for a in SECTION7_SHAPES if a.is_chain] + [Action(3, 1, 0)], ids=str)
def test_k1_is_bv_exactly(action: Action) -> None:
    """On chains (K = 1, or L2 = 0 whatever K) GBV's outcome law equals bv's bit for bit."""
    gbv, bv = METHODS["gbv"], METHODS["bv"]
    for pair in (TablePair(4, 3), TablePair(3, 9)):
        for tree, _ in enumerate_trees(action, pair):
            p_rows = tree_p_rows(tree, pair)
            assert gbv.outcome_distribution(tree, p_rows) == bv.outcome_distribution(tree, p_rows)
            assert gbv.expected_block_efficiency(tree, p_rows) == bv.expected_block_efficiency(tree, p_rows)


def test_lexmax_law_against_brute_force() -> None:
    """The scaled form: first token (rho = 1) and second token (rho updated) of the lexicographic
    maximum of K i.i.d. two-token paths, against enumeration of all K-tuples of paths."""
    pair = TablePair(3, 5)
    V = 3
    for k in (2, 3):
        p0, q0 = pair.p(()), pair.q(())
        s0 = ratio_keys(p0, q0)
        law: dict[tuple[int, int], float] = {}
        for paths in itertools.product(itertools.product(range(V), repeat=2), repeat=k):
            prob = np.prod([q0[a] * pair.q((a,))[b] for a, b in paths])
            if prob == 0:
                continue
            best = paths[0]
            for a, b in paths[1:]:
                s1 = ratio_keys(pair.p((a,)), pair.q((a,)))
                if greater(s0, a, best[0]) or (a == best[0] and greater(s1, b, best[1])):
                    best = (a, b)
            law[best] = law.get(best, 0.0) + prob
        first = lexmax_row(p0, q0, 1.0, k)
        for a in range(V):
            assert abs(first[a] - sum(m for (x, _), m in law.items() if x == a)) < TOL
            if first[a] == 0:
                continue
            g = (q0 * ((s0 < s0[a]) | ((s0 == s0[a]) & (np.arange(V) >= a)))).sum()
            second = lexmax_row(pair.p((a,)), pair.q((a,)), q0[a] / g, k)
            for b in range(V):
                assert abs(first[a] * second[b] - law.get((a, b), 0.0)) < TOL, (k, a, b)


def _rows(rng: np.random.Generator, v: int) -> tuple[np.ndarray, np.ndarray]:
    q = rng.dirichlet(np.full(v, 0.3)) * (rng.random(v) < 0.8)
    p = rng.dirichlet(np.full(v, 0.3)) * (rng.random(v) < 0.8)
    tied = rng.random(v) < 0.3  # many equal ratios: the token-id tie break matters
    p[tied] = q[tied] * rng.choice([0.5, 1.0, 2.0])
    if q.sum() == 0:
        q[0] = 1.0
    if p.sum() == 0:
        p[1] = 1.0
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("v", [5, 300, 5000])
def test_sort_free_numerics_match_the_sorted_reference(v: int) -> None:
    """excess (bucketed) and lexmax_at against lexmax_row (a full sort); the Dirichlet rows put ratios
    beyond 2^+-40 (the open-ended first and last buckets) and many ties in one bucket."""
    rng = np.random.default_rng(v)
    for _ in range(30):
        p, q = _rows(rng, v)
        buf = NodeBuffers(v)
        node, p_free = buf.fill(p, q)
        bk, mem = buf.bk, buf.members_args()
        s = ratio_keys(p, q)
        drawn = q > 0
        assert np.all((bk == -1) == ~drawn)
        b = bk[drawn].astype(np.int64)
        assert np.all((LO[b] <= s[drawn]) & ((s[drawn] < LO[b + 1]) | (b == NB - 1))), "bucket edges"
        for k in (1, 2, 4):
            rho, w = float(rng.choice([1.0, rng.random()])), float(rng.choice([1.0, rng.random(), 1e-3]))
            row = lexmax_row(p, q, rho, k)
            assert abs(row.sum() - 1.0) < 1e-12
            ref = float(np.maximum(w * p - row, 0.0).sum())
            assert abs(excess(node, mem, p_free, w, rho, k) - ref) < 1e-12
            for t in np.flatnonzero(q > 0)[:20]:
                assert abs(lexmax_at(node, mem, int(t), rho, k)[0] - row[t]) < 1e-14


def test_exact_label_equals_mean_of_repeated_verification() -> None:
    """The exact label within 5 standard errors of the mean of accepted + 1 over verifications."""
    rng = np.random.default_rng(4)
    pair = TablePair(6, 8)
    gbv = METHODS["gbv"]
    for action in (Action(3, 1, 2), Action(4, 0, 3), Action(2, 2, 2)):
        tree = next(t for t, _ in enumerate_trees(action, pair) if len(set(t.tokens[t.children[action.L1]])) > 1)
        p_rows = tree_p_rows(tree, pair)
        exact = gbv.expected_block_efficiency(tree, p_rows)
        eff = np.array([len(gbv.verify(tree, p_rows, rng)[0]) + 1.0 for _ in range(4000)])
        se = eff.std(ddof=1) / np.sqrt(eff.size)
        assert abs(eff.mean() - exact) < 5 * se + 1e-12, (action, exact, eff.mean(), se)


def test_union_estimate_agrees_with_exact() -> None:
    space = ActionSpace(K=range(1, 4), L1=range(0, 3), L2=range(0, 3))
    pair = TablePair(5, 3)
    rng = np.random.default_rng(1)
    union = sample_union_tree(space, pair.q, rng)
    p_rows = target_rows(union.tree, pair.p)
    exact, _ = union_labels(union, p_rows, ["gbv"])
    est, se = union_labels(union, p_rows, ["gbv"], repeats=3000, rng=rng)
    diff = np.abs(est["gbv"] - exact["gbv"])
    assert np.all((diff < 5 * se["gbv"]) | (diff < 1e-12))
    assert np.any(se["gbv"] > 0)


def test_rejects_non_delayed_trees() -> None:
    parents = np.array([-1, 0, 0, 1, 1])  # two branching nodes
    tokens = np.array([-1, 0, 1, 0, 1])
    q_rows = np.array([[0.5, 0.5]] * 3 + [[0.0, 0.0]] * 2)
    tree = DraftTree(Action(1, 0, 0), tokens, parents, np.array([0, 1, 1, 2, 2]), children_lists(parents), q_rows)
    assert not METHODS["gbv"].supports(tree)
    with pytest.raises(ValueError, match="delayed trees"):
        METHODS["gbv"].verify(tree, np.full((5, 2), 0.5), np.random.default_rng(0))
