"""Section `chain_selector` of params.yaml: `ChainSelectorConfig`."""

from __future__ import annotations

from dataclasses import dataclass

# the methods that verify a chain as naive (the registry's chain_equivalent_methods(), declared without the verifiers)
from decoding.method_names import CHAIN_EQUIVALENT


@dataclass
class ChainSelectorConfig:
    """Stage chain_selector: a selector of the draft length of one chain, for runtimes that verify one chain."""

    # the collected labels it learns, restricted to the grid's chains (K = 1): an OT method, i.e. naive on chains
    method: str = "specinfer"
    train_out: str = "artifacts/selector_chain_torch"  # the trained network (train.* hyperparameters, target_only)
    out: str = "artifacts/selector_chain"  # selector.onnx + selector.json ("kind": "chain"); integrations/ read it
    metrics: str = "metrics/train_chain.json"
    registered_model: str = "branchpoint-chain-selector"  # MLflow registered model ('' = log, do not register)

    def validate(self) -> None:
        if self.method not in CHAIN_EQUIVALENT:
            raise ValueError(f"method must be one of {', '.join(CHAIN_EQUIVALENT)} (verified as naive on a chain), "
                             f"not {self.method!r}")
        for name in ("train_out", "out", "metrics"):
            if not getattr(self, name):
                raise ValueError(f"{name} must name a path")
