"""The DVC download route end to end: a temp git repo whose pipeline outputs a tiny exported selector,
``branchpoint publish`` (a temp local remote), then ``dvc artifacts get <repo> selector`` from another folder
gives a folder that SelectorRuntime loads as is (sha256 checked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from selector_helpers import random_inputs, random_selector

from pipeline.publish import next_version, publish

BIN = str(Path(sys.executable).parent)


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def env_path(monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    for k in ("GIT_DIR", "GIT_WORK_TREE"):
        monkeypatch.delenv(k, raising=False)


def test_next_version():
    assert next_version([]) == "selector@v0.0.1"
    assert next_version(["selector@v0.0.9", "selector@v0.1.2", "other@v3.0.0", "selector@vx"]) == "selector@v0.1.3"


def test_published_selector_comes_back_with_dvc_artifacts_get(tmp_path, env_path):
    from export.onnx_export import export_selector
    from export.runtime import SelectorRuntime

    net, meta, schema = random_selector("target_only", methods=("specinfer",))
    export_selector(net, meta, tmp_path / "exported", random_inputs(schema, 8),
                    np.full((8, len(meta["outputs"]["actions"])), 0.01, np.float32))
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("config", "user.email", "t@example.com", cwd=repo)
    _git("config", "user.name", "t", cwd=repo)
    subprocess.run(["dvc", "init", "-q"], cwd=repo, check=True)
    (repo / "dvc.yaml").write_text(
        f"stages:\n  export:\n    cmd: mkdir -p artifacts && cp -r {tmp_path / 'exported'} artifacts/selector && cp -r "
        f"{tmp_path / 'exported'} artifacts/selector_chain\n"
        "    outs:\n      - artifacts/selector\n      - artifacts/selector_chain\nartifacts:\n  selector:\n"
        "    path: artifacts/selector\n    type: model\n  selector_chain:\n    path: artifacts/selector_chain\n"
        "    type: model\n")
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", "pipeline", cwd=repo)
    subprocess.run(["dvc", "repro", "-q"], cwd=repo, check=True)
    done = publish(str(tmp_path / "remote"), "main", cwd=repo)
    assert done["versions"] == {"selector": "selector@v0.0.1", "selector_chain": "selector_chain@v0.0.1"}
    assert any((tmp_path / "remote").rglob("*"))
    shutil.rmtree(repo / ".dvc" / "cache")  # the data must come from the remote, not the repo's cache
    got = tmp_path / "elsewhere" / "selector"
    got.parent.mkdir()
    result = subprocess.run(["dvc", "artifacts", "get", str(repo), "selector", "-o", str(got)], cwd=got.parent,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in got.iterdir()) == ["selector.json", "selector.onnx"]
    assert SelectorRuntime(got).sidecar["onnx_sha256"] == SelectorRuntime(tmp_path / "exported").sidecar["onnx_sha256"]
    chain = tmp_path / "elsewhere" / "chain"
    result = subprocess.run(["dvc", "artifacts", "get", str(repo), "selector_chain", "-o", str(chain)],
                            cwd=got.parent, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and (chain / "selector.onnx").is_file(), result.stderr[-2000:]
    again = publish(str(tmp_path / "remote"), "main", cwd=repo)["versions"]  # a rerun: the next version of each
    assert again == {"selector": "selector@v0.0.2", "selector_chain": "selector_chain@v0.0.2"}
