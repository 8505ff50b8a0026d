"""Labels (ALGORITHMS.md section 4): the exact DP against repeated verification, branching
probabilities against sampling, the fast union-tree path against the reference DP."""

from __future__ import annotations

import numpy as np
import pytest

from decoding import METHODS, Action, ActionSpace, expected_block_efficiency, sample_tree, target_rows, verify
from decoding.exact import TablePair, enumerate_trees, tree_p_rows
from decoding.labels import action_labels, estimate_block_efficiency, reference_union_labels, union_labels
from decoding.union_tree import sample_union_tree
from verifiers.ot import OTMethod

OT_METHODS = sorted(n for n, m in METHODS.items() if isinstance(m, OTMethod) and not m.chains_only)
EXACT_METHODS = sorted(n for n, m in METHODS.items() if m.exact_block_efficiency)


def dirichlet_pair(vocab: int, seed: int, alpha: float = 0.3, zero_frac: float = 0.2):
    """Smooth-ish random conditionals with exact zeros (p and q independent)."""
    cache: dict = {}

    def row(kind: int, prefix: tuple[int, ...]) -> np.ndarray:
        if (kind, prefix) not in cache:
            rng = np.random.default_rng([seed, kind, len(prefix), *prefix])
            v = rng.dirichlet(np.full(vocab, alpha)) * (rng.random(vocab) >= zero_frac)
            if v.sum() == 0:
                v[rng.integers(vocab)] = 1.0
            cache[(kind, prefix)] = v / v.sum()
        return cache[(kind, prefix)]

    return (lambda prefix: row(0, prefix)), (lambda prefix: row(1, prefix))


@pytest.mark.parametrize("name", EXACT_METHODS)
def test_exact_label_matches_repeated_verification(name: str) -> None:
    """DP (or Traversal's exact schedule) within 4 standard errors of the mean of accepted + 1."""
    target, draft = dirichlet_pair(8, 1, alpha=1.0)
    rng = np.random.default_rng(2)
    for action in (Action(3, 1, 2), Action(2, 0, 3), Action(1, 2, 2)):
        tree = sample_tree(action, draft, rng)
        if not METHODS[name].supports(tree):
            continue
        exact = expected_block_efficiency(tree, target, name)
        n = 1500
        mean, se = estimate_block_efficiency(tree, target, name, rng, repeats=n)
        law = METHODS[name].outcome_distribution(tree, target_rows(tree, target))
        exact_se = np.sqrt(max(sum(m * len(t) ** 2 for t, m in law.items()) - exact**2, 0.0) / n)
        assert abs(mean - exact) < 4 * max(se, exact_se) + 1e-12, f"{name} {action}: DP {exact} vs {mean} +- {se}"


@pytest.mark.parametrize("name", OT_METHODS)
def test_branching_probabilities_match_sampling(name: str) -> None:
    """Per-token 5-sigma bound between solver.sample frequencies and output_distribution."""
    solver = METHODS[name].solver
    rng = np.random.default_rng(3)
    target, draft = dirichlet_pair(6, 4, alpha=0.7)
    n = 2500
    for case in range(2):
        p, q = target((case,)), draft((case,))
        children = [int(rng.choice(6, p=q)) for _ in range(3)]
        law = solver.output_distribution(p, q, children)
        assert abs(law.sum() - 1.0) < 1e-12 and law.min() >= 0
        counts = np.bincount([solver.sample(p, q, children, rng) for _ in range(n)], minlength=6)
        sigma = np.sqrt(n * law * (1 - law)) + 1e-9
        assert np.all(np.abs(counts - n * law) <= 5 * sigma + 1e-9), (children, counts, n * law)


@pytest.mark.parametrize("name", OT_METHODS)
def test_verify_walk_uses_first_copy(name: str) -> None:
    """A deterministic draft makes all rollouts identical: acceptance always moves to rollout 1."""
    onehot = np.array([0.0, 1.0, 0.0])
    tree = sample_tree(Action(3, 1, 2), lambda prefix: onehot, np.random.default_rng(0))
    target = np.tile([0.2, 0.8, 0.0], (tree.num_nodes, 1))
    rng = np.random.default_rng(1)
    for _ in range(50):
        res = verify(tree, target, name, rng)
        assert list(res.accepted_nodes) == list(range(1, 1 + res.num_accepted))[:1] + \
            [2 + i for i in range(res.num_accepted - 1)]
        assert len(res.tokens) == res.num_accepted + 1


# ---------------------------------------------------------------- union tree labels


def _union_cases():
    space = ActionSpace(K=range(1, 5), L1=range(0, 4), L2=range(0, 4))
    yield space, TablePair(4, 1)
    yield space, TablePair(5, 2)
    target, draft = dirichlet_pair(40, 5)
    yield ActionSpace(K=range(1, 4), L1=[0, 2, 3], L2=range(0, 5)), (target, draft)
    # no K = 1, no L2 = 0, no L1 = 0: the sweeps must not assume a chain or the root as branch node
    yield ActionSpace(K=[2, 3], L1=[1, 3], L2=range(1, 4)), (target, draft)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_labels_equal_reference(dtype) -> None:
    rng = np.random.default_rng(6)
    for space, pair in _union_cases():
        target, draft = (pair.p, pair.q) if isinstance(pair, TablePair) else pair
        for _ in range(2):
            union = sample_union_tree(space, draft, rng)
            p_rows = target_rows(union.tree, target).astype(dtype)
            values, stderr = union_labels(union, p_rows, sorted(METHODS))
            for name in METHODS:
                ref = reference_union_labels(union, p_rows, name)
                np.testing.assert_array_equal(np.isnan(values[name]), np.isnan(ref))
                np.testing.assert_allclose(values[name], ref, rtol=0, atol=1e-12, err_msg=name)
                assert np.all(stderr[name] == 0)
            for a in space:  # L2 = 0 actions share one label whatever K
                assert values["specinfer"][space.index(a)] == values["specinfer"][space.index(space.canonical(a))]
            assert np.all(np.isnan(values["naive"]) == [not a.is_chain for a in space])


def test_union_labels_are_unbiased() -> None:
    """Mean union-tree label per action == exact E over drafting of the per-tree DP (enumerated)."""
    space = ActionSpace(K=range(1, 3), L1=range(0, 2), L2=range(0, 3))
    pair = TablePair(3, 0)
    rng = np.random.default_rng(7)
    per_tree = np.stack([union_labels(u, target_rows(u.tree, pair.p), ["specinfer"])[0]["specinfer"]
                         for u in (sample_union_tree(space, pair.q, rng) for _ in range(800))])
    mean, se = per_tree.mean(axis=0), per_tree.std(axis=0, ddof=1) / np.sqrt(per_tree.shape[0])
    for i, a in enumerate(space):
        exact = sum(prob * METHODS["specinfer"].expected_block_efficiency(t, tree_p_rows(t, pair))
                    for t, prob in enumerate_trees(a, pair))
        assert abs(mean[i] - exact) < 5 * se[i] + 1e-12, (a, mean[i], exact, se[i])


def test_action_labels_average_trees() -> None:
    space = ActionSpace(K=range(1, 3), L1=range(0, 2), L2=range(0, 2))
    target, draft = dirichlet_pair(10, 9)
    out = action_labels(space, draft, target, ["specinfer", "traversal"], np.random.default_rng(0), num_trees=4)
    assert out.per_tree["specinfer"].shape == (4, len(space))
    np.testing.assert_allclose(out.mean["traversal"], out.per_tree["traversal"].mean(axis=0))
    assert np.all(out.mean["specinfer"] >= 1.0) and np.all(out.mean["specinfer"] <= 1 + 1 + 2)
    assert out.mean["specinfer"][space.index(Action(1, 0, 0))] == 1.0


def test_traversal_labels_by_repeated_verification() -> None:
    """The 64-repeat estimate with its standard error agrees with the exact schedule."""
    space = ActionSpace(K=range(1, 4), L1=range(0, 3), L2=range(0, 3))
    target, draft = dirichlet_pair(12, 10, alpha=1.0)
    rng = np.random.default_rng(11)
    union = sample_union_tree(space, draft, rng)
    p_rows = target_rows(union.tree, target)
    exact, _ = union_labels(union, p_rows, ["traversal"])
    est, se = union_labels(union, p_rows, ["traversal"], repeats=4000, rng=rng)
    z = np.abs(est["traversal"] - exact["traversal"]) / np.maximum(se["traversal"], 1e-12)
    assert np.all((z < 5) | (np.abs(est["traversal"] - exact["traversal"]) < 1e-12))
    with pytest.raises(ValueError, match="rng"):
        union_labels(union, p_rows, ["traversal"], repeats=64)


def test_union_labels_bad_input() -> None:
    space = ActionSpace(K=range(1, 3), L1=range(0, 2), L2=range(0, 2))
    target, draft = dirichlet_pair(6, 12)
    union = sample_union_tree(space, draft, np.random.default_rng(0))
    p_rows = target_rows(union.tree, target)
    bad = p_rows.copy()
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or inf at row 2, token 3"):
        union_labels(union, bad, ["specinfer"])
    bad = p_rows.copy()
    bad[1] *= 2
    with pytest.raises(ValueError, match="row 1 sums to"):
        union_labels(union, bad, ["specinfer"])
    with pytest.raises(ValueError, match="expected shape"):
        union_labels(union, p_rows[:-1], ["specinfer"])
    with pytest.raises(ValueError, match="unknown verification method 'spec'"):
        union_labels(union, p_rows, ["spec"])


def test_estimate_needs_two_repeats_and_traversal_is_exact() -> None:
    target, draft = dirichlet_pair(6, 13)
    tree = sample_tree(Action(2, 1, 2), draft, np.random.default_rng(0))
    with pytest.raises(ValueError, match="repeats must be >= 2"):
        estimate_block_efficiency(tree, target, "specinfer", np.random.default_rng(0), repeats=1)
    exact = expected_block_efficiency(tree, target, "traversal")
    law = METHODS["traversal"].outcome_distribution(tree, target_rows(tree, target))
    assert abs(exact - sum(m * len(t) for t, m in law.items())) < 1e-12
