"""The label-noise study's arithmetic (pipeline/label_noise.py) on synthetic per-tree labels."""

import numpy as np

from pipeline.label_noise import noise_table, pick_roots


def _values(trees=16, roots=400, sigma=0.3, seed=0):
    """Ê per tree: action 0 is autoregressive (exactly 1), actions 1..3 have true means 1.2 / 1.4 / 1.6 plus
    drafting noise of std ``sigma`` per tree."""
    rng = np.random.default_rng(seed)
    true = np.array([1.0, 1.2, 1.4, 1.6])
    v = true + rng.normal(0.0, sigma, size=(trees, roots, 4))
    v[:, :, 0] = 1.0
    return v, true


def test_standard_error_falls_as_one_over_sqrt_trees():
    v, _ = _values()
    T = np.tile([1.0, 1.1, 1.3, 1.5], (v.shape[1], 1))
    rows = noise_table(v, T, np.array([False, True, True, True]), 0, (2, 4, 8, 16))
    assert [r["trees"] for r in rows] == [2, 4, 8, 16]
    for r in rows:  # E[std(ddof=1)] is a little below sigma for small s: allow 25%
        assert abs(r["se"] - 0.3 / np.sqrt(r["trees"])) < 0.25 * 0.3 / np.sqrt(r["trees"])
    assert rows[0]["se"] > rows[1]["se"] > rows[2]["se"] > rows[3]["se"]
    assert "oracle_held_out" in rows[2] and "oracle_held_out" not in rows[3]  # 16 trees leave none held out


def test_noisy_oracle_is_optimistic_in_sample_and_not_held_out():
    """With equal true TPS for every action, the in-sample oracle looks better than AR only by noise; scored on
    held-out trees its choice is worth about what any action is (no gain)."""
    v, true = _values(sigma=0.5)
    T = np.tile(true, (v.shape[1], 1))  # every action exactly 1 token per unit time in expectation
    rows = noise_table(v, T, np.array([False, True, True, True]), 0, (2, 8))
    two, eight = rows
    assert two["oracle_in_sample"] > eight["oracle_in_sample"] > 1.0
    assert abs(two["oracle_held_out"] - 1.0) < 0.05 and abs(eight["oracle_held_out"] - 1.0) < 0.05


class _T:
    def __init__(self, n_prompt, n_cont):
        self.prompt_ids, self.continuation_ids = list(range(n_prompt)), [5] * n_cont


def test_pick_roots_takes_exactly_the_asked_count_at_the_collect_positions():
    trajs = [_T(10, 40), _T(8, 33), _T(12, 5)]
    picked = pick_roots(trajs, 16, eos=set(), count=5, seed=0)
    assert sum(len(p) for _, p in picked) == 5
    for t, pos in picked:
        assert all(p >= len(t.prompt_ids) for p in pos) and all(np.diff(pos) == 16)
