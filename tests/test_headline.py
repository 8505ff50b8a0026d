"""Stage headline (pipeline/headline.py): the dozen numbers from the other stages' metrics, null when absent,
and the transposed experiments table."""

from __future__ import annotations

import json
import math

from pipeline.headline import KEYS, OUT, experiments_table, headline_metrics

EVALUATE = {
    "selector": {"policy": "selector:specinfer"},
    "policies": {"selector:specinfer": {
        "tokens_per_second": {"value": 14.9}, "block_efficiency": {"value": 1.14},
        "tps_vs_autoregressive": {"value": 0.94, "low": 0.91, "high": 0.97},
        "tps_vs_best_static": {"value": 1.10}}},
    "offline": {"selector": {"selector_vs_autoregressive": 0.97, "tps": {"oracle": 20.0, "autoregressive": 16.0}}},
}


def test_headline_reads_each_stage_and_prefers_evaluates_flat_keys():
    draft = {"acceptance_test_T1.0": 0.3, "acceptance_test_T0.6": 0.4, "acceptance_other": 9.0}
    h = headline_metrics(EVALUATE, {"seconds_per_root": {"total": 0.81}}, draft)
    assert list(h) == list(KEYS)
    assert h["selector_vs_ar"] == 0.94 and h["selector_vs_ar_lo"] == 0.91 and h["selector_vs_ar_hi"] == 0.97
    assert h["selector_vs_best_static"] == 1.10 and h["offline_oracle_vs_ar"] == 20.0 / 16.0
    assert math.isclose(h["draft_acceptance"], 0.35) and h["collect_seconds_per_root"] == 0.81
    assert h["selector_vs_threshold_chain"] is None and h["selector_vs_adaptive_chain"] is None
    flat = {**EVALUATE, "selector_vs_ar": 0.99, "selector_vs_threshold_chain": 1.2,
            "selector_vs_adaptive_chain": float("nan"), "selector_vs_best_static": 1.05}
    h = headline_metrics(flat, {}, {})
    assert h["selector_vs_ar"] == 0.99 and h["selector_vs_threshold_chain"] == 1.2 and h["selector_vs_best_static"] == 1.05
    assert h["selector_vs_adaptive_chain"] is None  # NaN is not a number to show
    assert h["draft_acceptance"] is None and h["collect_seconds_per_root"] is None


def test_the_headline_names_the_selector_alone_and_lookup_then_selector_for_what_they_are():
    """Issue #43: selector_vs_* is the trained selector alone; prompt lookup's own ratio and the lookup-first
    combination have their own keys, so the combination's win is not credited to the selector."""
    from evaluation.paired_stats import selector_ratios

    def entry(ar, lookup=None):
        e = {"tps_vs_autoregressive": {"value": ar, "low": ar - 0.05, "high": ar + 0.05}}
        if lookup is not None:
            e["tps_vs_prompt_lookup"] = {"value": lookup, "low": lookup - 0.05, "high": lookup + 0.05}
        return e

    table = {"selector:auto": entry(1.01), "selector:auto:lookup": entry(1.32, 1.05), "prompt_lookup": entry(1.26)}
    flat = selector_ratios(table, "selector:auto", "selector:auto:lookup")
    ev = {"selector": {"policy": "selector:auto"}, "policies": table, **flat}
    h = headline_metrics(ev, {}, {})
    assert h["selector_vs_ar"] == 1.01 and h["prompt_lookup_vs_ar"] == 1.26
    assert h["lookup_then_selector_vs_ar"] == 1.32 and h["lookup_then_selector_vs_prompt_lookup"] == 1.05
    assert h["lookup_then_selector_vs_prompt_lookup_lo"] == 1.0
    assert not any(k.startswith("selector_alone") or k == "selector_vs_prompt_lookup" for k in h)



def test_draft_acceptance_is_only_that_of_the_pairs_draft():
    """A draft metrics file that measured another draft (a stale self-draft, after model.draft became an HF
    model) must not reach the headline as the pair's acceptance."""
    draft = {"draft": "self_draft:artifacts/draft", "kind": "distilled", "acceptance_test_T1.0": 0.4}
    assert headline_metrics(EVALUATE, {}, draft, "self_draft:artifacts/draft")["draft_acceptance"] == 0.4
    assert headline_metrics(EVALUATE, {}, draft, "hf:/models/small")["draft_acceptance"] is None
    unnamed = {"acceptance_test_T1.0": 0.2}  # written before the file named its draft
    assert headline_metrics(EVALUATE, {}, unnamed, "hf:/models/small")["draft_acceptance"] == 0.2

def test_headline_stage_writes_one_object_and_missing_files_are_null(tmp_path):
    from pipeline.cli import main

    ev = tmp_path / "evaluate.json"
    ev.write_text(json.dumps(EVALUATE))
    out = tmp_path / "headline.json"
    assert main(["headline", "--out", str(out), "--set", f"evaluate.metrics={ev}",
                 "--set", f"collect.metrics={tmp_path / 'none.json'}",
                 "--set", f"train_draft.metrics={tmp_path / 'none2.json'}"]) == 0
    written = json.loads(out.read_text())
    assert list(written) == ["headline"] and written["headline"]["selector_vs_ar"] == 0.94
    assert written["headline"]["collect_seconds_per_root"] is None


def test_experiments_table_is_one_row_per_number_and_one_column_per_run():
    def data(objective, value):
        return {"params": {"params.yaml": {"data": {"train": {"objective": objective, "feature_set": "paper"}}}},
                "metrics": {OUT: {"data": {"headline": {"selector_vs_ar": value}}}}}

    show = [{"rev": "workspace", "name": None, "data": data("regression", 0.9)},
            {"rev": "a" * 40, "name": "main", "data": data("regression", 0.95),
             "experiments": [{"revs": [{"rev": "b" * 40, "name": "thr", "data": data("throughput", 1.01)}]}]}]
    lines = experiments_table(show).splitlines()
    assert lines[0].split() == ["workspace", "main", "thr"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["train.objective"] == ["regression", "regression", "throughput"]
    assert rows["selector_vs_ar"] == ["0.9", "0.95", "1.01"] and rows["draft_acceptance"] == ["-", "-", "-"]
    assert len(lines) == 1 + 2 + len(KEYS)
