"""The collect stage end to end on tiny models (subprocesses, as a user runs it): kill -9 then rerun gives
the rows of an uninterrupted run; two processes (--shard 0/2, 1/2) merge to the rows of one process;
the metrics file is written; a changed configuration is refused, and so is a change of the code collect runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tiny_models import save_tiny_model

from data_collection.dataset import load_collected
from data_collection.trajectory_store import Trajectory, save_trajectories

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from selector_helpers import toy_latency

    base = tmp_path_factory.mktemp("collect_stage")
    target = save_tiny_model(base / "target", 2, seed=0)
    draft = save_tiny_model(base / "draft", 1, seed=1)
    rng = np.random.default_rng(0)
    trajs = [Trajectory(f"p{i}", "src", split, t, 1.0, 0, rng.integers(3, 60, 6).tolist(),
                        rng.integers(3, 60, 40).tolist())
             for i, (split, t) in enumerate([("train", 1.0), ("train", 0.6), ("val", 1.0), ("test", 0.6),
                                              ("test", 1.0), ("draft", 1.0)])]
    save_trajectories(base / "traj", trajs, {"stage": "test"})
    toy_latency().save(base / "latency.json")
    return base, target, draft


def _args(base, target, draft, out="collect", extra=()):
    sets = {"model.target": f"hf:{target}", "model.draft": f"hf:{draft}", "model.threads": 1,
            "trajectories.out": base / "traj", "profile.out": base / "latency.json",
            "collect.out": base / out, "collect.metrics": base / f"{out}.json", "collect.root_stride": 12,
            "collect.num_trees": 2, "collect.shard_size": 1, "collect.methods": "[traversal, specinfer, gbv]",
            "actions.K": "[1, 2]", "actions.L1": "[0, 2]", "actions.L2": "[0, 2]"}
    cmd = [sys.executable, "-m", "pipeline.cli", "collect"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd + list(extra)


def _run(cmd, **kw):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, **kw)


def _rows(folder):
    ds = load_collected(folder).sort(["key", "position"])
    return ds.to_pandas()


def test_kill_resume_and_two_process_sharding(setup):
    base, target, draft = setup
    full = _run(_args(base, target, draft, "full"))
    assert full.returncode == 0, full.stderr
    metrics = json.loads((base / "full.json").read_text())
    assert metrics["roots"] == metrics["roots_per_split"]["train"] + metrics["roots_per_split"]["val"] + \
        metrics["roots_per_split"]["test"] > 0
    assert set(metrics["methods"]) == {"traversal", "specinfer", "gbv"}
    ref = _rows(base / "full")
    assert set(ref["split"]) == {"train", "val", "test"}  # never the draft's prompts
    # kill -9 after the first shard, then rerun: the same rows
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(_args(base, target, draft, "killed"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    shards = base / "killed" / "shards"
    deadline = time.time() + 120
    while time.time() < deadline and not (shards.exists() and any(shards.glob("*.parquet"))):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list(shards.glob("*.parquet")))
    assert 1 <= written < 5, f"the kill came too late to test resumption ({written} shards)"
    again = _run(_args(base, target, draft, "killed"))
    assert again.returncode == 0, again.stderr
    killed = _rows(base / "killed")
    assert len(killed) == len(ref)
    assert list(killed["key"]) == list(ref["key"]) and list(killed["position"]) == list(ref["position"])
    for col in ("E_traversal", "E_gbv", "h_q_root"):
        np.testing.assert_allclose(np.stack(killed[col]), np.stack(ref[col]), rtol=1e-6, err_msg=col)
    np.testing.assert_allclose(killed["entropy_p_prev"], ref["entropy_p_prev"], rtol=1e-6)
    # two processes, then the merge: the same rows as one process
    procs = [subprocess.Popen(_args(base, target, draft, "sharded", ["--shard", f"{i}/2"]), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    merged = _run(_args(base, target, draft, "sharded", ["--merge"]))
    assert merged.returncode == 0, merged.stderr
    sharded = _rows(base / "sharded")
    assert list(sharded["key"]) == list(ref["key"]) and list(sharded["position"]) == list(ref["position"])
    np.testing.assert_allclose(np.stack(sharded["E_specinfer"]), np.stack(ref["E_specinfer"]), rtol=1e-6)


def test_changed_config_is_refused_in_one_line(setup):
    base, target, draft = setup
    first = _run(_args(base, target, draft, "refuse", ["--set", "collect.max_roots_per_trajectory=1"]))
    assert first.returncode == 0, first.stderr
    second = _run(_args(base, target, draft, "refuse", ["--set", "collect.max_roots_per_trajectory=1",
                                                        "--set", "collect.num_trees=3"]))
    assert second.returncode == 2
    err = second.stderr.strip().splitlines()
    assert "collect.num_trees: 2 -> 3" in err[0] and "--restart" in err[0]
    third = _run(_args(base, target, draft, "refuse", ["--set", "collect.max_roots_per_trajectory=1",
                                                       "--set", "collect.num_trees=3", "--restart-on-change"]))
    assert third.returncode == 0, third.stderr


def test_the_configuration_hash_covers_the_code_collect_runs(tmp_path):
    """An edit of a module collect runs (the tree pass, the 4-bit kernel's layers) changes `code_digest`, so a resumed
    collection starts over instead of appending rows computed by other code; an edit of a module it never imports
    (the report, the decode loop) does not."""
    from pipeline.collect import code_digest
    from pipeline.stage_deps import PACKAGES

    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_digest(tmp_path)
    assert before == code_digest(ROOT)  # the same files give the same digest wherever they lie
    for unread in ("evaluation/report.py", "engine/decoder.py"):
        path = tmp_path / unread
        path.write_text(path.read_text() + "\n# not run by collect\n")
    assert code_digest(tmp_path) == before
    digests = {before}
    for read in ("engine/tree_pass.py", "models/int4.py"):
        path = tmp_path / read
        path.write_text(path.read_text() + "\n# an edit\n")
        digests.add(code_digest(tmp_path))
    assert len(digests) == 3
