"""Section `decode` of params.yaml: `DecodeConfig`."""

from __future__ import annotations

from dataclasses import dataclass


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
