"""Test data for the selector stage: a small REAL collected dataset (tiny random pair, `RootCollector`,
the same `_table` / `ShardWriter` / manifest path as `branchpoint collect`) and a fake latency model with
the contract of `decoding.latency.LatencyModel` (t_q, t_p, feature_seconds, step_seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from engine_helpers import VOCAB, untied_pair

from decoding.actions import ActionSpace

SPACE = ActionSpace(range(1, 3), range(0, 3), range(0, 3))  # 18 actions
METHODS = ["traversal", "specinfer"]
SETTINGS = [(1.0, 1.0), (0.6, 0.95)]
SPLITS = ["train", "train", "train", "train", "val", "val", "test", "test"]  # by prompt


class FakeLatency:
    """Section 6's step time with a linear draft step and a linear target pass (seconds)."""

    feature_seconds = 2e-4

    def __init__(self, draft_base: float = 1e-3, target_base: float = 5e-3, target_per_token: float = 0.08):
        self.draft_base, self.target_base, self.per_token = draft_base, target_base, target_per_token
        self.meta = {"fake": True}

    def t_q(self, l, rows):  # noqa: E741
        return self.draft_base * (1 + 1e-3 * np.asarray(l, float)) * (1 + 0.2 * (np.asarray(rows, float) - 1))

    def t_p(self, l, tokens):  # noqa: E741
        return self.target_base * (1 + 1e-3 * np.asarray(l, float)) * (1 + self.per_token * (np.asarray(tokens, float) - 1))

    def step_seconds(self, l, actions, features=None):  # noqa: E741
        out = []
        for a in actions:
            t = sum(float(self.t_q(l + j, 1)) for j in range(a.L1))
            t += sum(float(self.t_q(l + a.L1 + j, a.K)) for j in range(a.L2))
            t += float(self.t_p(l, 1 + a.L1 + a.K * a.L2))
            if features is not None:
                t += self.feature_seconds
            if features == "paper" and a.tree_size == 0:
                t += float(self.t_q(l, 1))
            out.append(t)
        return np.array(out)


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


def write_fake_profile(path: Path) -> Path:
    """A JSON marker for the fake latency model (tests monkeypatch the loader)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fake": True}))
    return path
