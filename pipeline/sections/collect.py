"""Section `collect` of params.yaml: `CollectConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CollectConfig:
    """Stage collect: features and labels at roots of the train/val/test trajectories (data_collection/)."""

    splits: list[str] = field(default_factory=lambda: ["train", "val", "test"])  # never the draft's prompts
    methods: list[str] = field(default_factory=lambda: ["traversal", "specinfer", "spectr", "khisti",
                                                        "naive_tree", "nss", "gbv"])
    num_trees: int = 4  # s: union trees per root; the label is their mean (ALGORITHMS.md section 4)
    # a root every root_stride continuation tokens; 24 (was 20, and 16 before) for a first dvc repro within 60 minutes
    # in a slow phase of the 2-core machine (1.1 s per root; ~1,040 roots); the learning curve: offline 1.106x
    # autoregressive at half the roots, 1.124x at all (docs/selector.md)
    root_stride: int = 24
    max_roots_per_trajectory: int = 0  # 0 = no cap
    shard_size: int = 8  # trajectories per Parquet shard (the unit of resumption)
    seed: int = 0
    out: str = "data/collect"  # shards + manifests (a DVC out)
    metrics: str = "metrics/collect.json"

    def validate(self) -> None:
        from decoding.method_names import check_method_name

        for m in self.methods:
            check_method_name(m)
        if not self.methods:
            raise ValueError("methods must name at least one verification method")
        bad = [s for s in self.splits if s not in ("train", "val", "test")]
        if bad or not self.splits:
            raise ValueError(f"splits must be a non-empty subset of train, val, test (the draft's prompts are "
                             f"never roots), not {self.splits}")
        for name in ("num_trees", "root_stride", "shard_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.max_roots_per_trajectory < 0:
            raise ValueError(f"max_roots_per_trajectory must be >= 0, not {self.max_roots_per_trajectory}")
