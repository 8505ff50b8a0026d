"""``branchpoint decode --selector``: the methods and actions the steps used, and clear errors for the wrong
folder (the PyTorch checkpoint), a missing local model folder and a run outside the project folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from selector_helpers import random_inputs, random_selector

from models.tiny import save_tiny_model

TINY_HIDDEN = 32  # models.tiny's default hidden size


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A params file for a saved tiny pair and a selector exported for its hidden sizes (SpecInfer only)."""
    from export.onnx_export import export_selector
    from models.selector import save_selector

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


def test_decode_reports_the_methods_and_actions_its_steps_used(project, tmp_path, capsys):
    from pipeline.cli import main

    root, params = project
    out = tmp_path / "run.json"
    assert main(["decode", "--params", params, "--selector", str(root / "selector"), "--prompt", "w5 w9",
                 "--max-new-tokens", "16", "--temperature", "1.0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    run = json.loads(out.read_text())
    used, stats = run["used"], run["stats"]
    assert sum(used["methods"].values()) == stats["steps"] == sum(used["actions"].values())
    assert set(used["methods"]) <= {"specinfer", "none"}  # never the config's default method (traversal)
    assert "traversal" not in printed and "traversal" not in stats["method"]
    assert stats["method"].startswith("selector (") and stats["methods"] == used["methods"]
    assert f"steps used: methods {next(iter(used['methods']))}" in printed


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
