"""The selector's training inputs from the collected dataset: shared by stage train and the studies.

`training_data` loads the collected roots, their labels and step costs (`decoding.pricing`) as
`selector.data.SelectorData` for ``train.method`` / ``train.feature_set``; `layout_for` is the output layout
of ``train.method``; `inference_seconds` times the selector's own forward (charged to every step it decides);
`hparams` hands ``train.*``'s optimisation knobs to the training loop (`pipeline.sections.TrainConfig` is their one home).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TrainingData:
    """What `training_data` loads: the dataset manifest, the output layout, the feature schema, the latency profile,
    the roots as `selector.data.SelectorData` and the selector's charged forward time (seconds)."""

    manifest: dict
    layout: Any  # selector.network.OutputLayout
    schema: Any  # decoding.features.FeatureSchema
    latency: Any  # decoding.latency.LatencyModel
    data: Any  # selector.data.SelectorData
    inference_seconds: float

    def new_net(self, tc):
        """An untrained `selector.network.SelectorNet` of ``train.*``'s architecture for this layout."""
        return new_net(self.schema, self.layout, tc)


def new_net(schema, layout, tc):
    """An untrained `SelectorNet`, its initial weights drawn under ``train.seed`` (an unseeded draw made two runs of
    stage train on the same data end with different selectors)."""
    import torch

    from selector.network import NetShape, SelectorNet

    torch.manual_seed(tc.seed)
    return SelectorNet(schema.hidden_sizes, len(schema.scalars), layout.size,
                       NetShape(tc.proj, tuple(tc.widths), tc.dropout), *layout.constraints())


def layout_for(tc, manifest: dict):
    from decoding.actions import parse_action
    from pipeline.config import ConfigError
    from selector.network import OutputLayout

    collected = list(manifest["methods"])
    methods = (tc.auto_methods or collected) if tc.method == "auto" else [tc.method]
    missing = [m for m in methods if m not in collected]
    if missing:
        raise ConfigError(f"train.method / train.auto_methods name {missing}, but the dataset has labels only for "
                         f"{collected}; add them to collect.methods and re-collect, or choose among those")
    return OutputLayout(tuple(methods), tuple(parse_action(a) for a in manifest["actions"]), tc.method == "auto")


def inference_seconds(net, reps: int = 200) -> float:
    """Seconds of one forward of ``net`` on one root (batch 1, CPU, inference mode, one thread, as the exported
    runtime runs it), load-proof (`decoding.latency.quiet_seconds`)."""
    import torch

    from decoding.latency import quiet_seconds

    xs = [torch.zeros(1, getattr(net, f"{n}_mean").shape[0]) for n in net.input_names]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            return quiet_seconds(lambda: net(*xs), reps)
    finally:
        torch.set_num_threads(threads)


def training_data(cfg, chain: bool = False) -> TrainingData:
    """The `TrainingData` of the collected dataset; with
    ``chain``, of a chain selector: ``train.method``'s labels of the grid's chains, one output per draft length
    (`selector.data.chain_labels`)."""
    import numpy as np

    from data_collection.dataset import label_matrix, load_collected, read_dataset_manifest
    from data_collection.dataset_schema import label_se_column
    from decoding.features import FeatureSchema
    from decoding.latency import LatencyModel
    from selector.data import Labels, build_selector_data

    tc = cfg.train
    manifest = read_dataset_manifest(cfg.collect.out)
    layout = layout_for(tc, manifest)
    hidden = manifest["pair"]["hidden_sizes"]
    schema = FeatureSchema.for_pair(tc.feature_set, hidden["target"], hidden["draft"])
    latency = LatencyModel.load(cfg.profile.out)
    ds = load_collected(cfg.collect.out)
    cols = ds.with_format("numpy")[:]
    collected = list(manifest["methods"])
    labels = Labels({m: label_matrix(ds, m) for m in collected},
                    {m: np.asarray(cols[label_se_column(m)], dtype=np.float32) for m in collected})
    if chain:
        layout, labels = chain_layout(layout, labels)
    # the selector's own forward time (its architecture's, measured untrained) counts in every step it decides
    infer = inference_seconds(new_net(schema, layout, tc)) if tc.charge_inference else 0.0
    data = build_selector_data(cols, labels, schema, layout, latency, infer)
    return TrainingData(manifest, layout, schema, latency, data, infer)


def chain_layout(layout, labels):
    """``(layout, labels)`` of a chain selector: ``layout``'s one method, its chains' `Labels` only."""
    from pipeline.config import ConfigError
    from selector.data import Labels, chain_labels
    from selector.network import OutputLayout

    if layout.auto:
        raise ConfigError("a chain selector learns one method's labels; set train.method to one method, not auto")
    method = layout.methods[0]
    chains, e, se = chain_labels(labels.estimate[method], labels.se[method], layout.actions)
    return OutputLayout((method,), chains), Labels({method: e}, {method: se})


def hparams(tc):
    """``train.*``'s optimisation knobs as `selector.training.SelectorHParams` (which has no defaults of its
    own for them)."""
    from selector.training import SelectorHParams

    return SelectorHParams(objective=tc.objective, lr=tc.lr, weight_decay=tc.weight_decay, epochs=tc.epochs,
                           label_weighting=tc.label_weighting, throughput_lambda=tc.throughput_lambda,
                           throughput_alpha=tc.throughput_alpha, seed=tc.seed)
