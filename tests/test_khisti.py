"""Khisti et al. pairwise-LP tournament (ALGORITHMS.md 3.1b): exact losslessness through the registry,
the induced selection law q_I, the K = 1 reduction, the LP-failure fallback and sampling."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import decoding.verifiers.khisti as khisti_module
from decoding.actions import Action
from decoding.exact import (
    TablePair,
    emitted_law,
    enumerate_trees,
    exact_block_efficiency,
    law_distance,
    target_law,
    tree_p_rows,
)
from decoding.verifiers import get_method
from decoding.verifiers.khisti import KhistiSolver, pair_selection, tournament
from decoding.verifiers.ot import NaiveTreeSolver, OTMethod

SHAPES = [Action(k, l1, l2) for l1 in range(4) for l2 in range(4 - l1) for k in (1, 2, 3)
          if l2 > 0 or k == 1]  # every delayed tree with L1 + L2 <= 3, K <= 3


def random_pair(V: int, rng: np.random.Generator, zero_frac: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """(p, q) over V tokens with exact zeros in both (each keeps at least one positive entry)."""
    out = []
    for _ in range(2):
        v = rng.dirichlet(np.full(V, 0.7))
        v[rng.random(V) < zero_frac] = 0.0
        if v.sum() == 0.0:
            v[rng.integers(V)] = 1.0
        out.append(v / v.sum())
    return out[0], out[1]


def children_law(q: np.ndarray, k: int):
    """Every ordered k-tuple of i.i.d. draws from q with its probability (> 0)."""
    support = np.flatnonzero(q > 0)
    for kids in itertools.product(support.tolist(), repeat=k):
        yield list(kids), float(np.prod(q[list(kids)]))


def khisti_method(top_s: int) -> OTMethod:
    return OTMethod(f"khisti_s{top_s}", KhistiSolver(top_s=top_s))


def first_two_error(action: Action, pair: TablePair, method) -> float:
    return law_distance(emitted_law(action, pair, method, 2), target_law(pair, 2))


@pytest.mark.parametrize("action", SHAPES, ids=str)
def test_exact_first_two_tokens(action):
    for pair in (TablePair(3, seed=0), TablePair(3, seed=1)):
        assert first_two_error(action, pair, "khisti") < 1e-12


def test_exact_with_small_top_s_and_vocab_four():
    """top_s < V puts tokens in Omega2 (deterministic ranking), V = 4 widens the tables."""
    for top_s, action in ((1, Action(3, 0, 2)), (2, Action(3, 1, 1)), (2, Action(2, 0, 3))):
        assert first_two_error(action, TablePair(3, seed=2), khisti_method(top_s)) < 1e-12
    for action in (Action(3, 0, 2), Action(2, 1, 2)):
        assert first_two_error(action, TablePair(4, seed=3), khisti_method(3)) < 1e-12


@pytest.mark.parametrize("top_s", [1, 2, 5, 15])
def test_node_law_is_p_and_q_I_is_the_selection_law(top_s):
    """Given i.i.d. children, the emitted token is ~ p; q_I is a distribution equal to the exact
    law of the tournament's selected token (enumerated over all children and selection branches)."""
    rng = np.random.default_rng(top_s)
    for _ in range(6):
        p, q = random_pair(5, rng)
        solver = KhistiSolver(top_s=top_s)
        for k in (1, 2, 3, 4):
            emitted, selected = np.zeros(5), np.zeros(5)
            for kids, prob in children_law(q, k):
                emitted += prob * solver.output_distribution(p, q, kids)
                law, _ = solver.winner_law(p, q, kids)
                for tok, mass in law.items():
                    selected[tok] += prob * mass
            assert np.abs(emitted - p).max() < 1e-12
            q_I = solver.tournament(p, q, k).q_I
            assert np.all(q_I >= 0) and abs(q_I.sum() - 1.0) < 1e-12
            assert np.abs(selected - q_I).max() < 1e-12


def test_one_child_is_standard_speculative_sampling():
    rng = np.random.default_rng(7)
    naive, solver = NaiveTreeSolver(), KhistiSolver()
    for _ in range(20):
        p, q = random_pair(5, rng)
        for x in np.flatnonzero(q > 0):
            got = solver.output_distribution(p, q, [int(x)])
            assert np.abs(got - naive.output_distribution(p, q, [int(x)])).max() < 1e-15


def test_lp_weights_raise_acceptance():
    """The LP's w gives sum_x min(p, q_I) >= the deterministic ranking rule (w = 1)."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        p, q = random_pair(8, rng, zero_frac=0.1)
        sel = pair_selection(p, q, q, top_s=5)
        det = pair_selection(p, q, q, top_s=1)  # Omega1 of one token: no pairs, w unused
        assert np.minimum(p, sel.q_I).sum() >= np.minimum(p, det.q_I).sum() - 1e-12


def test_empirical_selection_frequency_matches_q_I():
    rng = np.random.default_rng(11)
    p, q = random_pair(6, rng, zero_frac=0.15)
    k, N = 3, 10000
    tour = tournament(p, q, k, top_s=5)
    counts = np.zeros(6)
    for _ in range(N):
        kids = rng.choice(6, size=k, p=q)
        winner = int(kids[0])
        for stage, challenger in zip(tour.stages, kids[1:], strict=True):
            winner = stage.select(winner, int(challenger), rng)
        counts[winner] += 1
    sigma = np.sqrt(N * tour.q_I * (1 - tour.q_I))
    assert np.all(np.abs(counts - N * tour.q_I) <= 6 * sigma + 1)


def test_sampling_matches_output_distribution():
    rng = np.random.default_rng(5)
    p, q = random_pair(6, rng, zero_frac=0.15)
    solver = KhistiSolver()
    kids = [int(t) for t in rng.choice(6, size=3, p=q)]
    law = solver.output_distribution(p, q, kids)
    N = 10000
    counts = np.bincount([solver.sample(p, q, kids, rng) for _ in range(N)], minlength=6)
    assert np.all(np.abs(counts - N * law) <= 6 * np.sqrt(N * law * (1 - law)) + 1)


def test_lp_failure_falls_back_to_naive_tree(monkeypatch):
    monkeypatch.setattr(khisti_module, "linprog", lambda *a, **k: SimpleNamespace(status=2, x=None))
    rng = np.random.default_rng(2)
    p, q = random_pair(5, rng)
    solver, naive = KhistiSolver(), NaiveTreeSolver()
    assert solver.tournament(p, q, 3) is None
    emitted = np.zeros(5)
    for kids, prob in children_law(q, 3):
        law = solver.output_distribution(p, q, kids)
        assert np.abs(law - naive.output_distribution(p, q, kids)).max() < 1e-15
        emitted += prob * law
    assert np.abs(emitted - p).max() < 1e-12
    kids = [int(np.flatnonzero(q > 0)[0])] * 3
    assert solver.sample(p, q, kids, rng) in range(5)


def test_dp_block_efficiency_equals_outcome_law():
    """Section 4's DP (registry) agrees with the mean block efficiency of the exact outcome law."""
    pair = TablePair(4, seed=6)
    method = get_method("khisti")
    for tree, _ in itertools.islice(enumerate_trees(Action(3, 1, 2), pair), 25):
        p_rows = tree_p_rows(tree, pair)
        assert abs(method.expected_block_efficiency(tree, p_rows) - exact_block_efficiency(tree, p_rows, method)) < 1e-12


def test_bad_input_errors():
    p, q = random_pair(4, np.random.default_rng(0), zero_frac=0.0)
    with pytest.raises(ValueError, match="top_s"):
        KhistiSolver(top_s=16)
    solver = KhistiSolver()
    with pytest.raises(ValueError, match="without children"):
        solver.output_distribution(p, q, [])
    q0 = q.copy()
    q0[1] = 0.0
    with pytest.raises(ValueError, match="q = 0"):
        solver.output_distribution(p, q0 / q0.sum(), [1])
    with pytest.raises(ValueError, match="sums to"):
        solver.sample(p * 2, q, [0], np.random.default_rng(0))


def test_tournament_cache_is_history_independent(monkeypatch):
    """Stages are shared across k; a failing later LP only affects tournaments that need it."""
    rng = np.random.default_rng(4)
    p, q = random_pair(6, rng, zero_frac=0.1)
    warm = KhistiSolver()
    warm.tournament(p, q, 2)
    assert np.array_equal(warm.tournament(p, q, 4).q_I, KhistiSolver().tournament(p, q, 4).q_I)
    real, calls = khisti_module.linprog, []

    def fail_second(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs) if len(calls) == 1 else SimpleNamespace(status=4, x=None)

    monkeypatch.setattr(khisti_module, "linprog", fail_second)
    solver = KhistiSolver()
    assert solver.tournament(p, q, 3) is None
    assert solver.tournament(p, q, 2) is not None
    assert solver.tournament(p, q, 4) is None
    assert len(calls) == 2
