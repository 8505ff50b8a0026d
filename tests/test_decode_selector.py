"""``branchpoint decode --selector``: the methods and actions the steps used, and clear errors for the wrong
folder (the PyTorch checkpoint), a missing local model folder and a run outside the project folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from selector_helpers import random_inputs, random_selector
from tiny_models import save_tiny_model

TINY_HIDDEN = 32  # tests/tiny_models.py's default hidden size


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A params file for a saved tiny pair and a selector exported for its hidden sizes (SpecInfer only)."""
    from export.onnx_export import export_selector
    from selector.network import save_selector

    root = tmp_path_factory.mktemp("project")
    t = save_tiny_model(root / "target", 2, seed=0)
    d = save_tiny_model(root / "draft", 1, seed=1)
    params = root / "params.yaml"
    params.write_text(f"model:\n  target: hf:{t}\n  draft: hf:{d}\n  device: cpu\n")
    net, meta, schema = random_selector("target_only", methods=("specinfer",), hidden=(TINY_HIDDEN, TINY_HIDDEN))
    inputs = random_inputs(schema, 16, seed=2)
    seconds = np.full((16, len(meta["outputs"]["actions"])), 0.01, np.float32)
    export_selector(net, meta, root / "selector", inputs, seconds)
    save_selector(root / "selector_torch", net, meta)
    return root, str(params)


def test_decode_reports_the_step_classes_its_steps_used(project, tmp_path, capsys):
    from pipeline.cli import main

    root, params = project
    out = tmp_path / "run.json"
    assert main(["decode", "--params", params, "--selector", str(root / "selector"), "--prompt", "w5 w9",
                 "--max-new-tokens", "16", "--temperature", "1.0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    run = json.loads(out.read_text())
    used, stats = run["used"], run["stats"]
    assert sum(used.values()) == stats["steps"] == sum(stats["classes"].values())
    assert {k.split(":")[0] for k in used} <= {"specinfer", "plain"}  # never the config's default method (traversal)
    assert "traversal" not in printed and "traversal" not in stats["method"]
    assert stats["method"].startswith("selector (") and set(stats["methods"]) <= {"specinfer"}
    assert f"steps used: {next(iter(used))} " in printed


def _error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("branchpoint decode: error:")]
    assert len(lines) == 1
    return lines[0]


def test_decode_with_the_pytorch_checkpoint_points_at_the_export(project, capsys):
    from pipeline.cli import main

    root, params = project
    assert main(["decode", "--params", params, "--selector", str(root / "selector_torch")]) == 2
    err = _error(capsys)
    assert "PyTorch checkpoint" in err and "artifacts/selector" in err


def test_decode_with_a_missing_local_model_folder_says_so(project, capsys):
    from pipeline.cli import main

    _, params = project
    assert main(["decode", "--params", params, "--set", "model.target=hf:/no/such/model-dir"]) == 2
    err = _error(capsys)
    assert "/no/such/model-dir not found" in err and "Repo id" not in err


def test_decode_outside_the_project_names_the_missing_params(tmp_path, monkeypatch, capsys):
    """No params.yaml here: one error naming it, before any model (or GGUF cache) is touched."""
    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["decode", "--selector", "artifacts/selector"]) == 2
    err = _error(capsys)
    assert "no params.yaml" in err and "--params" in err
    assert list(tmp_path.iterdir()) == []  # no .cache/branchpoint written here


def test_selector_downloaded_from_the_mlflow_registry_and_a_run_decodes(project, tmp_path, monkeypatch, capsys):
    """Export's MLflow logging into a temp store; both download routes of the README give a folder that
    SelectorRuntime and `decode --selector` take as is; an evaluate run names the train run it measured."""
    import subprocess
    import sys

    from decoding.files import read_json
    from export.runtime import SelectorRuntime
    from pipeline import tracking
    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.export import log_to_mlflow

    root, params = project
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("BRANCHPOINT_PARENT_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps its artifacts in ./mlruns
    cfg = load_config(params, [f"model.cache_dir={tmp_path / 'cache'}", f"export.out={root / 'selector'}"])
    sidecar = read_json(root / "selector" / "selector.json", ValueError, "")
    inputs = random_inputs(SelectorRuntime(root / "selector").schema, 2)
    where = log_to_mlflow(cfg, root / "selector", sidecar, inputs, train_run_id="train-run-123")
    assert f"models:/{cfg.export.registered_model}/1" in where
    run_id = where.split()[1].rstrip(";")
    mlflow_cli = [sys.executable, "-m", "mlflow", "artifacts", "download"]
    env = {"MLFLOW_TRACKING_URI": uri, "PATH": "/usr/bin:/bin"}
    for route, args in {"registry": ["-u", f"models:/{cfg.export.registered_model}/1"],
                        "run": ["-r", run_id, "-a", "selector"]}.items():
        dst = tmp_path / route
        done = subprocess.run([*mlflow_cli, *args, "-d", str(dst)], capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        folder = dst if route == "registry" else dst / "selector"
        assert sorted(p.name for p in folder.iterdir()) == ["selector.json", "selector.onnx"], route
        assert SelectorRuntime(folder).sidecar["onnx_sha256"] == sidecar["onnx_sha256"]
        out = tmp_path / f"{route}.json"
        assert main(["decode", "--params", params, "--selector", str(folder), "--max-new-tokens", "4",
                     "--json", str(out)]) == 0, capsys.readouterr().err
        assert out.is_file()
    with tracking.start_run(cfg, "evaluate") as run:
        evaluate_id = run.info.run_id
    from mlflow import MlflowClient

    tags = MlflowClient(uri).get_run(evaluate_id).data.tags
    assert tags["train_run_id"] == "train-run-123" and tags["export_run_id"] == run_id
    assert tags["selector_sha256"] == sidecar["onnx_sha256"]
