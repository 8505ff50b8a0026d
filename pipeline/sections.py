"""The sections of params.yaml: one dataclass per section, the one place its fields, defaults and validation live.

params.yaml is generated from these dataclasses (``python -m pipeline.params_file --write``). A stage module names
the sections it reads in ``SECTIONS``; `pipeline.config.load_config` types and validates only those (and the ones a
``--set`` names), so a setting of a stage that does not run never fails the one that does. A section's ``validate``
rejects a bad value, or one with no effect (a ``ValueError``, which the loader reports as a `pipeline.config.ConfigError`
naming the file and the section).

    from pipeline.sections import CollectConfig
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from decoding.method_names import CHAIN_EQUIVALENT


@dataclass
class ModelConfig:
    # Target LM spec: embedded:<name> | hf:<folder or cached hub id> | gguf:<file.gguf>
    target: str = "embedded:smollm2-135m-instruct"
    # Draft LM spec: as for target, or a draft stage train_draft trains: eagle:<artifact folder> (a head on the
    # target's last hidden state and the sampled token, models/eagle_draft.py; docs/draft.md) or
    # self_draft:<artifact folder> (the target's first layers + an adapter, models/self_draft.py)
    draft: str = "eagle:artifacts/draft"
    device: str = "auto"  # auto = CUDA when present (under torchrun: cuda:$LOCAL_RANK), else CPU
    # null = the whole target on `device`; auto (balanced, sequential, ...) = accelerate spreads a target
    # too large for one GPU over every visible GPU, then CPU memory
    device_map: str | None = None
    dtype: str = "float32"  # float32 | bfloat16 | float16
    # how the target's linear layers compute: dense (float weights) | int4 (a GGUF file's own Q4_1 blocks, and its
    # Q8_0 head, through torch's 4-bit CPU kernel, bfloat16 activations) | auto (int4 for a GGUF target on CPU in
    # float32, else dense); docs/engine.md measures both
    backend: str = "auto"
    # int4 on CPU: the decoder stack as one torch.compile graph (inductor; a C++ compiler needed, else eager), ~0.78x
    # the time of an eager plain step; tracing costs a process ~30 s (inductor's cache warm) to ~90 s. Another
    # function than the eager stack bit for bit, so every stage runs the same setting (models/compiled_stack.py)
    compile: bool = True
    cache_dir: str = ".cache/branchpoint"  # dequantized GGUF models and other caches (git-ignored)
    threads: int = 2  # torch CPU threads of every stage that runs the models (decode, profile, collect, evaluate)

    def placement(self):
        from models.placement import Placement

        return Placement(self.device_map, self.backend, self.compile)

    def validate(self) -> None:
        from models.placement import check_dtype_name

        check_dtype_name(self.dtype)
        self.placement().check()
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
    method: str = "traversal"  # verification method (verifiers.METHODS), or "autoregressive"
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
    samples_per_prompt: int = 1  # trajectories per (prompt, setting) of the train/val/test prompts, each with its own seed
    # trajectories per DRAFT prompt (T = 1): the distillation data of train_draft. With 1 the adapter saw
    # ~15k positions and overfit them (acceptance 0.56 on its own prompts, 0.34 held out); 4 gave 0.40; 3 (~44k
    # positions, 0.39) to shorten a first dvc repro, of which the draft's sampling and teacher forcing are ~14 minutes
    draft_samples_per_prompt: int = 3
    max_prompt_tokens: int = 512  # longer prompts keep their last tokens
    batch_size: int = 32  # rows sampled together (one setting, similar prompt lengths)
    seed: int = 0
    threads: int = 2  # torch CPU threads

    def validate(self) -> None:
        from decoding.sampling import Sampling

        if min(self.max_new_tokens, self.samples_per_prompt, self.draft_samples_per_prompt, self.batch_size) < 1:
            raise ValueError("max_new_tokens, samples_per_prompt, draft_samples_per_prompt and batch_size must be >= 1")
        if not self.temperatures or not self.top_ps:
            raise ValueError("temperatures and top_ps must each hold at least one value")
        for t in self.temperatures:
            for p in self.top_ps:
                Sampling(t, p)  # the one place sampling settings are checked


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
class ProfileConfig:
    """Latency profile (stage profile): the grid the latency model T(c, a) interpolates (decoding/latency.py)."""

    contexts: list[int] = field(default_factory=lambda: [64, 256, 512, 1024])  # context lengths, ascending
    draft_rows: list[int] = field(default_factory=lambda: [1, 2, 3, 4])  # draft query rows: 1..max K
    # target tree-pass tokens (root included): every single tree of the CPU action grid (up to 13 tokens)
    # and the union trees of the labels (up to 40)
    target_tokens: list[int] = field(default_factory=lambda: [*range(1, 17), 20, 24, 32, 40])
    repeats: int = 5  # timed rounds per grid cell (the profile holds their mean)
    warmup: int = 2  # untimed rounds first (with 1 the first context's draft steps read 40% slow)
    feature_repeats: int = 200  # timed runs of deciding's features per feature set (quietest of 5 blocks)
    # whole decoded steps as ratios to plain steps of the same interleaved rounds (data_collection.step_prices; what
    # decoding/pricing.py prices with): rounds (0 = the tables alone price steps), tokens per decode, the context
    # lengths the rounds decode from (cycled), and the lookup chain lengths measured
    price_rounds: int = 4
    price_tokens: int = 16
    price_contexts: list[int] = field(default_factory=lambda: [128, 384])
    lookup_lengths: list[int] = field(default_factory=lambda: list(range(1, 9)))
    # timed verify calls per (method, shape of the action grid) on trees of the pair's own rows (the mean is kept:
    # data_collection.verify_cost); the step overhead is Traversal's, so this prices the other methods; 0 = none
    verify_repeats: int = 5
    out: str = "artifacts/latency.json"

    def validate(self) -> None:
        for name, first in (("contexts", None), ("draft_rows", 1), ("target_tokens", 1)):
            values = getattr(self, name)
            if not values or any(b <= a for a, b in zip(values, values[1:], strict=False)) or min(values) < 1:
                raise ValueError(f"{name} must be a non-empty strictly ascending list of ints >= 1, not {values}")
            if first is not None and values[0] != first:
                raise ValueError(f"{name} must start at {first} (the latency model needs it), not {values}")
        if self.price_rounds < 0 or self.verify_repeats < 0 or self.price_tokens < 1:
            raise ValueError(f"price_rounds and verify_repeats must be >= 0 and price_tokens >= 1, not "
                             f"{self.price_rounds}, {self.verify_repeats} and {self.price_tokens}")
        if not self.price_contexts or min(self.price_contexts) < 2 or any(n < 1 for n in self.lookup_lengths):
            raise ValueError(f"price_contexts must be context lengths >= 2 and lookup_lengths >= 1, not "
                             f"{self.price_contexts} and {self.lookup_lengths}")
        if self.lookup_lengths and max(self.lookup_lengths) + 1 > self.target_tokens[-1]:
            raise ValueError(f"a lookup chain of {max(self.lookup_lengths)} tokens is a target pass of "
                             f"{max(self.lookup_lengths) + 1}: extend target_tokens (up to {self.target_tokens[-1]})")
        if self.repeats < 1 or self.warmup < 0 or self.feature_repeats < 1:
            raise ValueError(f"repeats and feature_repeats must be >= 1 and warmup >= 0, not "
                             f"{self.repeats}, {self.feature_repeats}, {self.warmup}")


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


# the methods that verify a chain as naive (the registry's chain_equivalent_methods(), declared without the verifiers)


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


@dataclass
class EvaluateConfig:
    """Stage evaluate: TEST prompts decoded end to end with every policy, the report and the findings
    (pipeline/evaluate.py, evaluation/online.py, evaluation/claims.py)."""

    # TEST trajectories whose prompts are decoded, each at its own sampling setting (0 = all). All 42 (was 20): issue #43
    # asks for intervals that decide 5% questions; at 20 prompts the selector / best static interval was +-3.4%, at 42
    # about +-2.3%. The threshold chain, off below, pays for most of the extra decodes
    prompts: int = 0
    seeds: list[int] = field(default_factory=lambda: [0])  # decoding seeds per prompt (units = prompts x seeds)
    # tokens decoded per prompt: long enough that the target prefill, which every policy pays alike, and the draft's
    # own prefill weigh in a run about as in real generations (at 32 they were ~15%); 72 (was 96, the trajectories'
    # length) for a first dvc repro within 60 minutes in a slow phase of this machine (docs/selector.md)
    max_new_tokens: int = 72
    # methods decoded with their best static action (chosen on TRAIN roots); [] = collect.methods. traversal is
    # always included (the reference), and so is the best static of every collected method (``best_static``)
    methods: list[str] = field(default_factory=lambda: ["traversal"])
    # chain speculative decoding (naive on K = 1) with its best static length. Off by default: the best static action
    # (over the whole grid, chains included) is the static peer, and the chain read below it in every run (stop 30:
    # 1.02x vs 1.08x autoregressive); each policy costs ~2 minutes of a first dvc repro on 2 cores
    chain: bool = False
    adaptive_chain: bool = True  # the acceptance-tracking chain length (policies.adaptive_chain.AdaptiveChain), naive
    # the confidence-threshold chain of HF assisted generation (policies.threshold_chain), naive, with N (tune_lengths)
    # and the threshold (tune_thresholds) of the highest tokens/s on tune_prompts TRAIN prompts (tune_max_new_tokens)
    # Off by default (was on): it read 1.00-1.02x autoregressive in stops 39-40, below the adaptive chain, and each
    # policy costs ~4 minutes of evaluate at 42 prompts
    threshold_chain: bool = False
    tune_prompts: int = 4
    tune_max_new_tokens: int = 16
    tune_lengths: list[int] = field(default_factory=lambda: [4, 8, 20])
    tune_thresholds: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.6])
    # prompt lookup decoding (policies.lookup: a chain copied from the context after a matching suffix, no draft
    # model; HF's prompt_lookup_num_tokens) as a peer, with its chain length (lookup_lengths) and shortest matched
    # suffix (lookup_min_ngrams) of the highest tokens/s on tune_prompts TRAIN prompts (lookup_tune_max_new_tokens:
    # a lookup needs text to repeat); and the selector decoded with the same lookup first ("<selector>:lookup")
    lookup: bool = True
    # (a first A/B on 12 TEST prompts, 1 thread: N = 3 beat 6 and 10, a one-token suffix beat 2 and 3: docs/selector.md)
    lookup_lengths: list[int] = field(default_factory=lambda: [2, 3, 4, 6])
    lookup_min_ngrams: list[int] = field(default_factory=lambda: [1])  # 1: the tuning's pick and the A/B's
    lookup_tune_max_new_tokens: int = 48
    selector: bool = True  # decode the exported selector (export.out)
    # an auto selector is also decoded restricted to each of these methods ([]: each of its own); a selector of one
    # method rejects any (it would have no effect)
    selector_methods: list[str] = field(default_factory=list)
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
        if self.lookup and (self.tune_prompts < 1 or self.lookup_tune_max_new_tokens < 1 or not self.lookup_lengths
                            or not self.lookup_min_ngrams or any(n < 1 for n in self.lookup_lengths)
                            or any(not 1 <= g <= 4 for g in self.lookup_min_ngrams)):
            raise ValueError(f"lookup needs tune_prompts and lookup_tune_max_new_tokens >= 1, lookup_lengths >= 1 and "
                             f"lookup_min_ngrams in [1, 4], not {self.tune_prompts}, {self.lookup_tune_max_new_tokens}, "
                             f"{self.lookup_lengths}, {self.lookup_min_ngrams}")
        if any(n < 1 for n in self.tune_lengths) or any(not 0 <= t <= 1 for t in self.tune_thresholds):
            raise ValueError(f"tune_lengths must be >= 1 and tune_thresholds in [0, 1], not {self.tune_lengths}, "
                             f"{self.tune_thresholds}")


# section name -> its dataclass, in params.yaml order
SECTION_CLASSES: dict[str, type] = {
    "model": ModelConfig,
    "prompts": PromptsConfig,
    "sampling": SamplingConfig,
    "decode": DecodeConfig,
    "trajectories": TrajectoriesConfig,
    "train_draft": TrainDraftConfig,
    "actions": ActionsConfig,
    "collect": CollectConfig,
    "tracking": TrackingConfig,
    "export": ExportConfig,
    "profile": ProfileConfig,
    "train": TrainConfig,
    "chain_selector": ChainSelectorConfig,
    "evaluate": EvaluateConfig,
}


def section_class(name: str) -> type:
    """The dataclass of section ``name``."""
    return SECTION_CLASSES[name]
