"""Section `prompts` of params.yaml: `PromptsConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
