"""Test data for the selector stage: a small REAL collected dataset (tiny random pair, `RootCollector`,
the same `_table` / `ShardWriter` / manifest path as `branchpoint collect`) and a small real latency model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
from engine_helpers import VOCAB, untied_pair

from decoding.actions import ActionSpace

SPACE = ActionSpace(range(1, 3), range(0, 3), range(0, 3))  # 18 actions
METHODS = ["traversal", "specinfer"]
SETTINGS = [(1.0, 1.0), (0.6, 0.95)]
SPLITS = ["train", "train", "train", "train", "val", "val", "test", "test"]  # by prompt


def tiny_latency(feature_seconds: float = 2e-4):
    """A real `LatencyModel` with linear tables: draft step ~1 ms (+20% per extra row), target pass ~5 ms
    (+8% per extra token), both growing 0.1% per context token."""
    from decoding.latency import LatencyModel

    contexts, rows, tokens = np.array([1, 64, 256]), np.array([1, 2, 4]), np.array([1, 2, 4, 8, 16, 32])
    grow = 1 + 1e-3 * contexts[:, None]
    return LatencyModel(contexts, rows, 1e-3 * grow * (1 + 0.2 * (rows[None] - 1)), tokens,
                        5e-3 * grow * (1 + 0.08 * (tokens[None] - 1)), feature_seconds, {"machine": "test"})


def build_collected(out: Path, prompts: int = 8, length: int = 72, stride: int = 6, seed: int = 0) -> Path:
    """Collect a tiny dataset into ``out`` (prompt i gets split SPLITS[i % 8] and source "src<i % 2>")."""
    from data_collection.collect import RootCollector
    from data_collection.dataset import FORMAT_VERSION, ShardWriter, merge_manifests, write_json_atomic
    from decoding.features import FeatureSchema
    from decoding.sampling import Sampling
    from pipeline.collect import _table, trajectory_key

    target, draft = untied_pair(seed=3, noise=0.4)
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS, num_trees=2, seed=seed)
    rng = np.random.default_rng(seed)
    hidden = {"target": int(target.config.hidden_size), "draft": int(draft.config.hidden_size)}
    header = {"format_version": FORMAT_VERSION, "config_hash": "tiny0123", "config": {"tiny": True},
              "pair": {"target": "tiny", "draft": "tiny-noisy", "hidden_sizes": hidden, "vocab_size": VOCAB},
              "actions": [str(a) for a in SPACE], "methods": METHODS, "num_trees": 2, "root_stride": stride,
              "grid": {"K": [1, 2], "L1": [0, 2], "L2": [0, 2]},
              "schema": FeatureSchema.for_pair("paper", hidden["target"], hidden["draft"]).to_dict(),
              "shard": {"index": 0, "count": 1}}
    writer = ShardWriter(out, 0, 1, header)
    trajs, rows_list = [], []
    for p in range(prompts):
        seq = [int(x) for x in rng.integers(3, VOCAB, length)]
        for s, (temp, top_p) in enumerate(SETTINGS):
            t = SimpleNamespace(prompt_id=f"p{p}", source=f"src{p % 2}", split=SPLITS[p % len(SPLITS)],
                                temperature=temp, top_p=top_p, sample=0)
            positions = list(range(8 + s, length, stride))
            rows_list.append(collector.collect(seq, positions, Sampling(temp, top_p), trajectory_key(t)))
            trajs.append(t)
    writer.write(0, _table(trajs, rows_list, METHODS, len(SPACE)))
    writer.manifest["complete"] = True
    write_json_atomic(writer.path, writer.manifest)
    merge_manifests(out)
    return out
