"""Draft trees and the union tree (ALGORITHMS.md sections 2 and 4)."""

from __future__ import annotations

import numpy as np
import pytest

from decoding import Action, ActionSpace, sample_tree, target_rows, verify
from decoding.exact import TablePair, enumerate_trees
from decoding.tree import tree_layout
from decoding.union_tree import sample_union_tree, union_from_tokens, union_layout


def _rows(vocab: int, seed: int):
    def fn(prefix):
        return np.random.default_rng([seed, len(prefix), *prefix]).dirichlet(np.ones(vocab))
    return fn


@pytest.mark.parametrize("action", [Action(1, 0, 0), Action(3, 0, 2), Action(2, 3, 1), Action(4, 2, 0)], ids=str)
def test_structure(action: Action) -> None:
    tree = sample_tree(action, _rows(7, 0), np.random.default_rng(0))
    tree.validate()
    assert tree.num_nodes == 1 + action.tree_size and tree.vocab_size == 7
    assert tree.tokens[0] == -1 and tree.parents[0] == -1
    assert np.all(tree.parents[1:] < np.arange(1, tree.num_nodes))
    for j in range(action.L1):  # trunk multiplicity is 1
        assert tree.children[j] == [j + 1]
    branch = tree.branch_node
    assert tree.depths[branch] == action.L1
    assert len(tree.children[branch]) == (action.K if action.L2 else 0)
    assert max(tree.depths) == action.L1 + action.L2
    for i in range(1, tree.num_nodes):
        path = tree.path_tokens(i)
        assert len(path) == tree.depths[i] and path[-1] == tree.tokens[i]
        np.testing.assert_array_equal(tree.q_rows[tree.parents[i]], _rows(7, 0)(path[:-1]))


def test_duplicate_children_stay_separate_nodes() -> None:
    onehot = np.array([0.0, 1.0, 0.0])
    tree = sample_tree(Action(3, 1, 2), lambda prefix: onehot, np.random.default_rng(0))
    assert tree.child_tokens(1) == [1, 1, 1] and len(tree.children[1]) == 3
    assert tree.num_nodes == 1 + 1 + 3 * 2


def test_node_law_matches_enumeration() -> None:
    """Chi-square: the frequency of each drafted tree matches its exact probability."""
    action, pair = Action(2, 1, 1), TablePair(4, 0)
    exact = {tuple(t.tokens): prob for t, prob in enumerate_trees(action, pair)}
    rng = np.random.default_rng(1)
    n = 8000
    counts: dict = {}
    for _ in range(n):
        key = tuple(sample_tree(action, pair.q, rng).tokens)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    dof = len(exact) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)


def test_bad_inputs_are_named() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="sums to"):
        sample_tree(Action(1, 1, 0), lambda prefix: np.array([0.5, 0.2]), rng)
    with pytest.raises(ValueError, match="NaN"):
        sample_tree(Action(1, 1, 0), lambda prefix: np.array([np.nan, 1.0]), rng)
    with pytest.raises(ValueError, match="1-D"):
        sample_tree(Action(1, 1, 0), lambda prefix: np.ones((2, 2)) / 4, rng)
    tree = sample_tree(Action(2, 0, 1), _rows(5, 1), rng)
    with pytest.raises(ValueError, match="expected shape"):
        target_rows(tree, np.ones((2, 5)) / 5)
    with pytest.raises(ValueError, match="vocabulary"):
        target_rows(tree, lambda prefix: np.ones(4) / 4)
    with pytest.raises(ValueError, match="unknown verification method 'nope'; known: .*specinfer"):
        verify(tree, _rows(5, 2), "nope", rng)
    with pytest.raises(ValueError, match="chains only"):
        verify(sample_tree(Action(2, 0, 1), _rows(5, 1), rng), _rows(5, 2), "naive", rng)


# ---------------------------------------------------------------- union tree


def test_union_layout_contains_every_action() -> None:
    space = ActionSpace(K=range(1, 4), L1=range(0, 3), L2=range(0, 3))
    parents, depths, rollouts = union_layout(space)
    assert parents.shape[0] == 1 + 2 + 3 * 3 * 2
    union = sample_union_tree(space, _rows(6, 3), np.random.default_rng(2))
    union.tree.validate()
    for a in space:
        sub = union.subtree(a)
        sub.validate()
        want_parents, want_depths = tree_layout(a)
        np.testing.assert_array_equal(sub.parents, want_parents)
        np.testing.assert_array_equal(sub.depths, want_depths)
        for i in range(1, sub.num_nodes):  # every node's q row is q(.|its own path)
            np.testing.assert_allclose(sub.q_rows[sub.parents[i]], _rows(6, 3)(sub.path_tokens(sub.parents[i])))
    with pytest.raises(ValueError, match="not covered"):
        union.subtree_nodes(Action(4, 0, 1))
    with pytest.raises(ValueError, match="tokens"):
        union_from_tokens(space, np.zeros(3), union.tree.q_rows)


def test_union_subtree_is_sample_tree_with_a_deterministic_draft() -> None:
    """With one-hot drafts both samplers must produce exactly the same tree."""
    def draft(prefix):
        row = np.zeros(5)
        row[(sum(prefix) * 3 + len(prefix)) % 5] = 1.0
        return row
    space = ActionSpace(K=range(1, 4), L1=range(0, 3), L2=range(0, 3))
    union = sample_union_tree(space, draft, np.random.default_rng(0))
    for a in space:
        got, want = union.subtree(a), sample_tree(a, draft, np.random.default_rng(1))
        np.testing.assert_array_equal(got.tokens, want.tokens)
        assert got.children == want.children


def test_union_subtree_law_matches_enumeration() -> None:
    """Chi-square: the sub-tree of action a drafted inside the union tree has sample_tree's law."""
    space = ActionSpace(K=range(1, 3), L1=range(0, 2), L2=range(0, 2))
    pair = TablePair(4, 0)
    rng = np.random.default_rng(3)
    n = 4000
    unions = [sample_union_tree(space, pair.q, rng) for _ in range(n)]
    for a in (Action(2, 1, 1), Action(2, 0, 1), Action(1, 1, 0)):
        exact = {tuple(t.tokens): prob for t, prob in enumerate_trees(a, pair)}
        counts: dict = {}
        for u in unions:
            key = tuple(u.subtree(a).tokens)
            counts[key] = counts.get(key, 0) + 1
        assert set(counts) <= set(exact)
        chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
        dof = max(len(exact) - 1, 1)
        assert chi2 < dof + 6 * np.sqrt(2 * dof), (a, chi2, dof)


def test_validate_names_the_problem() -> None:
    tree = sample_tree(Action(2, 1, 1), _rows(5, 4), np.random.default_rng(0))
    tree.parents = tree.parents.copy()
    tree.parents[2] = 3
    with pytest.raises(ValueError, match="node 2 has parent 3"):
        tree.validate()
    tree = sample_tree(Action(2, 1, 1), _rows(5, 4), np.random.default_rng(0))
    tree.q_rows = tree.q_rows.copy()
    tree.q_rows[1, tree.tokens[2]] = 0.0
    tree.q_rows[1] /= tree.q_rows[1].sum()
    with pytest.raises(ValueError, match="has q = 0 under its parent"):
        tree.validate()
