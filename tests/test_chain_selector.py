"""The chain selector: its labels from the grid's chains, and stage chain_selector end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from decoding.actions import Action, ActionSpace
from selector.data import SelectorDataError, chain_labels


def test_chain_labels_average_the_grids_chains_of_each_length():
    space = ActionSpace(range(1, 3), range(0, 3), range(0, 2))  # K 1..2, L1 0..2, L2 0..1
    rng = np.random.default_rng(0)
    labels = rng.uniform(1, 3, (5, len(space)))
    se = rng.uniform(0, 0.2, (5, len(space)))
    chains, e, s = chain_labels(labels, se, list(space))
    assert chains == tuple(Action(1, n, 0) for n in range(4))  # lengths 0..3: (1, 2, 1) is the longest chain
    col = {a: i for i, a in enumerate(space)}
    length2 = [col[Action(1, 2, 0)], col[Action(1, 1, 1)]]  # (2, 2, 0) duplicates (1, 2, 0) and is left out
    np.testing.assert_allclose(e[:, 2], labels[:, length2].mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(s[:, 2], np.sqrt((se[:, length2] ** 2).sum(axis=1)) / 2, rtol=1e-6)
    np.testing.assert_allclose(e[:, 3], labels[:, col[Action(1, 2, 1)]], rtol=1e-6)
    branching = [a for a in space if a.K == 2 and a.L2 > 0]
    with pytest.raises(SelectorDataError, match="no chain"):
        chain_labels(labels[:, :len(branching)], se[:, :len(branching)], branching)


def test_the_chain_selector_section_refuses_a_method_that_is_not_naive_on_chains():
    from pipeline.sections import ChainSelectorConfig

    ChainSelectorConfig(method="naive_tree").validate()
    for method in ("traversal", "gbv", "nss"):
        with pytest.raises(ValueError, match="verified as naive on a chain"):
            ChainSelectorConfig(method=method).validate()


@pytest.mark.slow  # a collection, one Lightning training, an export and an MLflow download: ~2 minutes on 2 cores
def test_stage_trains_exports_registers_and_the_download_decodes_in_transformers(tmp_path, monkeypatch):
    import torch
    from engine_helpers import untied_pair
    from selector_helpers import build_collected, toy_latency

    from integrations.transformers import branchpoint_generate, load_chain_selector
    from pipeline.cli import main

    collected = build_collected(tmp_path / "data")
    profile = toy_latency().save(tmp_path / "latency.json")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("BRANCHPOINT_PARENT_RUN_ID", raising=False)
    assert main(["chain-selector", "--set", f"collect.out={collected}", "--set", f"profile.out={profile}",
                 "--set", "train.epochs=2", "--set", "train.baselines=[best_static]"]) == 0
    metrics = json.loads((tmp_path / "metrics/train_chain.json").read_text())
    assert metrics["method"] == "specinfer" and metrics["feature_set"] == "target_only"
    assert metrics["outputs"] == 5  # chains of 0..4 tokens: (1, 2, 2) is the grid's longest chain
    side = json.loads((tmp_path / "artifacts/selector_chain/selector.json").read_text())
    assert side["kind"] == "chain" and side["outputs"]["actions"] == [f"1,{n},0" for n in range(5)]
    dst = tmp_path / "downloaded"
    done = subprocess.run([sys.executable, "-m", "mlflow", "artifacts", "download", "-u",
                           "models:/branchpoint-chain-selector/1", "-d", str(dst)], capture_output=True, text=True,
                          env={"MLFLOW_TRACKING_URI": uri, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in dst.iterdir()) == ["selector.json", "selector.onnx"]
    target, draft = untied_pair(seed=3, noise=0.4)  # the pair build_collected collected with
    ids = torch.tensor([[1, 5, 9, 5, 9, 12]])
    plain = target.generate(ids, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    ours = branchpoint_generate(target, ids, selector=load_chain_selector(dst, target, latency=profile),
                                assistant=draft, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    assert ours.tolist() == plain.tolist()
