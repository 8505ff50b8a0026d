"""Section `evaluate` of params.yaml: `EvaluateConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


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
