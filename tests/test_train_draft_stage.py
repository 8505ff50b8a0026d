"""Stages trajectories -> train_draft end to end on the embedded SmolLM2, shrunk to a smoke run (about a minute)."""

import json
import subprocess
import sys

import pytest

from models.loading import load_pair


@pytest.mark.integration
def test_train_draft_stage_writes_a_loadable_artifact_and_metrics(tmp_path):
    from data_collection.trajectory_store import load_trajectories

    out, metrics, trajectories = tmp_path / "draft", tmp_path / "draft.json", tmp_path / "trajectories"
    overrides = {
        "prompts.max_prompts": 3, "trajectories.max_new_tokens": 8, "trajectories.out": trajectories,
        "trajectories.all_settings": "true", "train_draft.steps": 6, "train_draft.val_every": 3,
        "train_draft.warmup_steps": 2, "train_draft.batch_size": 16, "train_draft.timing_reps": 2,
        "train_draft.out": out, "train_draft.metrics": metrics, "model.draft": f"self_draft:{out}",
        "tracking.uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    args = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    for command in ("trajectories", "train-draft"):
        result = subprocess.run([sys.executable, "-m", "pipeline.cli", command, *args],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    values = json.loads(metrics.read_text())
    assert values["kind"] == "distilled" and values["draft"] == f"self_draft:{out}"
    assert not (out / "measured.json").exists()
    for key in ("acceptance_test_T1.0", "acceptance_test_T0.6"):
        assert 0.0 <= values[key] <= 1.0, (key, values[key])
    assert values["step_time_ratio"] > 0.0  # a timing: no bound here (a busy machine moves it; benchmarks judge it)
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


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny target and a tiny HF draft (saved folders) and trajectories of every split."""
    import numpy as np
    from tiny_models import save_tiny_model, tiny_lm

    from data_collection.trajectory_store import Trajectory, save_trajectories
    from models.self_draft import target_fingerprint

    base = tmp_path_factory.mktemp("measure_draft")
    target, draft = save_tiny_model(base / "target", 2, seed=0), save_tiny_model(base / "draft", 1, seed=1)
    rng = np.random.default_rng(0)
    trajs = [Trajectory(f"p{i}", "src", split, t, 1.0, 0, rng.integers(3, 60, 6).tolist(),
                        rng.integers(3, 60, 12).tolist())
             for i, (split, t) in enumerate([("draft", 1.0), ("val", 1.0), ("test", 1.0), ("test", 0.6)])]
    save_trajectories(base / "traj", trajs, {"target_fingerprint": target_fingerprint(tiny_lm(2, seed=0))})
    return base, target, draft


def _measure(base, target, draft_spec, name):
    """`branchpoint train-draft` in this process; returns the metrics and the out folder."""
    import torch

    from pipeline.cli import main

    sets = {"model.target": f"hf:{target}", "model.draft": draft_spec, "model.threads": 1,
            "trajectories.out": base / "traj", "train_draft.out": base / name, "train_draft.timing_reps": 2,
            "train_draft.timing_context": 16, "train_draft.metrics": base / f"{name}.json",
            "tracking.uri": f"sqlite:///{base / 'mlflow.db'}"}
    threads = torch.get_num_threads()
    try:
        assert main(["train-draft", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads((base / f"{name}.json").read_text()), base / name


def test_an_hf_draft_is_measured_not_trained(tiny_run, monkeypatch):
    """With model.draft an HF folder the stage trains nothing (no distillation, no adapter, no MLflow run) and its
    metrics describe THAT draft: the target measured as its own draft accepts every token, the tiny 1-layer
    draft far fewer."""
    import pipeline.train_draft as stage

    def no_training(*_a, **_k):
        raise AssertionError("train_draft distilled a self-draft although the pair's draft is an HF model")

    monkeypatch.setattr(stage, "train", no_training)
    base, target, draft = tiny_run
    values, out = _measure(base, target, f"hf:{draft}", "hf_draft")
    assert values["draft"] == f"hf:{draft}" and values["kind"] == "measured"
    assert sorted(p.name for p in out.iterdir()) == ["measured.json"]
    assert json.loads((out / "measured.json").read_text())["draft"] == f"hf:{draft}"
    assert not (base / "mlflow.db").exists()
    positions = {"T1.0": 12, "T0.6": 12}
    for name, n in positions.items():
        assert values[f"test_positions_{name}"] == n
        assert 0.0 < values[f"acceptance_test_{name}"] < 0.9, values[f"acceptance_test_{name}"]
    assert values["draft_step_ms"] > 0 and values["target_step_ms"] > 0
    same, _ = _measure(base, target, f"hf:{target}", "self")  # the target as its own draft: q = p everywhere
    for name in positions:
        assert abs(same[f"acceptance_test_{name}"] - 1.0) < 1e-5


def test_only_the_stages_own_self_draft_is_distilled(tmp_path):
    from types import SimpleNamespace

    from pipeline.train_draft import given_draft

    def cfg(draft, out="artifacts/draft"):
        return SimpleNamespace(model=SimpleNamespace(draft=draft), train_draft=SimpleNamespace(out=out))

    assert given_draft(cfg("self_draft:artifacts/draft")) is None
    assert given_draft(cfg("self_draft:./artifacts/draft/")) is None
    assert given_draft(cfg(f"self_draft:{tmp_path}", out=str(tmp_path / "x" / ".."))) is None
    assert given_draft(cfg("self_draft:other/draft")) == "self_draft:other/draft"  # a given self-draft: measured
    for spec in ("hf:/models/small", "gguf:/m/draft.gguf", "embedded:smollm2-135m-instruct"):
        assert given_draft(cfg(spec)) == spec


class _FlatLatency:
    """A latency model whose tree passes cost as much as a plain step and whose step line is 1 + 0.1 per token."""

    class step_ratios:  # noqa: N801 - the attribute the chain model reads
        @staticmethod
        def tree_vector():
            return 1.0, 0.0, 0.0, 0.1  # tables, step, forward, node

    @staticmethod
    def t_p(context, tokens):
        return 1.0


def test_the_draft_benchmark_row_is_the_stages_measurement_plus_the_chain_model(tiny_run):
    """benchmarks/bench_drafts.py's row reads the same `setting_stats` as the stage's metrics (one measurement, not a
    twin loop): equal acceptance per setting and depth, plus the best chain of the chain model."""
    import torch

    from benchmarks.bench_drafts import _row
    from models.loading import load_draft, load_model, load_tokenizer
    from pipeline.config import load_config
    from pipeline.train_draft import load_split_trajectories, measure_draft

    base, target_dir, draft_dir = tiny_run
    cfg = load_config(overrides=[f"model.target=hf:{target_dir}", f"trajectories.out={base / 'traj'}",
                                 "train_draft.timing_reps=2", "train_draft.timing_context=16"])
    tokenizer = load_tokenizer(cfg.model.target)
    target = load_model(cfg.model.target, torch.device("cpu"), torch.float32)
    draft = load_draft(f"hf:{draft_dir}", target, tokenizer, cfg.model.target, torch.float32)
    test = load_split_trajectories(cfg, target)["test"]
    row = _row(cfg, target, tokenizer, draft, test, _FlatLatency(), 16.0)
    stage = measure_draft(cfg, target, tokenizer, draft, test)
    for name in ("T1.0", "T0.6"):
        assert row[f"acceptance_test_{name}"] == pytest.approx(stage[f"acceptance_test_{name}"], abs=1e-9)
        assert row[f"test_positions_{name}"] == stage[f"test_positions_{name}"] == 12
        best = row[f"best_chain_{name}"]
        assert best["speedup"] == max(best["by_L"].values()) and best["L"] in best["by_L"]
    assert not any(k.startswith("breakdown_") for k in row)
