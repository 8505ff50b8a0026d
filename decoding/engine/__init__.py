"""The speculative decoding engine on real transformers models (ALGORITHMS.md sections 1-2).

- `cache`: KV caches with slot positions; pruning to the accepted path; forking a prefix.
- `tree_pass`: forward passes over tree nodes with ancestor-only additive masks.
- `torch_sampling`: logits -> transformed probability rows (torch side of `decoding.sampling`).
- `drafting`: any tree layout level by level (one action's tree, or the union tree of labels).
- `decoder`: the decode loop (`SpeculativeDecoder.generate`), a loop over one `step`
  (choose -> draft -> target pass -> verify ->
  prune), and its statistics (`stats`). Policies and the selector protocol: `decoding.policy`.
"""

from ..lazy_names import lazy_getattr

# Resolved lazily (PEP 562): importing one engine module (e.g. `torch_sampling`) does not load the decode
# loop and the verifiers, so a stage that only samples depends on the files it runs (pipeline/stage_deps.py).
_EXPORTS = {
    "AUTOREGRESSIVE": ".decoder",
    "DecodeResult": ".decoder",
    "DecodeState": ".decoder",
    "SpeculativeDecoder": ".decoder",
    "DecodeStats": ".stats",
    "Policy": "..policy",
    "RootFeatures": "..policy",
    "StaticPolicy": "..policy",
    "StepResult": "..policy",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
