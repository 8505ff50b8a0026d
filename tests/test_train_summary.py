"""evaluate's offline row of the trained selector: a single selector's TEST table, or a cascade's own score."""

import pytest

from pipeline.evaluate import _train_summary


def test_cascade_summary_takes_the_cascade_score_and_stage_one_references():
    train = {"method": "specinfer", "feature_set": "cascade", "objective": "regression",
             "cascade": {"test": {"selector_vs_autoregressive": 0.98, "selector_vs_oracle": 0.8,
                                  "speculate_fraction": 0.33, "test_roots": 460}},
             "stages": {"stage1": {"test": {"best_static": "1,0,0", "tps": {
                 "autoregressive": 50.0, "best_static": 50.0, "traversal_best_static": 49.0, "oracle": 61.0,
                 "selector": 47.0}}}}}
    s = _train_summary(train)
    assert s["feature_set"] == "cascade" and s["roots"] == 460
    assert s["selector_vs_autoregressive"] == 0.98
    assert s["tps"]["selector"] == pytest.approx(49.0)  # the cascade's, not stage 1's 47
    assert s["tps"]["oracle"] / s["tps"]["autoregressive"] == pytest.approx(1.22)
    assert s["selector_vs_traversal_best_static"] == pytest.approx(1.0)


def test_single_selector_summary_is_its_test_table():
    train = {"method": "traversal", "feature_set": "paper", "objective": "regression",
             "test": {"roots": 10, "selector_vs_autoregressive": 1.1, "tps": {"selector": 11.0}, "mae": 0.2}}
    s = _train_summary(train)
    assert s["selector_vs_autoregressive"] == 1.1 and "mae" not in s and s["feature_set"] == "paper"
