"""Forward passes over draft-tree nodes on top of a KV cache (ALGORITHMS.md section 1, step 2).

A *tree pass* feeds several new tokens at once; each may attend to the cached context, to its own
ancestors (which may be cached or new) and to itself, never to siblings or cousins. The attention
mask is additive float ``[1, 1, n, S + n]`` (0 allowed, ``finfo(dtype).min`` blocked) and the position
id of a node is ``ctx_len + depth``. A boolean 4D mask is NOT used: transformers' eager attention
silently misreads it (ALGORITHMS.md section 1).

Models with sliding-window layers (Gemma 2/3, Qwen2 with ``use_sliding_window``) get a dict
``{"full_attention": mask, "sliding_attention": mask}``, the sliding one also blocking keys whose
position is ``>= sliding_window`` behind the query; their cache keeps every slot (plain DynamicCache).
"""

from __future__ import annotations

import numpy as np
import torch

from decoding.tree import DraftTree

from .cache import KVState

_SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """``[n, n]`` bool: ``A[i, j]`` iff node j is node i or one of its ancestors (parents topological)."""
    n = parents.shape[0]
    anc = np.zeros((n, n), dtype=bool)
    for i in range(n):
        par = int(parents[i])
        if par >= 0:
            anc[i] = anc[par]
        anc[i, i] = True
    return anc


def causal_allowed(num_cached: int, n: int) -> np.ndarray:
    """``[n, S + n]`` bool for a plain causal chunk of ``n`` tokens after ``S`` cached slots."""
    allowed = np.ones((n, num_cached + n), dtype=bool)
    allowed[:, num_cached:] = np.tril(np.ones((n, n), dtype=bool))
    return allowed


def _sliding_window(model: torch.nn.Module) -> int | None:
    """The sliding window of the model's sliding layers, or None if all layers attend fully."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        return None
    unknown = set(layer_types) - _SUPPORTED_LAYER_TYPES
    if unknown:
        raise ValueError(f"{type(model).__name__}: layer types {sorted(unknown)} are not supported by the tree "
                         f"pass (only {sorted(_SUPPORTED_LAYER_TYPES)})")
    if "sliding_attention" not in layer_types:
        return None
    window = getattr(config, "sliding_window", None)
    if not window:
        raise ValueError(f"{type(model).__name__}: sliding_attention layers but no config.sliding_window")
    return int(window)


def attention_mask(kv: KVState, allowed: np.ndarray, query_positions: list[int]):
    """The additive mask (or per-layer-type dict) for ``allowed`` ``[n, S + n]`` (bool numpy)."""
    n, total = allowed.shape
    if total != len(kv) + n:
        raise ValueError(f"attention mask covers {total} keys, expected {len(kv)} cached + {n} new")
    blocked_value = torch.finfo(kv.dtype).min

    def additive(ok: np.ndarray) -> torch.Tensor:
        ok_t = torch.from_numpy(ok).to(kv.device)
        mask = torch.zeros(ok.shape, dtype=kv.dtype, device=kv.device)
        return mask.masked_fill_(~ok_t, blocked_value)[None, None]  # [1, 1, n, S + n]

    full = additive(allowed)
    window = _sliding_window(kv.model)
    if window is None:
        return full
    key_pos = np.asarray(kv.positions + list(query_positions), dtype=np.int64)  # [S + n]
    near = (np.asarray(query_positions, dtype=np.int64)[:, None] - key_pos[None, :]) < window
    return {"full_attention": full, "sliding_attention": additive(allowed & near)}


def forward_nodes(kv: KVState, tokens, positions: list[int], allowed: np.ndarray,
                  output_hidden_states: bool = False, keep: int | list[int] = 0,
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Feed ``tokens`` ``[n]`` with ``positions`` and mask ``allowed`` ``[n, S + n]``; they are appended
    to the cache. Returns ``(logits [n, V'], last-layer hidden states [n, H] or None)``; ``keep``: 0 = every row,
    an int k > 0 = only the last k rows of both, a list (indices into the n tokens) = only those rows, in that
    order (either way the head skips the other positions where the model allows it)."""
    ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=kv.device)  # [n]
    mask = attention_mask(kv, allowed, positions)
    rows = None if isinstance(keep, int | np.integer) else list(keep)
    last = min(int(keep), len(positions)) if rows is None else 0
    out = kv.forward(ids, list(positions), mask, output_hidden_states=output_hidden_states, last_logits=last,
                     logits_rows=rows)
    logits = out.logits[0]
    hidden = out.hidden_states[-1][0] if output_hidden_states else None
    if rows is not None:
        index = torch.as_tensor(rows, dtype=torch.long, device=logits.device)
        logits = logits if kv.keeps_logits else logits[index]
        hidden = hidden[index.to(hidden.device)] if hidden is not None else None
    elif last:
        logits = logits[-last:]
        hidden = hidden[-last:] if hidden is not None else None
    return logits, hidden


def hidden_numpy(h: torch.Tensor | None) -> np.ndarray | None:
    """Hidden states as float32 numpy on the CPU (the features' input); None stays None."""
    return None if h is None else h.float().cpu().numpy()


def input_embeddings(model: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    """``[n, H]`` float32 numpy: the model's input embeddings of ``tokens`` (a table lookup, no forward); the
    ``e_root`` feature (`decoding.features`)."""
    table = model.get_input_embeddings()
    ids = torch.as_tensor(tokens, dtype=torch.long, device=table.weight.device)
    return hidden_numpy(table(ids))


def prefill(kv: KVState, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Process a plain causal chunk (e.g. the prompt) after the cached slots; returns the last logits [V']."""
    start = len(kv)
    logits, hidden = forward_nodes(kv, tokens, list(range(start, start + len(tokens))),
                                   causal_allowed(start, len(tokens)), keep=1)
    return logits[-1], hidden


def tree_allowed(num_context: int, parents: np.ndarray) -> np.ndarray:
    """``[n, S + n]`` bool: every node sees the ``S`` cached context slots and its ancestors."""
    n = parents.shape[0]
    allowed = np.ones((n, num_context + n), dtype=bool)
    allowed[:, num_context:] = ancestor_matrix(parents)
    return allowed


def target_tree_pass(kv: KVState, root_token: int, tree: DraftTree,
                     output_hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target pass over the root (not yet processed) and all draft nodes of ``tree``.

    Node i goes to slot ``ctx + i`` with position ``ctx + depth(i)``, ``ctx = len(kv)``. Returns
    ``(logits [n, V'], hidden [n, H] or None)``: row i gives p(.|context + path(i))."""
    ctx = len(kv)
    if kv.positions and kv.positions[-1] != ctx - 1:
        raise RuntimeError(f"target cache is not contiguous (last position {kv.positions[-1]}, {ctx} slots); "
                           "prune it to the accepted path before the next tree pass")
    tokens = tree.tokens.copy()
    tokens[0] = root_token
    positions = (ctx + tree.depths).tolist()
    return forward_nodes(kv, tokens, positions, tree_allowed(ctx, tree.parents), output_hidden_states)
