"""evaluate's offline row of the trained selector: its TEST table."""

from pipeline.evaluate import _train_summary


def test_single_selector_summary_is_its_test_table():
    train = {"method": "traversal", "feature_set": "paper", "objective": "regression",
             "test": {"roots": 10, "selector_vs_autoregressive": 1.1, "tps": {"selector": 11.0}, "mae": 0.2}}
    s = _train_summary(train)
    assert s["selector_vs_autoregressive"] == 1.1 and "mae" not in s and s["feature_set"] == "paper"
