"""The sections of params.yaml, one dataclass per stage: their fields, defaults and validation.

The one place defaults live (params.yaml is generated from these: `python -m pipeline.params_file`).
`pipeline/config.py` registers each section as a field of `Config` and parses files into them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    # Target LM spec: embedded:<name> | hf:<folder or cached hub id> | gguf:<file.gguf>
    target: str = "embedded:smollm2-135m-instruct"
    # Draft LM spec: as for target, or self_draft:<artifact folder> (target's first layers + adapter)
    draft: str = "self_draft:artifacts/draft"
    device: str = "auto"  # auto = CUDA when present (under torchrun: cuda:$LOCAL_RANK), else CPU
    # null = the whole target on `device`; auto (balanced, sequential, ...) = accelerate spreads a target
    # too large for one GPU over every visible GPU, then CPU memory
    device_map: str | None = None
    dtype: str = "float32"  # float32 | bfloat16 | float16
    cache_dir: str = ".cache/branchpoint"  # dequantized GGUF models and other caches (git-ignored)
    threads: int = 2  # torch CPU threads of every stage that runs the models (decode, profile, collect, evaluate)

    def validate(self) -> None:
        from models.loading import check_device_map, resolve_dtype

        resolve_dtype(self.dtype)
        check_device_map(self.device_map)
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, not {self.threads}")


@dataclass
class PromptsConfig:
    # Prompt sets: built-in names (default, humaneval, writing, math, translation), local files or
    # HF datasets given as {path|hf, text_column, ...} mappings; see data_collection/prompts.py.
    sets: list[Any] = field(default_factory=lambda: ["default"])
    max_prompts: int | None = None  # cap per source (None = all)
    # by prompt: [draft, train, val, test]; the draft trains on `draft` only, the selector's roots come
    # from train/val/test (data_collection/prompts.py split_prompts)
    split: list[float] = field(default_factory=lambda: [0.6, 0.2, 0.1, 0.1])
    seed: int = 0  # seed of the by-prompt split
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one

    def validate(self) -> None:
        if not self.sets:
            raise ValueError("sets must name at least one prompt set")
        if len(self.split) != 4:
            raise ValueError(
                f"split now has four parts [draft, train, val, test] (the draft trains on its own prompts), "
                f"got {len(self.split)} values {self.split}; e.g. split: [0.6, 0.2, 0.1, 0.1]"
            )
        if any(f < 0 for f in self.split) or abs(sum(self.split) - 1) > 1e-6:
            raise ValueError(f"split must be four non-negative fractions summing to 1, not {self.split}")


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]

    def validate(self) -> None:
        from decoding.sampling import Sampling

        Sampling(self.temperature, self.top_p)


@dataclass
class DecodeConfig:
    method: str = "traversal"  # verification method (decoding.verifiers.METHODS), or "autoregressive"
    action: str = "2,2,3"  # static tree shape K,L1,L2 (decoding.actions.parse_action)
    max_new_tokens: int = 64
    seed: int = 0
    prompt: str = "Write a Python function that checks whether a number is prime."
    chat_template: bool = True  # wrap the prompt in the tokenizer's chat template when it has one

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, not {self.max_new_tokens}")
        from decoding.actions import parse_action

        parse_action(self.action)


@dataclass
class TrajectoriesConfig:
    """Target-sampled continuations of every prompt (stage trajectories), sampled once, read by later stages."""

    out: str = "data/trajectories"  # folder: trajectories.parquet + manifest.json
    max_new_tokens: int = 96  # continuation length cap (a continuation also ends at EOS)
    # the sampling grid (temperature, then top-p; temperature 0 = greedy) of the train/val/test prompts;
    # draft prompts are always sampled at T = 1, top-p 1 (what distillation needs)
    temperatures: list[float] = field(default_factory=lambda: [1.0, 0.6])
    top_ps: list[float] = field(default_factory=lambda: [1.0])
    # True: every train/val/test prompt at every grid setting (twice the roots of one setting per prompt: with
    # the prepacked engine it fits the 2-core budget); False: ONE setting per prompt, picked by a seeded hash
    all_settings: bool = True
    samples_per_prompt: int = 1  # trajectories per (prompt, setting), each with its own seed
    max_prompt_tokens: int = 512  # longer prompts keep their last tokens
    batch_size: int = 32  # rows sampled together (one setting, similar prompt lengths)
    seed: int = 0
    threads: int = 2  # torch CPU threads

    def validate(self) -> None:
        from decoding.sampling import Sampling

        if self.max_new_tokens < 1 or self.samples_per_prompt < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens, samples_per_prompt and batch_size must be >= 1")
        if not self.temperatures or not self.top_ps:
            raise ValueError("temperatures and top_ps must each hold at least one value")
        for t in self.temperatures:
            for p in self.top_ps:
                Sampling(t, p)  # the one place sampling settings are checked


@dataclass
class TrainDraftConfig:
    """Self-speculative draft training (stage train_draft): the one place its defaults live.

    models/self_draft.py SelfDraftConfig and models/draft_training.py DistillHParams have no defaults;
    pipeline/train_draft.py builds them from these fields (same names).
    """

    layers: int = 6  # target layers the draft reuses (k)
    adapter_width: int = 2048  # hidden width of the residual MLP adapter on layer k's hidden state
    vocab_subset_size: int = 16384  # FR-Spec draft vocabulary (0 = whole vocabulary); q = 0 outside it
    # distillation data: teacher forcing the DRAFT split's trajectories (stage trajectories)
    top_k: int = 64  # target probabilities kept per position (never full-vocabulary rows)
    forward_batch_size: int = 8  # sequences per teacher-forced forward
    # optimisation (Lightning, AdamW, linear warmup then cosine decay)
    steps: int = 1000
    batch_size: int = 256  # positions per step
    lr: float = 2.0e-3
    weight_decay: float = 0.0
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05  # the cosine decays to min_lr_ratio * lr
    tv_weight: float = 3.0  # loss = KL(p||q) + tv_weight * (1 - sum min(p, q)), over the top-k
    negatives: int = 1024  # sampled-softmax negatives per step (0 = exact softmax over the subset)
    val_every: int = 500  # steps between validations on the VAL split's trajectories
    # evaluation on the TEST split's trajectories (at their own sampling settings): acceptance of q vs p
    timing_context: int = 256  # context length of the step-time measurement
    timing_reps: int = 30
    seed: int = 0
    threads: int = 1  # torch CPU threads (1 is faster than 2 when the cores are shared)
    out: str = "artifacts/draft"  # the artifact folder (adapter.safetensors + config.json)
    metrics: str = "metrics/draft.json"
    tracking_uri: str = "sqlite:///mlflow.db"  # MLflow store (git-ignored)
    experiment: str = "train_draft"


@dataclass
class ActionsConfig:
    """The action grid (`decoding.actions.ActionSpace`) that every stage uses: inclusive [min, max] ranges.

    The CPU default (48 actions) keeps one root's union tree at 39 nodes; the paper's grid (K 1-4, L1 0-8,
    L2 0-8, 324 actions) is the preset configs/paper-grid.yaml."""

    K: list[int] = field(default_factory=lambda: [1, 3])  # rollouts at the branch node
    L1: list[int] = field(default_factory=lambda: [0, 3])  # trunk length
    L2: list[int] = field(default_factory=lambda: [0, 3])  # rollout length

    def space(self):
        from decoding.actions import ActionSpace

        return ActionSpace.from_config({"K": self.K, "L1": self.L1, "L2": self.L2})

    def validate(self) -> None:
        for name in ("K", "L1", "L2"):
            v = getattr(self, name)
            if len(v) != 2 or v[0] > v[1]:
                raise ValueError(f"{name} must be [min, max] with min <= max, not {v}")
        self.space()


@dataclass
class CollectConfig:
    """Stage collect: features and labels at roots of the train/val/test trajectories (data_collection/)."""

    splits: list[str] = field(default_factory=lambda: ["train", "val", "test"])  # never the draft's prompts
    methods: list[str] = field(default_factory=lambda: ["traversal", "specinfer", "spectr", "khisti",
                                                        "naive_tree", "nss", "gbv"])
    num_trees: int = 4  # s: union trees per root; the label is their mean (ALGORITHMS.md section 4)
    root_stride: int = 16  # a root every root_stride continuation tokens
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


@dataclass
class ProfileConfig:
    """Latency profile (stage profile): the grid the latency model T(c, a) interpolates (decoding/latency.py)."""

    contexts: list[int] = field(default_factory=lambda: [64, 256, 512, 1024])  # context lengths, ascending
    draft_rows: list[int] = field(default_factory=lambda: [1, 2, 3, 4])  # draft query rows: 1..max K
    # target tree-pass tokens (root included): every single tree of the CPU action grid (up to 13 tokens)
    # and the union trees of the labels (up to 40)
    target_tokens: list[int] = field(default_factory=lambda: [*range(1, 17), 20, 24, 32, 40])
    repeats: int = 5  # timed rounds per grid cell (the profile holds their median)
    warmup: int = 1  # untimed rounds first
    feature_repeats: int = 50  # timed runs of the feature computation
    out: str = "artifacts/latency.json"

    def validate(self) -> None:
        for name, first in (("contexts", None), ("draft_rows", 1), ("target_tokens", 1)):
            values = getattr(self, name)
            if not values or any(b <= a for a, b in zip(values, values[1:], strict=False)) or min(values) < 1:
                raise ValueError(f"{name} must be a non-empty strictly ascending list of ints >= 1, not {values}")
            if first is not None and values[0] != first:
                raise ValueError(f"{name} must start at {first} (the latency model needs it), not {values}")
        if self.repeats < 1 or self.warmup < 0 or self.feature_repeats < 1:
            raise ValueError(f"repeats and feature_repeats must be >= 1 and warmup >= 0, not "
                             f"{self.repeats}, {self.feature_repeats}, {self.warmup}")


@dataclass
class TrainConfig:
    """Stage train: the selector of ALGORITHMS.md section 6 on the collected dataset (models/selector_*.py)."""

    method: str = "specinfer"  # a method of collect.methods, or auto: Ê for every (method, action), both chosen
    auto_methods: list[str] = field(default_factory=list)  # the methods of auto ([] = all of collect.methods)
    # paper | target_only (decoding.features.FEATURE_SETS) | cascade (stage 1 target_only, stage 2 paper: one
    # selector each, pipeline/train.py CASCADE_STAGES). cascade: best of the three offline on VAL and TEST roots
    # of the CPU default (0.979 / 0.978x autoregressive vs target_only 0.967x, paper 0.943x on TEST)
    feature_set: str = "cascade"
    objective: str = "regression"  # regression (MSE on Ê) | throughput (the paper's policy loss)
    # network (models/selector_network.py)
    proj: int = 128  # projection width of each hidden-state feature
    widths: list[int] = field(default_factory=lambda: [512, 32])  # MLP widths
    dropout: float = 0.1
    # optimisation (AdamW, cosine decay over the epochs)
    epochs: int = 30
    batch_size: int = 256
    lr: float = 1.0e-3
    weight_decay: float = 1.0e-4
    label_weighting: str = "none"  # none | inverse_se (regression; see models/selector_training.py)
    throughput_lambda: float = 1.0  # weight of the worst-alpha hinge term
    throughput_alpha: float = 0.1  # fraction of worst roots in the hinge term
    charge_inference: bool = True  # add the measured selector forward time to every step the selector decides
    baselines: list[str] = field(default_factory=lambda: ["best_static", "ridge", "hgb"])  # sklearn, [] = none
    seed: int = 0
    threads: int = 1  # torch CPU threads
    accelerator: str = "cpu"  # cpu | gpu | auto (Lightning)
    devices: int | str = 1  # Lightning devices (e.g. 4 or "auto" on a multi-GPU node)
    strategy: str = "auto"  # Lightning strategy (ddp on a multi-GPU node)
    out: str = "artifacts/selector_torch"  # selector.safetensors + selector.json, checkpoints/, plots/ (export reads it)
    metrics: str = "metrics/train.json"

    def validate(self) -> None:
        from decoding.features import FEATURE_SETS
        from decoding.method_names import check_method_name

        if self.method != "auto":
            check_method_name(self.method)
        for m in self.auto_methods:
            check_method_name(m)
        if self.feature_set not in (*FEATURE_SETS, "cascade"):
            raise ValueError(f"feature_set must be one of {', '.join(FEATURE_SETS)} or cascade, not "
                             f"{self.feature_set!r}")
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


@dataclass
class TrackingConfig:
    """MLflow for every stage (pipeline/tracking.py); MLFLOW_TRACKING_URI, when set, wins over ``uri``."""

    uri: str = "sqlite:///mlflow.db"  # git-ignored local store
    experiment: str = "branchpoint"  # one experiment; runs are tagged with their stage and git revision


@dataclass
class ExportConfig:
    """Stage export: the trained selector (train.out) as ONNX + sidecar (export/)."""

    out: str = "artifacts/selector"  # selector.onnx + selector.json; `decode --selector` reads it
    parity_rows: int = 256  # held-out roots the ONNX graph must reproduce
    atol: float = 1.0e-4  # max |torch - onnxruntime| of the predicted block efficiency
    mlflow: bool = True  # log the ONNX model and register it
    registered_model: str = "branchpoint-selector"

    def validate(self) -> None:
        if self.parity_rows < 1:
            raise ValueError(f"parity_rows must be >= 1, not {self.parity_rows}")
        if not self.atol > 0:
            raise ValueError(f"atol must be > 0, not {self.atol}")


@dataclass
class EvaluateConfig:
    """Stage evaluate: TEST prompts decoded end to end with every policy, the report and the findings
    (pipeline/evaluate.py, evaluation/online.py, evaluation/claims.py)."""

    prompts: int = 24  # TEST trajectories whose prompts are decoded, each at its own sampling setting (0 = all)
    seeds: list[int] = field(default_factory=lambda: [0])  # decoding seeds per prompt (units = prompts x seeds)
    max_new_tokens: int = 32
    # methods decoded with their best static action (chosen on TRAIN roots); [] = collect.methods. traversal is
    # always included (the reference)
    methods: list[str] = field(default_factory=lambda: ["traversal", "specinfer", "gbv"])
    chain: bool = True  # chain speculative decoding (naive on K = 1) with its best static length
    adaptive_chain: bool = True  # the acceptance-tracking chain length (decoding.policy.AdaptiveChain), naive
    # the confidence-threshold chain of HF assisted generation (decoding.threshold_chain), naive, with N (tune_lengths)
    # and the threshold (tune_thresholds) of the highest tokens/s on tune_prompts TRAIN prompts (tune_max_new_tokens)
    threshold_chain: bool = True
    tune_prompts: int = 4
    tune_max_new_tokens: int = 16
    tune_lengths: list[int] = field(default_factory=lambda: [4, 8, 20])
    tune_thresholds: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.6])
    selector: bool = True  # the exported selector (export.out): auto and restricted to each selector_methods
    selector_methods: list[str] = field(default_factory=lambda: ["traversal", "specinfer"])  # [] = all of its methods
    warmup: bool = True  # one short untimed decode per policy first
    bootstrap: int = 2000  # bootstrap resamples (over prompts) of each confidence interval
    ci: float = 0.95
    seed: int = 0  # of the prompt subset and the bootstrap
    train_metrics: str = "metrics/train.json"  # the offline TEST table of the trained selector, shown when present
    metrics: str = "metrics/evaluate.json"
    plots: str = "plots/evaluate"  # plot data files for `dvc plots show`
    report: str = "reports/report.md"  # with its figures in reports/figures/

    def validate(self) -> None:
        from decoding.method_names import check_method_name

        for m in [*self.methods, *self.selector_methods]:
            check_method_name(m)
        if self.prompts < 0 or self.max_new_tokens < 1 or self.bootstrap < 1:
            raise ValueError(f"prompts must be >= 0, max_new_tokens and bootstrap >= 1, not {self.prompts}, "
                             f"{self.max_new_tokens}, {self.bootstrap}")
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        if not 0 < self.ci < 1:
            raise ValueError(f"ci must be in (0, 1), not {self.ci}")
        if self.threshold_chain and (self.tune_prompts < 1 or self.tune_max_new_tokens < 1 or not self.tune_lengths
                                     or not self.tune_thresholds):
            raise ValueError(f"threshold_chain needs tune_prompts and tune_max_new_tokens >= 1 and non-empty "
                             f"tune_lengths / tune_thresholds, not {self.tune_prompts}, {self.tune_max_new_tokens}, "
                             f"{self.tune_lengths}, {self.tune_thresholds}")
        if any(n < 1 for n in self.tune_lengths) or any(not 0 <= t <= 1 for t in self.tune_thresholds):
            raise ValueError(f"tune_lengths must be >= 1 and tune_thresholds in [0, 1], not {self.tune_lengths}, "
                             f"{self.tune_thresholds}")
