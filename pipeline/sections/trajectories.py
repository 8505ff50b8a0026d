"""Section `trajectories` of params.yaml: `TrajectoriesConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


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
