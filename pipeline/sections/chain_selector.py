"""Section `chain_selector` of params.yaml: `ChainSelectorConfig`."""

from __future__ import annotations

from dataclasses import dataclass

# OT verifiers: on a chain (one child per node) each is standard speculative sampling, i.e. naive (ALGORITHMS.md 3.1);
# Traversal and GBV verify a chain as Block Verification and nss samples y ~ p, so their chain labels are not naive's
NAIVE_ON_CHAINS = ("specinfer", "naive_tree", "spectr", "khisti")


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
        if self.method not in NAIVE_ON_CHAINS:
            raise ValueError(f"method must be one of {', '.join(NAIVE_ON_CHAINS)} (verified as naive on a chain), "
                             f"not {self.method!r}")
        for name in ("train_out", "out", "metrics"):
            if not getattr(self, name):
                raise ValueError(f"{name} must name a path")
