"""``branchpoint lookup`` end to end on a tiny saved target: labels of every root, the gate fitted on TRAIN roots,
the metrics on the held-out splits, and the errors of bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from selector_helpers import toy_latency

SPLITS = ["train", "train", "train", "val", "test", "draft"]


@pytest.fixture(scope="module")
def params(tmp_path_factory):
    from tiny_models import save_tiny_model

    from data_collection.trajectories import Trajectory, save_trajectories

    root = tmp_path_factory.mktemp("lookup")
    t = save_tiny_model(root / "target", 2, seed=0)
    rng = np.random.default_rng(0)
    trajs = []
    for i, split in enumerate(SPLITS):
        prompt = [1, *map(int, rng.integers(3, 64, 10))]
        # the continuation copies a stretch of the prompt, then goes its own way: long and short repeats both occur
        cont = prompt[2:9] + [int(x) for x in rng.integers(3, 64, 12)]
        trajs.append(Trajectory(f"p{i}", f"src{i % 2}", split, 1.0 if i % 2 else 0.6, 1.0 if i % 2 else 0.95, 0,
                                prompt, cont))
    save_trajectories(root / "traj", trajs, {"target": f"hf:{t}"})
    toy_latency().save(root / "latency.json")
    path = root / "params.yaml"
    path.write_text(
        f"model:\n  target: hf:{t}\n  draft: hf:{t}\n  device: cpu\n  threads: 1\n"
        f"trajectories:\n  out: {root / 'traj'}\n"
        f"profile:\n  out: {root / 'latency.json'}\n"
        f"lookup:\n  root_stride: 1\n  max_length: 4\n  out: {root / 'lookup'}\n  gate: {root / 'gate.json'}\n"
        f"  metrics: {root / 'lookup.json'}\n")
    return root, path, trajs


def test_the_stage_labels_every_root_and_fits_the_gate(params, capsys):
    from decoding.lookup_gate import LookupGate
    from pipeline.cli import main
    from pipeline.lookup import load_labels

    root, path, trajs = params
    assert main(["lookup", "--params", str(path), "--no-progress"]) == 0
    labels = load_labels(root / "lookup")
    held = [t for t in trajs if t.split != "draft"]  # never the draft's prompts
    assert labels["run"].size == sum(len(t.continuation_ids) for t in held)  # stride 1: every continuation token
    assert set(labels["split"]) == {"train", "val", "test"} and labels["accept"].shape[1] == 4
    repeat = labels["run"] > 0
    assert repeat.any() and (~repeat).any() and labels["run"].max() >= 5  # the copied stretch
    assert np.isnan(labels["accept"][~repeat]).all()
    a = labels["accept"][repeat]
    has = ~np.isnan(a)
    assert np.all((a[has] >= 0) & (a[has] <= 1)) and has[:, 0].all()  # every repeat proposes a first token
    assert np.array_equal(has.sum(1), labels["proposed"][repeat])
    gate = LookupGate.load(root / "gate.json")
    assert gate.step_ratio is not None and gate.step_ratio.shape == (4,) and np.all(gate.step_ratio > 0)
    assert gate.max_length == 4 and gate.counts.sum() == int((repeat & (labels["split"] == "train")).sum())
    m = json.loads((root / "lookup.json").read_text())
    assert m["step_ratio"] == pytest.approx(gate.step_ratio.tolist(), abs=1e-3)
    for split in ("val", "test"):
        r = m[split]
        assert r["roots"] == int((labels["split"] == split).sum()) and r["autoregressive_tps"] > 0
        assert r["gate_vs_ar"] > 0 and 0 <= r["gate_lookup_share"] <= 1
        assert r["oracle_vs_ar"] > 0 and 0 <= r["oracle_lookup_share"] <= 1 and r["roots_with_repeat"] > 0
        assert r["mae_gate"] >= 0 and r["mae_run_blind"] >= 0
    assert "gate fitted on" in capsys.readouterr().out


def test_no_train_trajectories_is_a_clear_error(params, tmp_path, capsys):
    from pipeline.cli import main

    root, path, _ = params
    bad = tmp_path / "params.yaml"
    bad.write_text(path.read_text().replace("  root_stride: 1\n", "  root_stride: 1\n  splits: [val]\n"))
    assert main(["lookup", "--params", str(bad), "--no-progress"]) == 2
    assert "must be a subset of train, val, test that holds train" in capsys.readouterr().err
