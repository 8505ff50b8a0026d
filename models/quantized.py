"""The quantized target backend: a GGUF model's linear layers computed from the file's own blocks.

`use_gguf_blocks(model, gguf)` replaces the linear layers of a loaded (dequantized) GGUF model: attention's q, k,
v, o and the MLP's gate, up and down by `models.int4.Int4Linear` on the same file's Q4_1 blocks, and the LM head
by one on its Q8_0 blocks (``token_embd`` where the head is tied to the input embedding, else ``output``).
Attention itself, the norms, the rotary embedding, the KV cache, tree masks and the verifiers are unchanged: the
model stays the HF module it was.

Before a block is used, its dequantization is compared with the weight transformers loaded from the same
file: they must be equal (not close). Q and K rows are stored in llama.cpp's rotary order and moved back
here exactly as transformers moves them (`_rotary_rows`); the comparison proves the order. The codes are the
file's; scales, zeros and activations are bfloat16, so the backend computes a slightly different function from
the float32 dequantized model (held-out perplexity +0.19%, docs/engine.md). Every stage loads the target the same
way (`models.loading.load_model`), so trajectories, labels, profile and decoding all use that one function.

The input embedding stays a float32 table: a lookup reads one row per token and equals the row's dequantization.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from models.gguf_blocks import QuantizedMatrix, architecture, read_blocks
from models.int4 import Int4Linear

# HF module path inside a decoder layer -> GGUF tensor name inside block i
LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


class QuantizedBackendError(ValueError):
    """A model cannot run from a GGUF file's blocks (other architecture, weights that differ from the file)."""


def _rotary_rows(n: int, heads: int) -> np.ndarray:
    """Row order taking a llama.cpp Q or K weight back to HF's: within each head, the interleaved rotary pairs
    (0, 1), (2, 3), ... become the two halves (transformers' GGUF loader applies the same reordering)."""
    half = n // heads // 2
    return np.arange(n).reshape(heads, half, 2).swapaxes(1, 2).reshape(n)


def _matching(w: QuantizedMatrix, linear: nn.Module, name: str) -> QuantizedMatrix:
    """``w`` after checking that it dequantizes to exactly ``linear``'s weight."""
    weight = linear.weight.detach().float().cpu().numpy()
    if weight.shape != w.shape:
        raise QuantizedBackendError(f"{name}: the file's block matrix is {w.shape}, the model's weight {weight.shape}")
    if not np.array_equal(w.dequantize(), weight):
        raise QuantizedBackendError(f"{name}: the model's weight is not the dequantization of the file's blocks")
    return w


def model_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise QuantizedBackendError(f"{type(model).__name__} has no model.layers: not a Llama-family causal LM")
    return layers


def use_gguf_blocks(model: nn.Module, gguf: str | Path) -> int:
    """Replace ``model``'s linear layers by `Int4Linear` modules on ``gguf``'s Q4_1 blocks, and its LM head on the
    file's head blocks where they are Q4_1 or Q8_0 (in place); returns how many layers were replaced."""
    arch = architecture(gguf)
    if arch["architecture"] not in ("llama",):
        raise QuantizedBackendError(f"{gguf}: architecture {arch['architecture']!r}; the block backend reads llama")
    blocks = read_blocks(gguf)
    replaced = 0
    for i, layer in enumerate(model_layers(model)):
        for path, tensor in LAYER_TENSORS.items():
            parent_name, attr = path.split(".")
            parent = getattr(layer, parent_name)
            linear = getattr(parent, attr)
            w = blocks.get(f"blk.{i}.{tensor}.weight")
            if w is None or w.fmt != "Q4_1" or getattr(linear, "bias", None) is not None:
                raise QuantizedBackendError(f"{gguf}: blk.{i}.{tensor}.weight is not a Q4_1 matrix without bias "
                                            f"({None if w is None else w.fmt}); the block backend computes Q4_1")
            if tensor in ("attn_q", "attn_k"):
                w = w.rows(_rotary_rows(w.shape[0], arch["heads"] if tensor == "attn_q" else arch["kv_heads"]))
            w = _matching(w, linear, f"layer {i} {path}")
            setattr(parent, attr, Int4Linear(w, weight=linear.weight))
            replaced += 1
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    w = blocks.get("token_embd.weight" if tied else "output.weight")
    if head is not None and w is not None and getattr(head, "bias", None) is None:
        model.set_output_embeddings(Int4Linear(_matching(w, head, "lm_head"), weight=head.weight))
        replaced += 1
    model.config.branchpoint_backend = "int4"
    return replaced


def backend_of(model: nn.Module) -> str:
    """``dense`` or ``int4`` (what `use_gguf_blocks` made of it)."""
    return getattr(getattr(model, "config", None), "branchpoint_backend", "dense")


def linear_bytes(model: nn.Module) -> int:
    """Weight bytes the linear layers and the LM head read per token: quantized blocks (codes, scales, zeros) on the
    block backend, else the float weights (each module once)."""
    seen = {id(m): m for m in model.modules()
            if isinstance(m, (Int4Linear, nn.Linear)) or type(m).__name__ == "PackedLinear"}
    return sum(m.bytes_read if isinstance(m, Int4Linear) else m.weight.numel() * m.weight.element_size()
               for m in seen.values())
