"""MLflow tracking (pipeline/tracking.py): one experiment, one parent run per pipeline run with every stage run
nested under it, stage runs that start when their process started."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("BRANCHPOINT_PARENT_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps its artifacts in ./mlruns
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "bp-test"},
                                      "model": {"cache_dir": str(tmp_path / "cache")},
                                      "export": {"out": str(tmp_path / "no-selector")}}))
    return load_config(params)


def _runs(cfg):
    from mlflow import MlflowClient

    client = MlflowClient(cfg.tracking.uri)
    exps = client.search_experiments()
    runs = [r for e in exps for r in client.search_runs([e.experiment_id])]
    return {r.data.tags.get("stage"): r for r in runs}, {e.name for e in exps if e.name != "Default"}


def test_stage_runs_share_one_experiment_and_one_parent(cfg):
    import mlflow

    from pipeline import tracking

    with tracking.start_run(cfg, "export") as run:
        mlflow.log_metric("x", 1.0)
        export_id = run.info.run_id
    logger = tracking.lightning_logger(cfg, "train_draft", "train_draft")
    logger.log_metrics({"loss": 0.5})
    time.sleep(0.01)
    with tracking.start_run(cfg, "evaluate"):
        pass
    runs, experiments = _runs(cfg)
    assert experiments == {"bp-test"} and set(runs) == {"pipeline", "export", "train_draft", "evaluate"}
    parent = runs["pipeline"].info.run_id
    for stage in ("export", "train_draft", "evaluate"):
        assert runs[stage].data.tags["mlflow.parentRunId"] == parent, stage
    assert runs["export"].info.run_id == export_id
    # the stage runs start when the process started (not when they began logging); the parent spans them all
    assert runs["export"].info.start_time == tracking.PROCESS_START_MS == runs["evaluate"].info.start_time
    assert runs["pipeline"].info.end_time >= runs["evaluate"].info.end_time


def test_other_params_start_a_new_parent_and_the_env_var_wins(cfg, monkeypatch):
    from pipeline import tracking

    first = tracking.parent_run_id(cfg)
    assert tracking.parent_run_id(cfg) == first  # found again through the file under model.cache_dir
    # a stage that loads fewer sections of the same params belongs to the same pipeline run ...
    fewer = load_config(cfg.source, sections=("model", "tracking"))
    assert tracking.parent_run_id(fewer) == first
    # ... a value of any section, one the stage does not load included, starts another
    other = load_config(cfg.source, ["evaluate.prompts=3"])
    assert tracking.parent_run_id(other) != first
    monkeypatch.setenv("BRANCHPOINT_PARENT_RUN_ID", "")
    assert "mlflow.parentRunId" not in tracking.stage_tags(cfg, "export")
    monkeypatch.setenv("BRANCHPOINT_PARENT_RUN_ID", first)
    assert tracking.stage_tags(other, "export")["mlflow.parentRunId"] == first


def test_registering_twice_adds_a_version_whose_files_are_the_folder(cfg, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    from pipeline import tracking
    from pipeline.export import register_selector

    folder = tmp_path / "sel"
    folder.mkdir()
    (folder / "selector.onnx").write_bytes(b"onnx")
    (folder / "selector.json").write_text("{}")
    client = MlflowClient(cfg.tracking.uri)
    versions = []
    for _ in range(2):
        with tracking.start_run(cfg, "export") as run:
            mlflow.log_artifacts(str(folder), artifact_path="selector")
            versions.append(register_selector(client, "bp-selector", run, "train-1"))
    assert [int(v.version) for v in versions] == [1, 2] and versions[1].tags == {"train_run_id": "train-1"}
    got = mlflow.artifacts.download_artifacts("models:/bp-selector/2", dst_path=str(tmp_path / "got"))
    assert sorted(p.name for p in Path(got).iterdir()) == ["selector.json", "selector.onnx"]
