"""The offline estimator along the decode path (decoding/throughput.py, docs/throughput.md) against a simulated
decoder that walks labelled positions, and the estimator of earlier versions (sum E / sum T) that it replaces."""

import numpy as np
import pytest

from decoding import throughput


def _positions(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``E`` in spans of 20-200 positions, each span's level in [1.1, 2.6]; a step costs 1.15-1.3 plain steps."""
    E, T = np.empty(n), np.empty(n)
    i = 0
    while i < n:
        span = int(rng.integers(20, 200))
        E[i:i + span] = rng.uniform(1.1, 2.6)
        T[i:i + span] = rng.uniform(1.15, 1.3)
        i += span
    return E, T


def _walk(E: np.ndarray, T: np.ndarray, rng: np.random.Generator, depth: int = 4) -> float:
    """A decoder on those positions: a step at position i costs T[i] and emits k tokens, ``k - 1 ~ Binomial(depth,
    (E[i] - 1) / depth)`` (mean E[i]); the next step starts k positions later. Tokens per unit time of the walk."""
    i, time = 0, 0.0
    while i < E.size:
        k = 1 + int(rng.binomial(depth, (E[i] - 1.0) / depth))
        time += T[i]
        i += k
    return E.size / time


def test_path_estimator_matches_a_simulated_decoder_where_the_arithmetic_one_overstates():
    rng = np.random.default_rng(0)
    E, T = _positions(200_000, rng)
    walked = _walk(E, T, rng)
    choice = np.zeros(E.size, dtype=np.int64)
    path = throughput.path_tps(E[:, None], T[:, None], choice)
    arithmetic = throughput.arithmetic_tps(E[:, None], T[:, None], choice)
    assert path == pytest.approx(walked, rel=0.01)
    assert arithmetic > 1.05 * walked  # positions alike overstate a policy whose E varies


def test_a_policy_choosing_per_position_walks_at_its_path_tps():
    """Two actions per position; a policy choosing by position (here: the oracle) decodes at its path TPS."""
    rng = np.random.default_rng(1)
    E0, T0 = _positions(100_000, rng)
    E = np.stack([np.ones_like(E0), E0], axis=1)  # autoregressive, a drafted action
    T = np.stack([np.ones_like(T0), T0], axis=1)
    choice = throughput.oracle_choice(E, T)
    assert 0 < choice.mean() < 1  # it really switches
    rows = np.arange(E0.size)
    walked = _walk(E[rows, choice], T[rows, choice], rng)
    assert throughput.path_tps(E, T, choice) == pytest.approx(walked, rel=0.01)
    # the oracle is the best path TPS: no static beats it
    assert throughput.path_tps(E, T, choice) >= throughput.static_tps(E, T).max()


def test_path_tps_by_hand_and_constant_labels_agree_with_the_arithmetic_estimator():
    E = np.array([[1.0, 2.0], [1.0, 1.0]])
    T = np.array([[1.0, 1.2], [1.0, 1.2]])
    assert throughput.path_tps(E, T, np.array([1, 1])) == pytest.approx(2 / (0.6 + 1.2))
    assert throughput.arithmetic_tps(E, T, np.array([1, 1])) == pytest.approx(3 / 2.4)
    assert throughput.static_tps(E, T).tolist() == pytest.approx([1.0, 2 / 1.8])
    flat = np.full((5, 1), 1.7)
    assert throughput.path_tps(flat, np.ones((5, 1)), np.zeros(5, int)) == pytest.approx(
        throughput.arithmetic_tps(flat, np.ones((5, 1)), np.zeros(5, int)))


def test_nan_labels_are_never_a_static_choice_and_a_chosen_nan_is_an_error():
    E = np.array([[1.0, np.nan, 1.5], [1.0, 3.0, 1.5]])
    T = np.ones_like(E)
    assert throughput.static_tps(E, T)[1] == -np.inf
    assert throughput.best_static(E, T) == 2
    with pytest.raises(ValueError, match="NaN"):
        throughput.path_tps(E, T, np.array([1, 1]))
