"""Section `lookup` of params.yaml: `LookupConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LookupConfig:
    """Stage lookup: exact labels of context lookup chains at roots of the trajectories, and the learned lookup
    gate fitted on the TRAIN roots (decoding/lookup_gate.py, data_collection/lookup_labels.py)."""

    splits: list[str] = field(default_factory=lambda: ["train", "val", "test"])  # never the draft's prompts
    # a root every root_stride continuation tokens (one short target pass per root); 6 (was 4, and 2 before: the gate's
    # TEST MAE 0.88 at 2, 0.87 at 4) for a first dvc repro within 60 minutes in a slow phase
    root_stride: int = 6
    max_length: int = 8  # N: the longest chain proposed; the gate predicts Ê(n) for n = 1..N
    prior: float = 20.0  # pseudo-roots shrinking a (run, entropy) cell towards its run bin's mean
    out: str = "data/lookup"  # labels.parquet (a DVC out)
    gate: str = "artifacts/lookup_gate.json"
    metrics: str = "metrics/lookup.json"

    def validate(self) -> None:
        bad = [s for s in self.splits if s not in ("train", "val", "test")]
        if bad or "train" not in self.splits:
            raise ValueError(f"splits must be a subset of train, val, test that holds train (the gate is fitted on "
                             f"it), not {self.splits}")
        if self.root_stride < 1 or self.max_length < 1:
            raise ValueError(f"root_stride and max_length must be >= 1, not {self.root_stride}, {self.max_length}")
        if not self.prior >= 0:
            raise ValueError(f"prior must be >= 0, not {self.prior}")
