"""Section `model` of params.yaml: `ModelConfig`."""

from __future__ import annotations

from dataclasses import dataclass


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
    # how the target's linear layers compute: dense (float weights) | int4 (a GGUF file's own Q4_1 blocks through
    # torch's 4-bit CPU kernel, bfloat16 activations and head) | auto (int4 for a GGUF target on CPU in float32, else
    # dense); docs/engine.md measures both
    backend: str = "auto"
    cache_dir: str = ".cache/branchpoint"  # dequantized GGUF models and other caches (git-ignored)
    threads: int = 2  # torch CPU threads of every stage that runs the models (decode, profile, collect, evaluate)

    def placement(self):
        from models.placement import Placement

        return Placement(self.device_map, self.backend)

    def validate(self) -> None:
        from models.placement import check_dtype_name

        check_dtype_name(self.dtype)
        self.placement().check()
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, not {self.threads}")
