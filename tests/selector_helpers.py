"""Shared pieces for selector tests: a linear toy latency profile and a random selector with its meta."""

from __future__ import annotations

import numpy as np
import torch

from decoding.actions import ActionSpace
from decoding.features import FeatureSchema
from decoding.latency import LatencyModel
from models.selector import SelectorNet

SPACE = ActionSpace(range(1, 3), range(0, 3), range(0, 3))


def toy_latency() -> LatencyModel:
    """t_q(c, r) = 2 r + c / 100 ms, t_p(c, n) = 10 + 2 n + c / 10 ms on a grid covering SPACE's trees."""
    contexts = np.array([16.0, 256.0, 1024.0])
    rows = np.array([1, 2, 3, 4])
    tokens = np.arange(1, 17)
    return LatencyModel(contexts, rows, 1e-3 * (2 * rows[None, :] + contexts[:, None] / 100), tokens,
                        1e-3 * (10 + 2 * tokens[None, :] + contexts[:, None] / 10), 0.5e-3, {"machine": "toy"})


def random_selector(feature_set: str = "paper", methods=("traversal",), seed: int = 0, hidden=(12, 8)):
    """A randomly initialised SelectorNet and the meta `models.selector.save_selector` expects."""
    torch.manual_seed(seed)
    schema = FeatureSchema.for_pair(feature_set, *hidden)
    shapes = schema.input_shapes()
    actions = [str(a) for a in SPACE]
    outputs = len(methods) * len(actions)
    net = SelectorNet({h: shapes[h][0] for h in schema.hidden}, len(schema.scalars), outputs, proj=16,
                      widths=(32, 16), dropout=0.0).eval()
    valid = [not (m == "bv" and a.K > 1 and a.L2 > 0) for m in methods for a in SPACE]
    meta = {"feature_set": feature_set, "schema": schema.to_dict(),
            "outputs": {"methods": list(methods), "actions": actions, "auto": len(methods) > 1, "valid": valid},
            "latency": toy_latency().to_dict(), "pair": {"target": "tiny", "draft": "tiny"}}
    return net, meta, schema


def random_inputs(schema: FeatureSchema, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: rng.normal(size=(n, *shape)).astype(np.float32) for k, shape in schema.input_shapes().items()}
    idx = schema.scalars.index("context_length") if "context_length" in schema.scalars else None
    if idx is not None:
        out["scalars"][:, idx] = rng.integers(20, 900, n)
    return out
