"""Stages trajectories -> train_draft end to end on the embedded SmolLM2, shrunk to a smoke run (about a minute)."""

import json
import subprocess
import sys

import pytest

from models.loading import load_pair


@pytest.mark.integration
def test_train_draft_stage_writes_a_loadable_artifact_and_metrics(tmp_path):
    from data_collection.trajectories import load_trajectories

    out, metrics, trajectories = tmp_path / "draft", tmp_path / "draft.json", tmp_path / "trajectories"
    overrides = {
        "prompts.max_prompts": 3, "trajectories.max_new_tokens": 8, "trajectories.out": trajectories,
        "trajectories.all_settings": "true", "train_draft.steps": 6, "train_draft.val_every": 3,
        "train_draft.warmup_steps": 2, "train_draft.batch_size": 16, "train_draft.timing_reps": 2,
        "train_draft.out": out, "train_draft.metrics": metrics,
        "tracking.uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    args = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    for command in ("trajectories", "train-draft"):
        result = subprocess.run([sys.executable, "-m", "pipeline.cli", command, *args],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    values = json.loads(metrics.read_text())
    for key in ("acceptance_test_T1.0", "acceptance_test_T0.6", "step_time_ratio"):
        assert 0.0 <= values[key] <= 1.0, (key, values[key])
    stored = load_trajectories(trajectories)
    # distillation records: one per DRAFT continuation token (teacher forcing, nothing re-sampled)
    assert values["train_records"] == sum(len(t.continuation_ids) for t in stored if t.split == "draft")
    assert values["val_records"] == sum(len(t.continuation_ids) for t in stored if t.split == "val")
    for t in (1.0, 0.6):  # TEST positions are the TEST trajectories sampled at that temperature
        positions = sum(len(s.continuation_ids) for s in stored if s.split == "test" and s.temperature == t)
        assert values[f"test_positions_T{t}"] == positions
        for part in values[f"breakdown_test_T{t}"].values():  # the breakdowns partition them
            assert sum(v["positions"] for v in part.values()) == positions
    pair = load_pair("embedded:smollm2-135m-instruct", f"self_draft:{out}", device="cpu")
    assert pair.vocab_size == 49152 and pair.describe()["draft"]["layers"] == 6


def test_mlflow_metric_names_flatten_the_breakdowns():
    import re

    from pipeline.train_draft import _mlflow_metrics

    metrics = {
        "acceptance_test_T1.0": 0.3, "step_time_ratio": 0.2, "train_records": 10,
        "breakdown_test_T1.0": {"by_source": {"humaneval": {"acceptance": 0.4, "positions": 3}},
                                "by_target_entropy_nats": {"[3, inf)": {"acceptance": 0.1, "positions": 2}}},
    }
    assert _mlflow_metrics(metrics) == {
        "test/acceptance_T1.0": 0.3, "test/step_time_ratio": 0.2,
        "test/acceptance_T1.0/by_source/humaneval": 0.4,
        "test/acceptance_T1.0/by_target_entropy_nats/3-inf": 0.1,
    }
    # MLflow accepts alphanumerics, underscores, dashes, periods, spaces, colons and slashes
    assert all(re.fullmatch(r"[\w\-. :/]+", name) for name in _mlflow_metrics(metrics))


def test_threads_block_sets_and_restores_torch_threads():
    """Teacher forcing runs on model.threads cores, the fit on train_draft.threads: the block restores the count
    it found, also when its body raises."""
    import torch

    from pipeline.train_draft import _threads

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with _threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), _threads(other):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
