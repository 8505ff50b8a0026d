"""Khisti et al. pairwise-LP tournament (ALGORITHMS.md 3.1b): exact losslessness through the registry,
the induced selection law q_I, the K = 1 reduction, the LP-failure fallback and sampling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

import verifiers.khisti as khisti_module
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
from verifiers import get_method
from verifiers.khisti import KhistiSolver, next_stage, pair_selection, tournament
from verifiers.khisti_numerics import StageBuffers, hinted_sort
from verifiers.ot import NaiveTreeSolver, OTMethod, first_occurrence

SHAPES = SECTION7_SHAPES  # every delayed tree with L1 + L2 <= 3, K <= 3


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
    monkeypatch.setattr(khisti_module, "solve_pair_lp", lambda *a, **k: None)
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
    real, calls = khisti_module.solve_pair_lp, []

    def fail_second(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs) if len(calls) == 1 else None

    monkeypatch.setattr(khisti_module, "solve_pair_lp", fail_second)
    solver = KhistiSolver()
    assert solver.tournament(p, q, 3) is None
    assert solver.tournament(p, q, 2) is not None
    assert solver.tournament(p, q, 4) is None
    assert len(calls) == 2


def linprog_pair_lp(base: np.ndarray, p_top: np.ndarray, mass: np.ndarray) -> float:
    """Optimal value of the pair LP (module docstring) by scipy's linprog (HiGHS), as a reference."""
    s = base.shape[0]
    pairs = [(i, j) for i in range(s) for j in range(i + 1, s)]
    a_ub = np.zeros((s, len(pairs) + s))  # row i: z_i + sum_j>i v_ij m_ij - sum_j<i v_ji m_ji <= base_i
    for col, (i, j) in enumerate(pairs):
        a_ub[i, col], a_ub[j, col] = mass[i, j], -mass[i, j]
    a_ub[np.arange(s), len(pairs) + np.arange(s)] = 1.0
    cost = np.concatenate([np.zeros(len(pairs)), -np.ones(s)])
    bounds = [(0.0, 1.0)] * len(pairs) + [(0.0, float(x)) for x in p_top]
    res = linprog(cost, A_ub=a_ub, b_ub=base, bounds=bounds, method="highs")
    assert res.status == 0
    return -res.fun


def flow_value(base, p_top, mass, v) -> float:
    moved = v * mass  # [s, s] mass moved from i to j > i
    return float(np.minimum(p_top, base - moved.sum(axis=1) + moved.sum(axis=0)).sum())


def test_pair_lp_solver_matches_linprog():
    """The max-flow solver reaches the LP optimum (= HiGHS's value) with 0 <= v <= 1, on random LPs
    built like the real ones (base_i >= mass to worse tokens) and on the LPs of real pair selections."""
    rng = np.random.default_rng(12)
    for _ in range(300):
        s = int(rng.integers(2, 16))
        mass = np.triu(rng.random((s, s)) * rng.random() * (rng.random((s, s)) < 0.8), 1)
        base = mass.sum(axis=1) + rng.random(s) * rng.random()
        p_top = rng.random(s) * rng.random() * (rng.random(s) < 0.9)
        v = khisti_module.solve_pair_lp(base, p_top, mass)
        assert v is not None and np.all((v >= 0) & (v <= 1))
        assert abs(flow_value(base, p_top, mass, v) - linprog_pair_lp(base, p_top, mass)) < 1e-12
    assert khisti_module.solve_pair_lp(np.array([np.nan, 1.0]), np.ones(2), np.triu(np.ones((2, 2)), 1)) is None
    for _ in range(40):
        p, q = random_pair(int(rng.integers(3, 30)), rng, zero_frac=0.2)
        q1 = tournament(p, q, 2, top_s=15).q_I if rng.random() < 0.5 else q
        sel = pair_selection(p, q1, q, top_s=int(rng.integers(2, 16)))
        s, order = sel.top_s, sel.order
        q1s, q2s = q1[order], q[order]
        t1, t2 = q1s[::-1].cumsum()[::-1] - q1s, q2s[::-1].cumsum()[::-1] - q2s
        base = q1s * q2s + q1s * t2 + t1 * q2s
        mass = np.triu(np.outer(q1s[:s], q2s[:s]) + np.outer(q2s[:s], q1s[:s]), 1)
        got = np.minimum(p[order[:s]], sel.q_I[order[:s]]).sum()
        assert abs(got - linprog_pair_lp(base[:s], p[order[:s]], mass)) < 1e-12


def test_ranking_is_the_stable_order_with_ties_by_token_id():
    """The fast sorts (radix sort for stage 1, insertion sort from the previous stage's order for
    later stages) give exactly the rank order of a stable argsort of -(p - q1*q2), also with many ties
    and exact zeros."""
    rng = np.random.default_rng(13)
    for trial in range(200):
        V = int(rng.integers(2, 3000))
        p, q = random_pair(V, rng, zero_frac=0.4)
        if trial % 2:  # coarse values: many exact ties
            p, q = np.round(p * 8) / 8, np.round(q * 8) / 8
            p[0] += 1.0 - p.sum()
            q[-1] += 1.0 - q.sum()
            p, q = np.abs(p), np.abs(q)
            p, q = p / p.sum(), q / q.sum()
        tour = tournament(p, q, 4, top_s=int(rng.integers(1, 6)))
        q1 = q
        for stage in tour.stages:
            assert np.array_equal(stage.order, np.argsort(-(p - q1 * q), kind="stable"))
            q1 = stage.q_I


def tied_pair(V: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(p, q) on a coarse grid: many exact ties among the keys, and exact zeros."""
    p, q = random_pair(V, rng, zero_frac=0.4)
    p, q = np.round(p * 8) / 8, np.round(q * 8) / 8
    p[0], q[-1] = p[0] + 1.0, q[-1] + 1.0  # keeps a positive entry; renormalized below
    return p / p.sum(), q / q.sum()


def test_stage_pass_matches_the_definitions():
    """Each stage's compiled pass equals a plain numpy evaluation of the definitions, to the last bit
    where the arithmetic is the same: the sorted keys, q_I on Omega2 from suffix sums (reversed
    cumsums), the next stage's keys, the residual mass sum (p - q_I)+; stages built in place (the label path) equal
    stages built on copies (the reference path)."""
    rng = np.random.default_rng(15)
    for trial in range(150):
        V = int(rng.integers(2, 600))
        p, q = tied_pair(V, rng) if trial % 2 else random_pair(V, rng, zero_frac=0.3)
        top_s = int(rng.integers(1, 16))
        tour = tournament(p, q, 4, top_s=top_s)
        in_place = [pair_selection(p, q, q, top_s, StageBuffers(V))]
        q1 = q
        for m, stage in enumerate(tour.stages):
            order, s = np.argsort(-(p - q1 * q), kind="stable"), stage.top_s
            q1s, q2s, ps = q1[order], q[order], p[order]
            t1 = np.append(np.cumsum(q1s[:0:-1])[::-1], 0.0)  # q1-mass ranked worse
            t2 = np.append(np.cumsum(q2s[:0:-1])[::-1], 0.0)
            assert np.array_equal(stage.order, order) and np.array_equal(stage.key_sorted, q1s * q2s - ps)
            assert np.array_equal(stage.q_I_sorted[s:], (q1s * q2s + q1s * t2 + t1 * q2s)[s:])
            assert np.array_equal(stage.next_keys, stage.q_I_sorted * q2s - ps)
            assert abs(stage.residual_mass - np.maximum(p - stage.q_I, 0.0).sum()) < 1e-14
            assert abs(stage.q_I.sum() - 1.0) < 1e-12
            if m > 0:
                in_place.append(next_stage(in_place[-1], top_s, in_place=True))
            fast = in_place[-1]
            assert np.array_equal(fast.order, stage.order) and np.array_equal(fast.q_I_sorted, stage.q_I_sorted)
            assert np.array_equal(fast.next_keys, stage.next_keys) and fast.residual_mass == stage.residual_mass
            q1 = stage.q_I


@pytest.mark.parametrize("start", ["nearly_sorted", "reversed"])
def test_hinted_sort_orders_by_key_then_token(start):
    """The insertion sort (nearly sorted start) and its fallback, a full sort once the moves exceed
    4 V (reversed start), give the order by (key, token id) and carry the payload arrays along."""
    rng = np.random.default_rng(16)
    V = 2000
    keys = np.round(rng.standard_normal(V) * 4) / 4  # many exact ties
    keys[rng.random(V) < 0.2] = 0.0
    keys[rng.random(V) < 0.1] = -0.0  # equal to 0.0 as a key (the fallback's radix sort must see them so)
    order = rng.permutation(V)
    by_key = np.lexsort((order, keys))
    if start == "nearly_sorted":
        start_pos = by_key.copy()
        swaps = rng.choice(np.arange(0, V - 3, 7), size=50, replace=False)  # disjoint pairs: a permutation
        start_pos[swaps], start_pos[swaps + 3] = start_pos[swaps + 3], start_pos[swaps]
    else:
        start_pos = by_key[::-1].copy()
    st = {"key": keys[start_pos], "order": order[start_pos]}
    payload = {name: rng.random(V) for name in ("p", "q1", "q2")}
    st |= {name: a[start_pos] for name, a in payload.items()}
    hinted_sort(st)
    assert np.array_equal(st["order"], order[by_key]) and np.array_equal(st["key"], keys[by_key])
    for name, a in payload.items():
        assert np.array_equal(st[name], a[by_key])


def test_branch_weights_equal_output_distribution(monkeypatch):
    """The label path's batched weights are output_distribution at the children (first copies only),
    for every K, also when LPs fail (naive_tree from the failing stage on): failures are decided by
    the LP's content, so both paths see the same ones."""
    rng = np.random.default_rng(14)
    real = khisti_module.solve_pair_lp
    for fail in (False, True):
        if fail:
            monkeypatch.setattr(khisti_module, "solve_pair_lp", lambda base, p_top, mass: (
                None if int(base.sum() * 1e6) % 2 else real(base, p_top, mass)))
        for _ in range(30):
            V, J, kmax = int(rng.integers(2, 9)), 3, 4
            pairs = [random_pair(V, rng) for _ in range(J)]
            P, Q = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
            T = np.array([rng.choice(np.flatnonzero(Q[j] > 0), size=kmax) for j in range(J)])
            solver = KhistiSolver(top_s=int(rng.integers(1, 6)))
            got = solver.branch_weights(P, Q, T)
            ref = np.zeros_like(got)
            first = first_occurrence(T)
            for j in range(J):
                for k in range(1, kmax + 1):
                    out = solver.output_distribution(P[j], Q[j], [int(t) for t in T[j, :k]])
                    ref[j, k - 1, :k] = np.where(first[j, :k], out[T[j, :k]], 0.0)
            assert np.abs(got - ref).max() < 1e-12
