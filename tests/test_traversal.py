"""Traversal Verification (ALGORITHMS.md section 3.2): exact losslessness, literal-spec cross-check,
Block Verification reduction and optimality on chains, the lossy public w-update, sampling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from decoding.actions import Action
from decoding.exact import (
    SECTION7_SHAPES,
    TablePair,
    emitted_law,
    enumerate_trees,
    exact_block_efficiency,
    law_distance,
    target_law,
    tree_p_rows,
)
from decoding.tree import DraftTree, children_lists
from verifiers import get_method
from verifiers.registry import BottomUpMethod
from verifiers.traversal import (
    traversal_expected_block_efficiency,
    traversal_expected_block_efficiency_mc,
    traversal_outcome_distribution,
    traversal_schedule,
    traversal_verify,
)

# ---------------------------------------------------------------- exact enumeration (decoding/exact.py)

SHAPES = SECTION7_SHAPES  # every delayed tree with L1 + L2 <= 3, K <= 3


def trees(action: Action, pair: TablePair, limit: int | None = None):
    """(tree, p_rows, probability) for the draft outcomes of `action` (the first `limit` ones)."""
    for tree, prob in itertools.islice(enumerate_trees(action, pair), limit):
        yield tree, tree_p_rows(tree, pair), prob


def first_two_error(action: Action, pair: TablePair, method) -> float:
    """max |P(first two emitted tokens) - p(a) p(b|a)| over the exact enumeration."""
    return law_distance(emitted_law(action, pair, method, 2), target_law(pair, 2))


# ---------------------------------------------------------------- literal reference of the spec


def literal_outcome_law(tree, p_rows, public_variant: bool = False) -> dict[tuple[int, ...], float]:
    """Traversal Verification exactly as ALGORITHMS.md 3.2 states it (full vectors, explicit deletion,
    enumeration over the eta tests). `public_variant` uses the lossy w(A) = S / (1 - M_s(X|A))."""
    n = len(tree.tokens)
    Mb = {i: p_rows[i].copy() for i in range(n)}
    Ms = {i: tree.q_rows[i].copy() for i in range(n)}
    alive = set(range(n))
    w = {0: 1.0}

    def kids(i):
        return [c for c in tree.children[i] if c in alive]

    def reweight(i):  # init rule for the remaining descendants of i
        for c in kids(i):
            x = tree.tokens[c]
            w[c] = min(w[i] * Mb[i][x] / Ms[i][x], 1.0)
            reweight(c)

    def path(i):
        return tuple(int(tree.tokens[m]) for m in tree_path(tree.parents, i))

    reweight(0)
    out: dict[tuple[int, ...], float] = {}

    def delete(leaf):  # leaf was rejected; update its parent (cascading removals of w = 0 nodes)
        stack = [leaf]
        while stack:
            j = stack.pop()
            alive.difference_update(subtree(tree, j))
            a = int(tree.parents[j])
            s = float(np.maximum(w[a] * Mb[a] - Ms[a], 0.0).sum())
            if s > 0.0:
                Mb[a] = np.maximum(w[a] * Mb[a] - Ms[a], 0.0) / s
            if a != 0:
                denom = 1.0 - Ms[a][tree.tokens[j]] if public_variant else s + 1.0 - w[a]
                w[a] = s / denom if s > 0.0 and denom > 0.0 else float(s > 0.0)
                if w[a] <= 0.0:
                    stack.append(a)
                    continue
            reweight(a)

    prob = 1.0
    while True:
        leaf = 0
        while kids(leaf):
            leaf = kids(leaf)[0]
        a = 1.0 if leaf == 0 else min(w[leaf], 1.0)
        for y in np.flatnonzero(Mb[leaf]):
            key = path(leaf) + (int(y),)
            out[key] = out.get(key, 0.0) + prob * a * float(Mb[leaf][y])
        prob *= 1.0 - a
        if prob <= 0.0:
            return out
        delete(leaf)


def tree_path(parents, i):
    """Node indices from the root (excluded) down to node i."""
    nodes = []
    while i > 0:
        nodes.append(i)
        i = int(parents[i])
    return nodes[::-1]


def subtree(tree, i):
    nodes = [i]
    for j in nodes:
        nodes.extend(tree.children[j])
    return nodes


# ---------------------------------------------------------------- Block Verification (Sun et al. 2024)


def bv_outcome_law(tree, p_rows) -> dict[tuple[int, ...], float]:
    """Block Verification on a chain, written from the BV paper's formulation (h_i, then tau)."""
    chain = tree_path(tree.parents, len(tree.tokens) - 1)
    gamma = len(chain)
    rows = [0] + chain
    X = [int(tree.tokens[m]) for m in chain]
    eta = [1.0]
    for i in range(1, gamma + 1):
        P, Q = p_rows[rows[i - 1]], tree.q_rows[rows[i - 1]]
        eta.append(min(eta[-1] * P[X[i - 1]] / Q[X[i - 1]], 1.0))
    h, res = [0.0] * (gamma + 1), [None] * (gamma + 1)
    for i in range(gamma + 1):
        if i == gamma:
            h[i], res[i] = eta[i], p_rows[rows[i]]
            continue
        diff = np.maximum(eta[i] * p_rows[rows[i]] - tree.q_rows[rows[i]], 0.0)
        num = diff.sum()
        h[i] = num / (num + 1.0 - eta[i]) if num > 0 else 0.0
        res[i] = diff / num if num > 0 else p_rows[rows[i]]
    out: dict[tuple[int, ...], float] = {}
    for i in range(gamma, -1, -1):
        stop = (1.0 if i == 0 else h[i]) * np.prod([1.0 - h[j] for j in range(i + 1, gamma + 1)])
        for y in np.flatnonzero(res[i]):
            key = tuple(X[:i]) + (int(y),)
            out[key] = out.get(key, 0.0) + stop * float(res[i][y])
    return out


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("action", SHAPES, ids=str)
def test_exact_first_two_tokens(action):
    for pair in (TablePair(3, seed=0), TablePair(3, seed=1)):
        assert first_two_error(action, pair, "traversal") < 1e-12
        if action.is_chain:
            assert first_two_error(action, pair, "bv") < 1e-12


def test_exact_vocab_four():
    for action in (Action(3, 0, 2), Action(2, 1, 2), Action(1, 3, 0)):
        assert first_two_error(action, TablePair(4, seed=2), "traversal") < 1e-12


def test_schedule_matches_literal_spec():
    for seed in range(6):
        pair = TablePair(3, seed=100 + seed)
        for action in (Action(3, 1, 2), Action(2, 0, 3), Action(1, 3, 0)):
            for tree, p_rows, _ in trees(action, pair, limit=40):
                fast = traversal_outcome_distribution(tree, p_rows)
                assert law_distance(fast, literal_outcome_law(tree, p_rows)) < 1e-12
                assert abs(sum(fast.values()) - 1.0) < 1e-12


def test_general_tree_shape_is_lossless():
    """Not only delayed trees: a bushy tree (i.i.d. children at every node) is exact too."""
    pair, V = TablePair(3, seed=3), 3
    parents = np.array([-1, 0, 0, 1, 1, 2])
    depths = np.array([0, 1, 1, 2, 2, 2])
    children = children_lists(parents)
    law: dict = {}
    for toks in itertools.product(range(V), repeat=5):
        tokens = np.array([-1, *toks])
        paths = [tuple(int(tokens[m]) for m in tree_path(parents, i)) for i in range(6)]
        prob = np.prod([pair.q(paths[parents[i]])[tokens[i]] for i in range(1, 6)])
        if prob == 0:
            continue
        tree = DraftTree(Action(1, 0, 0), tokens, parents, depths, children, np.array([pair.q(c) for c in paths]))
        for seq, pr in traversal_outcome_distribution(tree, np.array([pair.p(c) for c in paths])).items():
            # a one-token step is followed by target sampling (later steps are lossless by the same test)
            ext = [(seq[:2], 1.0)] if len(seq) >= 2 else [((seq[0], b), pair.p(seq)[b]) for b in range(V)]
            for key, c in ext:
                law[key] = law.get(key, 0.0) + prob * pr * c
    assert law_distance(law, target_law(pair, 2)) < 1e-12


def test_chain_equals_block_verification():
    for seed in range(5):
        pair = TablePair(4, seed=200 + seed)
        for action in (Action(1, 0, 3), Action(1, 2, 2), Action(1, 4, 0)):
            for tree, p_rows, _ in trees(action, pair, limit=30):
                assert law_distance(traversal_outcome_distribution(tree, p_rows), bv_outcome_law(tree, p_rows)) < 1e-12


def test_block_verification_beats_tokenwise_on_chains():
    """E[accepted tokens] of BV >= naive token-wise speculative sampling (BV is optimal on chains)."""
    gains = []
    for seed in range(8):
        pair = TablePair(3, seed=300 + seed)
        for gamma in (2, 3, 4):
            e_bv = e_naive = 0.0
            for tree, p_rows, prob in trees(Action(1, gamma, 0), pair):
                e_bv += prob * traversal_expected_block_efficiency(tree, p_rows)
                e_naive += prob * get_method("naive").expected_block_efficiency(tree, p_rows)
            assert e_bv >= e_naive - 1e-12
            gains.append(e_bv - e_naive)
    assert max(gains) > 1e-3  # strictly better somewhere


def test_public_w_update_is_lossy():
    """ALGORITHMS.md's caution: w(A) = S / (1 - M_s(X|A)) is not lossless; the spec's formula is."""
    def method(public: bool) -> BottomUpMethod:
        return BottomUpMethod("literal", traversal_verify, lambda t, p: literal_outcome_law(t, p, public))

    pair, action = TablePair(3, seed=5), Action(2, 0, 2)  # error 0.075 (0 on some other seeds)
    assert first_two_error(action, pair, method(False)) < 1e-12
    assert first_two_error(action, pair, method(True)) > 1e-6


def test_sampling_matches_exact_law():
    tree, p_rows, _ = next(trees(Action(3, 1, 2), TablePair(3, seed=21), limit=None))
    exact = traversal_outcome_distribution(tree, p_rows)
    rng = np.random.default_rng(0)
    N = 10000
    counts: dict = {}
    for _ in range(N):
        nodes, y = traversal_verify(tree, p_rows, rng)
        key = tuple(int(tree.tokens[m]) for m in nodes) + (y,)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    for key, pr in exact.items():
        assert abs(counts.get(key, 0) - N * pr) <= 6 * np.sqrt(N * pr * (1 - pr)) + 1


def test_block_efficiency_exact_and_mc_agree():
    tree, p_rows, _ = next(trees(Action(3, 2, 3), TablePair(4, seed=8)))
    exact = traversal_expected_block_efficiency(tree, p_rows)
    assert abs(exact - exact_block_efficiency(tree, p_rows, "traversal")) < 1e-12
    mean, se = traversal_expected_block_efficiency_mc(tree, p_rows, 20000, np.random.default_rng(1))
    assert abs(mean - exact) < 6 * se + 1e-9


def test_sub_tree_nodes_match_copied_sub_tree():
    """`nodes=` on a union tree gives the same schedule as the copied sub-tree."""
    pair = TablePair(4, seed=9)
    big, p_big, _ = next(trees(Action(3, 1, 2), pair))
    small, p_small, _ = next(trees(Action(2, 1, 1), pair))
    keep = [0, 1, 2, 4]  # root, trunk, first node of rollouts 1 and 2 (the same draws as `small`)
    cache: dict = {}
    a = traversal_expected_block_efficiency(big, p_big, nodes=keep, mass_cache=cache)
    assert len(cache) > 0
    assert abs(a - traversal_expected_block_efficiency(small, p_small)) < 1e-12
    assert traversal_expected_block_efficiency(big, p_big, nodes=keep, mass_cache=cache) == a
    with pytest.raises(ValueError, match="parent"):
        traversal_schedule(big, p_big, nodes=[0, 3])


def test_bad_input_errors():
    tree, p_rows, _ = next(trees(Action(2, 0, 1), TablePair(3, seed=1)))
    with pytest.raises(ValueError, match="p_rows"):
        traversal_verify(tree, p_rows[:2], np.random.default_rng(0))
    bad_q = tree.q_rows.copy()
    bad_q[0, tree.tokens[1]] = 0.0
    bad = DraftTree(tree.action, tree.tokens, tree.parents, tree.depths, tree.children, bad_q)
    with pytest.raises(ValueError, match="q = 0"):
        traversal_outcome_distribution(bad, p_rows)
