"""Shared pieces for selector tests: a linear toy latency profile, a random selector with its meta, and a
small REAL collected dataset (`build_collected`: tiny random pair, `RootCollector`, the same `_table` /
`ShardWriter` / manifest path as `branchpoint collect`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from engine_helpers import VOCAB, untied_pair

from decoding.actions import ActionSpace
from decoding.features import FeatureSchema
from decoding.latency import LatencyModel
from selector.network import NetShape, SelectorNet

SPACE = ActionSpace(range(1, 3), range(0, 3), range(0, 3))
METHODS = ["traversal", "specinfer"]  # of build_collected
SETTINGS = [(1.0, 1.0), (0.6, 0.95)]
SPLITS = ["train", "train", "train", "train", "val", "val", "test", "test"]  # by prompt


def toy_latency() -> LatencyModel:
    """t_q(c, r) = 2 r + c / 100 ms, t_p(c, n) = 10 + 2 n + c / 10 ms on a grid covering SPACE's trees."""
    contexts = np.array([16.0, 256.0, 1024.0])
    rows = np.array([1, 2, 3, 4])
    tokens = np.arange(1, 17)
    return LatencyModel(contexts, rows, 1e-3 * (2 * rows[None, :] + contexts[:, None] / 100), tokens,
                        1e-3 * (10 + 2 * tokens[None, :] + contexts[:, None] / 10),
                        {"target_only": 0.3e-3, "paper": 0.5e-3}, {"machine": "toy"})


def random_selector(feature_set: str = "paper", methods=("traversal",), seed: int = 0, hidden=(12, 8),
                    objective: str = "regression"):
    """A randomly initialised SelectorNet (known outputs fixed / tied, `OutputLayout.constraints`) and the
    meta `selector.network.save_selector` expects."""
    from selector.network import OutputLayout

    torch.manual_seed(seed)
    schema = FeatureSchema.for_pair(feature_set, *hidden)
    shapes = schema.input_shapes()
    actions = [str(a) for a in SPACE]
    outputs = len(methods) * len(actions)
    layout = OutputLayout(tuple(methods), tuple(SPACE), len(methods) > 1)
    net = SelectorNet({h: shapes[h][0] for h in schema.hidden}, len(schema.scalars), outputs,
                      NetShape(16, (32, 16), 0.0), tied=layout.constraints()[0],
                      fixed=layout.constraints()[1]).eval()
    with torch.no_grad():  # around the labels' scale (as training starts, `init_output_bias`), so it speculates
        net.mlp[-1].bias.add_(2.0)
    valid = [not (m == "bv" and a.K > 1 and a.L2 > 0) for m in methods for a in SPACE]
    meta = {"feature_set": feature_set, "schema": schema.to_dict(),
            "outputs": {"methods": list(methods), "actions": actions, "auto": len(methods) > 1, "valid": valid},
            "latency": toy_latency().to_dict(), "pair": {"target": "tiny", "draft": "tiny"},
            "objective": objective, "architecture": net.architecture}
    return net, meta, schema


def random_inputs(schema: FeatureSchema, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: rng.normal(size=(n, *shape)).astype(np.float32) for k, shape in schema.input_shapes().items()}
    idx = schema.scalars.index("context_length") if "context_length" in schema.scalars else None
    if idx is not None:
        out["scalars"][:, idx] = rng.integers(20, 900, n)
    return out


def build_collected(out: Path, prompts: int = 8, length: int = 72, stride: int = 6, seed: int = 0) -> Path:
    """Collect a tiny dataset into ``out`` (prompt i gets split SPLITS[i % 8] and source "src<i % 2>")."""
    from data_collection.dataset import FORMAT_VERSION, ShardWriter, merge_manifests
    from data_collection.dataset_schema import rows_table, trajectory_key
    from data_collection.root_collector import RootCollector, UnionTrees
    from decoding.features import FeatureSchema
    from decoding.files import write_json_atomic
    from decoding.sampling import Sampling

    target, draft = untied_pair(seed=3, noise=0.4)
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS, UnionTrees(2, seed))
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
    writer.write(0, rows_table(trajs, rows_list, METHODS, len(SPACE)))
    writer.manifest["complete"] = True
    write_json_atomic(writer.path, writer.manifest)
    merge_manifests(out)
    return out
