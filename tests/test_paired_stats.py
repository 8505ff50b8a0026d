"""Paired bootstrap statistics of the evaluate stage (evaluation/paired_stats.py) on hand-made runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evaluation.paired_stats import Bootstrap, gain_by, paired, policy_table, rate_ci, ratio_ci


def _runs(speed: dict[str, float], prompts: int = 6, seeds: int = 2, jitter: float = 0.0, seed: int = 0):
    """Every policy decodes every (prompt, seed); prompt i is (i + 1) times slower for every policy."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        for s in range(seeds):
            for policy, v in speed.items():
                tokens = 40
                seconds = tokens / v * (p + 1) * (1 + jitter * rng.normal())
                rows.append({"policy": policy, "prompt_id": f"p{p}", "seed": s, "tokens": tokens, "seconds": seconds,
                             "decode_seconds": seconds,
                             "emitted": 2 * tokens if policy != "ar" else tokens, "steps": tokens,
                             "temperature": 0.6 if p % 2 else 1.0})
    return pd.DataFrame(rows)


def test_rate_is_sum_over_sum_and_one_group_has_no_spread():
    r = rate_ci([10, 30], [1, 2], ["a", "a"], Bootstrap(n_boot=200))
    assert r["value"] == pytest.approx(40 / 3)
    assert r["low"] == pytest.approx(40 / 3) and r["high"] == pytest.approx(40 / 3)  # one prompt: nothing to resample


def test_rate_interval_lies_between_the_group_rates_and_covers_the_point():
    r = rate_ci([10, 10, 10], [1, 2, 4], ["a", "b", "c"], Bootstrap(n_boot=4000, seed=1))
    assert 10 / 4 <= r["low"] < r["value"] < r["high"] <= 10
    assert r["value"] == pytest.approx(30 / 7)


def test_paired_ratio_is_exact_when_one_policy_is_always_twice_as_fast():
    """Per-prompt speed varies 6x, but the paired ratio is the same on every prompt: a zero-width interval."""
    runs = _runs({"ar": 10.0, "fast": 20.0})
    j = paired(runs, "fast", "ar")
    assert len(j) == 12
    r = ratio_ci((j["tokens_a"], j["seconds_a"]), (j["tokens_b"], j["seconds_b"]), j["prompt_id"])
    assert r["value"] == pytest.approx(2.0) and r["low"] == pytest.approx(2.0) and r["high"] == pytest.approx(2.0)


def test_pairing_is_what_makes_the_interval_tight():
    runs = _runs({"ar": 10.0, "fast": 12.0}, prompts=8, jitter=0.02, seed=3)
    table = policy_table(runs, {"autoregressive": "ar"}, Bootstrap(n_boot=2000))
    ratio = table["fast"]["tps_vs_autoregressive"]
    assert ratio["low"] > 1.1 and ratio["high"] < 1.3  # paired: the prompt-to-prompt spread cancels
    # unpaired: the ratio of the two rate intervals' ends spans far wider
    fast, ar = table["fast"]["tokens_per_second"], table["ar"]["tokens_per_second"]
    assert fast["low"] / ar["high"] < 1.0 < fast["high"] / ar["low"]
    assert table["fast"]["block_efficiency"]["value"] == pytest.approx(2.0)
    assert table["fast"]["block_efficiency_vs_autoregressive"]["value"] == pytest.approx(2.0)
    assert table["ar"]["tps_vs_autoregressive"]["value"] == pytest.approx(1.0)
    assert table["fast"]["units"] == 16 and table["fast"]["prompts"] == 8


def test_only_common_units_are_paired_and_missing_references_are_skipped():
    runs = _runs({"ar": 10.0, "fast": 20.0})
    runs = runs[~((runs["policy"] == "fast") & (runs["prompt_id"] == "p0"))]
    # drop p0 for "fast": its ratio uses p1..p5 only; AR's p0 would otherwise pull the ratio
    table = policy_table(runs, {"autoregressive": "ar", "traversal_best_static": "absent"}, Bootstrap(n_boot=100))
    assert table["fast"]["tps_vs_autoregressive"]["value"] == pytest.approx(2.0)
    assert "tps_vs_traversal_best_static" not in table["fast"]


def test_gain_by_temperature_groups_the_units():
    runs = _runs({"ar": 10.0, "fast": 20.0})
    hot = runs["temperature"] == 1.0
    runs.loc[hot & (runs["policy"] == "fast"), "seconds"] *= 2  # no gain at T = 1
    g = gain_by(runs, "temperature", ["fast", "ar"], "ar", Bootstrap(n_boot=100))
    assert set(g) == {"0.6", "1.0"} and "ar" not in g["0.6"]
    assert g["0.6"]["fast"]["value"] == pytest.approx(2.0) and g["1.0"]["fast"]["value"] == pytest.approx(1.0)


def test_the_decode_ratio_leaves_out_a_prefill_that_every_policy_pays():
    """A policy twice as fast per step reads 2x after the prefill; with a prefill of a quarter of AR's wall time,
    the same on both sides, its wall-time ratio is only 1.6x. The offline table compares with the former."""
    from evaluation.paired_stats import offline_vs_online

    runs = _runs({"ar": 10.0, "fast": 20.0})
    prefill = runs["seconds"].where(runs["policy"] == "ar").groupby(runs["prompt_id"]).transform("max") / 3
    runs["decode_seconds"] = runs["seconds"]
    runs["seconds"] = runs["seconds"] + prefill
    table = policy_table(runs, {"autoregressive": "ar"}, Bootstrap(n_boot=200))
    fast = table["fast"]
    assert fast["decode_tps_vs_autoregressive"]["value"] == pytest.approx(2.0)
    assert fast["tps_vs_autoregressive"]["value"] == pytest.approx((1 + 1 / 3) / (0.5 + 1 / 3))
    fast["offline"] = {"vs_autoregressive": 1.95}
    row = offline_vs_online({"fast": fast})["fast"]
    assert row["online"] == pytest.approx(2.0) and not row["inside"]  # a zero-width interval at 2.0
    fast["offline"] = {"vs_autoregressive": 2.0}
    assert offline_vs_online({"fast": fast})["fast"]["inside"]
