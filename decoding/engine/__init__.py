"""The speculative decoding engine on real transformers models (ALGORITHMS.md sections 1-2).

- `cache`: KV caches with slot positions; pruning to the accepted path; forking a prefix.
- `tree_pass`: forward passes over tree nodes with ancestor-only additive masks.
- `rows`: logits -> transformed probability rows (torch side of `decoding.sampling`).
- `drafting`: any tree layout level by level (one action's tree, or the union tree of labels).
- `generate`: the decode loop, a loop over one `step` (choose -> draft -> target pass -> verify ->
  prune), and its statistics (`stats`). Policies and the selector protocol: `decoding.selector`.
"""

from ..selector import RootFeatures, Selector, StaticPolicy
from .generate import AUTOREGRESSIVE, DecodeResult, DecodeState, SpeculativeDecoder, StepResult, generate
from .stats import DecodeStats

__all__ = ["AUTOREGRESSIVE", "DecodeResult", "DecodeState", "DecodeStats", "RootFeatures", "Selector",
           "SpeculativeDecoder", "StaticPolicy", "StepResult", "generate"]
