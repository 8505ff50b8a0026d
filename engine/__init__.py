"""The speculative decoding engine on real transformers models (ALGORITHMS.md sections 1-2).

- `cache`: KV caches with slot positions; pruning to the accepted path; forking a prefix.
- `tree_pass`: forward passes over tree nodes with ancestor-only additive masks.
- `torch_sampling`: logits -> transformed probability rows (torch side of `decoding.sampling`).
- `drafting`: any tree layout level by level (one action's tree, or the union tree of labels).
- `decoder`: the decode loop (`engine.decoder.SpeculativeDecoder.generate`), a loop over one `step`
  (choose -> draft -> target pass -> verify -> prune), and its statistics (`stats`). Policies and the
  selector protocol: `decoding.policy`.

Import from the module that defines a name: this file imports nothing, so a stage that only samples
(`torch_sampling`) does not load the decode loop and the verifiers.
"""
