"""benchmarks/bench_transformers.py: its summary of paired runs (no model needed)."""

from __future__ import annotations

import pytest

from benchmarks.bench_transformers import BUILTIN, OURS, parse_args, step_mix, summarize

RATES = {"autoregressive": 10.0, "assisted_default": 8.0, "assisted_tuned_threshold": 12.0, "prompt_lookup": 11.0,
         "branchpoint": 13.0, "branchpoint_lookup": 14.0}


def _rows():
    rows, unit = [], 0
    for prompt in ("a", "b", "c"):
        for t in (1.0, 0.6):
            for name, rate in RATES.items():
                tokens = 128
                seconds = tokens / (rate * (1.2 if t == 0.6 else 1.0))  # T = 0.6 runs 20% faster for everyone
                row = {"policy": name, "prompt_id": prompt, "temperature": t, "unit": unit, "tokens": tokens,
                       "seconds": seconds}
                if name in OURS:
                    row |= {"steps": {"plain": 10, "naive:1,3,0": 20, "lookup:3": 10 if name == "branchpoint_lookup" else 0},
                            "drafted": 60}
                rows.append(row)
            unit += 1
    return rows


def test_summary_compares_the_better_selector_policy_with_the_best_builtin():
    args = parse_args(["--bootstrap", "200"])
    out = summarize(_rows(), args)
    assert set(out["policies"]) == {*BUILTIN, *OURS}
    ar = out["policies"]["autoregressive"]["tokens_per_second"]
    assert ar["value"] == pytest.approx(128 * 6 / (128 / 10 * 3 + 128 / 12 * 3))
    assert out["policies"]["autoregressive"]["by_temperature"]["0.6"]["value"] == pytest.approx(12.0)
    r = out["selector_vs_best_builtin"]
    assert (r["selector_policy"], r["best_builtin"]) == ("branchpoint_lookup", "assisted_tuned_threshold")
    assert r["value"] == pytest.approx(14 / 12) and r["low"] <= r["value"] <= r["high"] and r["met"]
    assert r["by_temperature"]["1.0"]["value"] == pytest.approx(14 / 12)


def test_step_mix_and_quick_mode():
    mix = step_mix(_rows())
    assert mix["branchpoint"]["plain_share"] == pytest.approx(10 / 30)
    assert mix["branchpoint_lookup"]["lookup_share"] == pytest.approx(0.25)
    assert mix["branchpoint"]["mean_draft_length"] == pytest.approx(3.0)
    quick = parse_args(["--quick"])
    assert quick.prompts == 4 and quick.tune_prompts == 1 and quick.max_new_tokens >= 128


def test_step_mix_groups_the_step_classes_by_kind():
    """The rows hold `decoding.pricing.step_class` counts; the mix groups them into plain / lookup / drafted shares
    and divides the drafted tokens by the drafted steps only."""
    rows = [{"policy": "branchpoint", "steps": {"plain": 2, "naive:1,2,0": 3, "naive:1,4,0": 1}, "drafted": 10},
            {"policy": "branchpoint_lookup", "steps": {"lookup:3": 4, "naive:1,1,0": 4}, "drafted": 4}]
    mix = step_mix(rows)
    assert mix["branchpoint"] == {"plain_share": 2 / 6, "lookup_share": 0.0, "draft_share": 4 / 6, "steps": 6,
                                  "mean_draft_length": 10 / 4}
    assert mix["branchpoint_lookup"]["lookup_share"] == 0.5 and mix["branchpoint_lookup"]["mean_draft_length"] == 1.0
