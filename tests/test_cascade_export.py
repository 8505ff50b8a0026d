"""A tiny two-stage selector exported as a cascade folder (export/cascade.py) and decoded end to end through
`branchpoint decode --selector`: stage 1 (target_only) declines without a draft pass, stage 2 (paper) picks
only speculating outputs; the sidecar's sha256 of each stage is checked."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from selector_helpers import random_inputs, random_selector
from tiny_models import save_tiny_model

HIDDEN = (32, 32)  # the tiny models' hidden sizes


def _export(folder, feature_set, seed, bias=0.0):
    import torch

    from export.onnx_export import export_selector

    net, meta, schema = random_selector(feature_set, methods=("traversal", "specinfer"), hidden=HIDDEN, seed=seed)
    with torch.no_grad():
        net.mlp[-1].bias.add_(bias)
    inputs = random_inputs(schema, 16, seed=seed)
    export_selector(net, meta, folder, inputs, np.full((16, 2 * len(meta["outputs"]["actions"])), 0.01, np.float32))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from export.cascade import write_cascade_sidecar

    root = tmp_path_factory.mktemp("cascade")
    t = save_tiny_model(root / "target", 2, seed=0)
    d = save_tiny_model(root / "draft", 1, seed=1)
    (root / "params.yaml").write_text(f"model:\n  target: hf:{t}\n  draft: hf:{d}\n  device: cpu\n")
    _export(root / "cascade/stage1", "target_only", seed=3)
    _export(root / "cascade/stage2", "paper", seed=4)
    write_cascade_sidecar(root / "cascade")
    shutil.copytree(root / "cascade/stage2", root / "declining/stage2")
    _export(root / "declining/stage1", "target_only", seed=3, bias=-20.0)  # predicts Ê << 1: always declines
    write_cascade_sidecar(root / "declining")
    return root


def test_the_cascade_folder_loads_as_a_two_stage_policy(project):
    from export.cascade import CascadeRuntime, load_selector
    from export.runtime import SelectorRuntime

    rt = load_selector(project / "cascade")
    assert isinstance(rt, CascadeRuntime) and not rt.needs_draft and rt.stage2.needs_draft
    assert rt.auto and rt.methods == ["traversal", "specinfer"] and rt.feature_set == "cascade(target_only -> paper)"
    spec = [a.tree_size > 0 for _, a in rt.stage2.table]
    assert (rt.stage2.allowed == (np.array(spec) & rt.stage2.valid)).all()  # stage 2 never declines
    assert isinstance(load_selector(project / "cascade/stage1"), SelectorRuntime)  # a single selector as before
    restricted = load_selector(project / "cascade", methods=["specinfer"])
    assert restricted.methods == ["specinfer"]
    for stage in (restricted.stage1, restricted.stage2):  # both stages restricted to SpecInfer's outputs
        assert {m for (m, _), ok in zip(stage.table, stage.allowed, strict=True) if ok} == {"specinfer"}
    side = json.loads((project / "cascade/cascade.json").read_text())
    assert side["stages"]["stage1"]["feature_set"] == "target_only" and len(side["stages"]["stage2"]["onnx_sha256"]) == 64


def test_a_modified_stage_is_refused(project, tmp_path):
    from export.cascade import load_selector, write_cascade_sidecar
    from export.runtime import SelectorArtifactError

    folder = tmp_path / "cascade"
    shutil.copytree(project / "cascade", folder)
    side = folder / "stage2/selector.json"
    side.write_text(side.read_text().replace('"pair"', '"pair" ', 1))
    with pytest.raises(SelectorArtifactError, match="stage2/selector.json: sha256"):
        load_selector(folder)
    shutil.rmtree(folder / "stage1")
    shutil.copytree(project / "cascade/stage2", folder / "stage1")  # a draft-side stage 1
    with pytest.raises(SelectorArtifactError, match="target-side"):
        write_cascade_sidecar(folder)


def test_decode_cli_takes_a_cascade_folder(project, tmp_path, capsys):
    from pipeline.cli import main

    out = tmp_path / "run.json"
    assert main(["decode", "--params", str(project / "params.yaml"), "--selector", str(project / "cascade"),
                 "--prompt", "w5 w9", "--max-new-tokens", "24", "--temperature", "1.0", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    used = run["used"]
    assert sum(used["actions"].values()) == run["stats"]["steps"]
    assert any(a != "1,0,0" for a in used["actions"])  # it speculated at some steps, with stage 2's trees


@pytest.mark.parametrize("folder,temperature", [("cascade", 1.0), ("cascade", 0.0), ("declining", 1.0)])
def test_the_exported_cascade_decodes_with_no_draft_work_on_declined_steps(project, folder, temperature):
    from decoding.engine import SpeculativeDecoder
    from decoding.sampling import Sampling
    from export.cascade import load_selector
    from models.loading import load_pair

    pair = load_pair(f"hf:{project / 'target'}", f"hf:{project / 'draft'}", "cpu", "float32")
    calls = {"draft": 0}
    pair.draft.register_forward_pre_hook(lambda *a: calls.__setitem__("draft", calls["draft"] + 1))
    dec = SpeculativeDecoder(pair.target, pair.draft, pair.vocab_size)
    per_step, last = [], {"draft": 0}

    def record(state, step):
        per_step.append((step.action.tree_size, calls["draft"] - last["draft"]))
        last["draft"] = calls["draft"]

    sampling = Sampling(temperature)
    prompt = [1, 7, 9, 12, 4]
    res = dec.generate(prompt, 40, "traversal", load_selector(project / folder), sampling, seed=1, on_step=record)
    assert all(d == 0 for size, d in per_step if size == 0)  # a declined step is one plain target step
    assert all(d >= 1 for size, d in per_step if size > 0)
    if folder == "declining":  # never a draft forward: the very autoregressive decode (same seed, same tokens)
        assert calls["draft"] == 0 and {size for size, _ in per_step} == {0}
    else:
        assert all(size > 0 for size, _ in per_step)  # stage 2 never declines once stage 1 speculates
    if temperature == 0.0 or folder == "declining":  # token-identical to autoregressive decoding
        assert res.tokens == dec.generate(prompt, 40, "autoregressive", sampling=sampling, seed=1).tokens


@pytest.mark.slow  # three Lightning trainings and a collection: ~3-4 minutes on 2 shared cores
def test_train_and_export_a_cascade_from_the_same_labels(tmp_path, monkeypatch):
    """``train.feature_set=cascade`` trains both stages, ``export`` writes the cascade folder; a later single
    selector replaces it (no stale stage left for export or the runtime)."""
    from selector_helpers import build_collected, toy_latency

    from export.cascade import CascadeRuntime, load_selector
    from export.runtime import SelectorRuntime
    from pipeline.cli import main

    collected = build_collected(tmp_path / "data")
    profile = toy_latency().save(tmp_path / "latency.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    common = ["--set", f"collect.out={collected}", "--set", f"profile.out={profile}", "--set", "train.epochs=1",
              "--set", "train.method=auto", "--set", "train.baselines=[]", "--set", "train.out=sel",
              "--set", "train.metrics=metrics/train.json", "--set", "export.out=onnx"]
    assert main(["train", *common, "--set", "train.feature_set=cascade"]) == 0
    metrics = json.loads((tmp_path / "metrics/train.json").read_text())
    assert metrics["feature_set"] == "cascade" and list(metrics["stages"]) == ["stage1", "stage2"]
    assert [metrics["stages"][s]["feature_set"] for s in ("stage1", "stage2")] == ["target_only", "paper"]
    assert all(metrics["stages"][s]["test"]["tps"]["selector"] > 0 for s in ("stage1", "stage2"))
    for split in ("val", "test"):  # the cascade itself, offline, both stages' costs charged
        c = metrics["cascade"][split]
        assert c["test_roots"] > 0 and 0 < c["selector_vs_oracle"] <= 1 + 1e-9 and 0 <= c["speculate_fraction"] <= 1
    assert main(["export", "--no-mlflow", *common]) == 0
    rt = load_selector(tmp_path / "onnx")
    assert isinstance(rt, CascadeRuntime) and rt.stage1.feature_set == "target_only"
    assert rt.stage2.feature_set == "paper" and rt.auto
    assert main(["train", *common, "--set", "train.feature_set=target_only"]) == 0
    assert not (tmp_path / "sel/stage1").exists()
    assert main(["export", "--no-mlflow", *common]) == 0
    assert isinstance(load_selector(tmp_path / "onnx"), SelectorRuntime)
    assert not (tmp_path / "onnx/cascade.json").exists()


def test_a_cascade_downloaded_from_the_mlflow_registry_decodes(project, tmp_path, monkeypatch, capsys):
    """The export logs a cascade folder as the run's selector/ artifacts and registers it: the registry download
    is the cascade folder itself, and `decode --selector` takes it as is."""
    import subprocess
    import sys

    from decoding.files import read_json
    from export.cascade import load_selector
    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.export import log_cascade_to_mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("BRANCHPOINT_PARENT_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps its artifacts in ./mlruns
    params = str(project / "params.yaml")
    cfg = load_config(params, [f"model.cache_dir={tmp_path / 'cache'}"])
    side = read_json(project / "cascade" / "cascade.json", ValueError, "")
    where = log_cascade_to_mlflow(cfg, project / "cascade", side, train_run_id="train-run-7")
    assert f"models:/{cfg.export.registered_model}/1" in where
    dst = tmp_path / "downloaded"
    done = subprocess.run([sys.executable, "-m", "mlflow", "artifacts", "download", "-u",
                           f"models:/{cfg.export.registered_model}/1", "-d", str(dst)], capture_output=True, text=True,
                          env={"MLFLOW_TRACKING_URI": uri, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in dst.iterdir()) == ["cascade.json", "stage1", "stage2"]
    assert type(load_selector(dst)).__name__ == type(load_selector(project / "cascade")).__name__
    out = tmp_path / "run.json"
    assert main(["decode", "--params", params, "--selector", str(dst), "--max-new-tokens", "4",
                 "--json", str(out)]) == 0, capsys.readouterr().err
    assert out.is_file()
