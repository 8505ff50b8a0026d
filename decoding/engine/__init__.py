"""The speculative decoding engine on real transformers models (ALGORITHMS.md sections 1-2).

- `cache`: KV caches with slot positions; pruning to the accepted path.
- `tree_pass`: forward passes over tree nodes with ancestor-only additive masks.
- `drafting`: the trunk token by token, then the K rollouts as one batch.
- `policy`: static actions and the selector protocol (``select(features) -> Action``).
- `generate`: the decode loop and its statistics (`stats`).
"""

from .generate import AUTOREGRESSIVE, DecodeResult, SpeculativeDecoder, generate
from .policy import RootFeatures, Selector, StaticPolicy
from .stats import DecodeStats

__all__ = ["AUTOREGRESSIVE", "DecodeResult", "DecodeStats", "RootFeatures", "Selector", "SpeculativeDecoder",
           "StaticPolicy", "generate"]
