"""The verification cost per method and shape (`data_collection.verify_cost`), as the profile measures it."""

from __future__ import annotations

import numpy as np
import pytest

from data_collection.verify_cost import measure_verify_seconds
from decoding.actions import Action


def _pools(n: int = 6, vocab: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(vocab, 0.3), size=n)
    p = 0.5 * q + 0.5 * rng.dirichlet(np.full(vocab, 0.3), size=n)  # agrees with q often, as a pair does
    return q, p


def test_every_supported_shape_of_every_method_is_timed():
    q, p = _pools()
    actions = [Action(1, 0, 0), Action(2, 0, 1), Action(1, 1, 0), Action(2, 1, 2)]
    got = measure_verify_seconds(actions, q, p, methods=["traversal", "gbv", "naive"], repeats=3)
    assert set(got) == {"traversal", "gbv", "naive"}
    assert set(got["traversal"]) == set(got["gbv"]) == {"2,0,1", "1,1,0", "2,1,2"}  # the empty tree is not verified
    assert set(got["naive"]) == {"1,1,0"}  # a chain-only method: no branching tree
    assert all(0 < s < 1 for by in got.values() for s in by.values())


def test_bad_pools_and_repeats_fail_clearly():
    q, p = _pools()
    with pytest.raises(ValueError, match="q_pool and p_pool must be"):
        measure_verify_seconds([Action(2, 0, 1)], q, p[:, :10])
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        measure_verify_seconds([Action(2, 0, 1)], q, p, repeats=0)
