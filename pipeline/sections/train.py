"""Section `train` of params.yaml: `TrainConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainConfig:
    """Stage train: the selector of ALGORITHMS.md section 6 on the collected dataset (models/selector_*.py)."""

    method: str = "specinfer"  # a method of collect.methods, or auto: Ê for every (method, action), both chosen
    auto_methods: list[str] = field(default_factory=list)  # the methods of auto ([] = all of collect.methods)
    # paper | target_only (decoding.features.FEATURE_SETS). target_only (with the root token's embedding): best
    # offline on VAL and TEST roots of the CPU default and the cheapest online (no draft work); docs/selector.md
    feature_set: str = "target_only"
    objective: str = "regression"  # regression (MSE on Ê) | throughput (the paper's policy loss)
    # network (selector/network.py)
    proj: int = 128  # projection width of each hidden-state feature
    widths: list[int] = field(default_factory=lambda: [512, 32])  # MLP widths
    dropout: float = 0.1
    # optimisation (AdamW, cosine decay over the epochs)
    epochs: int = 30
    batch_size: int = 256  # roots per optimizer step, over all devices (DDP: each process takes its share)
    lr: float = 1.0e-3
    weight_decay: float = 1.0e-4
    label_weighting: str = "none"  # none | inverse_se (regression; see selector/training.py)
    throughput_lambda: float = 1.0  # weight of the worst-alpha hinge term
    throughput_alpha: float = 0.1  # fraction of worst roots in the hinge term
    charge_inference: bool = True  # add the measured selector forward time to every step the selector decides
    baselines: list[str] = field(default_factory=lambda: ["best_static", "ridge", "hgb"])  # sklearn, [] = none
    seed: int = 0
    threads: int = 1  # torch CPU threads
    accelerator: str = "cpu"  # cpu | gpu | auto (Lightning)
    devices: int | str = 1  # Lightning devices (e.g. 4 or "auto" on a multi-GPU node; 2 CPU processes: 2 + ddp)
    strategy: str = "auto"  # Lightning strategy (ddp on a multi-GPU node; on CPU ddp runs over gloo)
    out: str = "artifacts/selector_torch"  # selector.safetensors + selector.json, checkpoints/, plots/ (export reads it)
    metrics: str = "metrics/train.json"

    def validate(self) -> None:
        from decoding.features import FEATURE_SETS
        from decoding.method_names import check_method_name

        if self.method != "auto":
            check_method_name(self.method)
        for m in self.auto_methods:
            check_method_name(m)
        if self.feature_set not in FEATURE_SETS:
            raise ValueError(f"feature_set must be one of {', '.join(FEATURE_SETS)}, not {self.feature_set!r}")
        if self.objective not in ("regression", "throughput"):
            raise ValueError(f"objective must be regression or throughput, not {self.objective!r}")
        if self.label_weighting not in ("none", "inverse_se"):
            raise ValueError(f"label_weighting must be none or inverse_se, not {self.label_weighting!r}")
        bad = [b for b in self.baselines if b not in ("best_static", "ridge", "hgb")]
        if bad:
            raise ValueError(f"unknown baselines {bad}; known: best_static, ridge, hgb")
        for name in ("epochs", "batch_size", "proj", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        if not 0 < self.throughput_alpha <= 1:
            raise ValueError(f"throughput_alpha must be in (0, 1], not {self.throughput_alpha}")
