"""Selector training on two CPU processes (``train.devices: 2``, ``train.strategy: ddp``: Lightning's DDP over gloo)
gives the metrics of one device within noise, on a tiny collected dataset.

`branchpoint train` runs as a subprocess: Lightning's ``ddp`` strategy starts the second rank by running the same
command again (``ddp_spawn`` would pickle the data module into spawned workers and copy the weights back; the
CLI path is what a user runs). ``train.batch_size`` is the batch of one optimizer step over all devices, so both
runs take the same number of steps. Tolerance: path TPS of the selector on VAL and TEST within 4%, MAE within
0.03 (measured on this dataset: one device vs two 2.6% / 0.1% at seed 0; seeds 0 vs 1 on one device 0.7% / 0.7%,
on two 1.6% / 0.9%; MAE 0.237-0.251).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from selector_helpers import build_collected, toy_latency

ROOT = Path(__file__).resolve().parents[1]
TPS_TOL, MAE_TOL = 0.04, 0.03


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        build_collected(base / "data")
    finally:
        torch.set_num_threads(threads)
    toy_latency().save(base / "latency.json")
    return base


def _train(base: Path, devices: int, strategy: str) -> dict:
    name = f"devices{devices}"
    sets = {"collect.out": base / "data", "profile.out": base / "latency.json", "train.epochs": 4,
            "train.baselines": "[]", "train.batch_size": 32, "train.accelerator": "cpu", "train.devices": devices,
            "train.strategy": strategy, "train.out": base / name, "train.metrics": base / f"{name}.json",
            "tracking.uri": f"sqlite:///{base / name}.db"}
    cmd = [sys.executable, "-m", "pipeline.cli", "train", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    # the stage's own tracking store and a fresh process group: nothing an earlier test left in the environment
    # (an MLflow URI or a parent run id would send the runs elsewhere, a rank or master port would join another group)
    inherited = ("MLFLOW_", "BRANCHPOINT_", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(inherited)}, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=base, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((base / f"{name}.json").read_text())


def _selector_runs(db: Path) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sum(r.data.tags.get("model") == "selector" for r in runs)


def test_two_cpu_processes_train_like_one(collected):
    one, two = _train(collected, 1, "auto"), _train(collected, 2, "ddp")
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["optimizer_steps"] == two["optimizer_steps"] > 0  # the global batch is split, not doubled
    for split in ("val", "test"):
        a, b = one[split], two[split]
        gap = abs(b["tps"]["selector"] / a["tps"]["selector"] - 1.0)
        assert gap < TPS_TOL, f"{split}: path TPS {a['tps']['selector']:.2f} vs {b['tps']['selector']:.2f}"
        assert abs(a["mae"] - b["mae"]) < MAE_TOL, (split, a["mae"], b["mae"])
    assert _selector_runs(collected / "devices2.db") == 1  # rank 1 trained but logged and wrote nothing
    assert (collected / "devices2" / "selector.safetensors").is_file()
