"""The self-draft's shared decoder layers run without the HF module overhead (`LeanLayers`).

The draft runs its k shared layers on one or two tokens per forward, so most of its time is not the
matrix products but the Python around them: HF's layer, attention and MLP modules, their decorators
and keyword plumbing cost about 0.2 ms per layer per call on this CPU. `LeanLayers` runs the same
computation as HF's Llama-family decoder layer (pre-norm attention with rotary embeddings, grouped
KV heads, gated SiLU MLP) as one plain function per layer, with

- Q, K and V fused into one weight and gate and up into another, each packed once for oneDNN
  (`models.fast_path.pack_weight`): 4 products per layer instead of 7; layers on a GGUF file's blocks
  (`models.int4.Int4Linear`, the quantized target backend) are fused the same way from their blocks;
- the layer's own RMSNorm modules and its architecture's own ``apply_rotary_pos_emb``;
- SDPA with ``enable_gqa`` (no repeated K/V copies), the caller's additive mask, and the layer's scale;
- the same ``DynamicCache`` updates, so `decoding.engine.cache.KVState` prunes and forks it as before.

It gives the same hidden states as the HF layers (bit-identical on SmolLM2; tested to 1e-5 on tiny
Llama and Qwen2 models) and is used only where it applies: CPU float32 with oneDNN, no gradients, and
layers of the supported form (`supports`). Anything else (CUDA, bf16, training, q/k-norm architectures
such as Qwen3, sliding windows) runs the HF layers unchanged. The fused copies are rebuilt when a source
weight changes in place (an optimizer step), as `PackedLinear` does.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F

from models.fast_path import can_pack, pack_weight, packed_linear, weight_version
from models.int4 import Int4Linear

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _linears(layer: nn.Module) -> list[nn.Module]:
    """The layer's linear modules whose weights `LeanLayers` fuses: attention's ``_ATTN``, then the MLP's ``_MLP``."""
    attn, mlp = layer.self_attn, layer.mlp
    return [getattr(attn, n) for n in _ATTN] + [getattr(mlp, n) for n in _MLP]


def supports(layer: nn.Module) -> bool:
    """Whether ``layer`` has the plain Llama-family form `LeanLayers` computes."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not all(hasattr(attn, n) for n in _ATTN):
        return False
    if not all(hasattr(mlp, n) for n in _MLP) or not hasattr(layer, "input_layernorm"):
        return False
    if hasattr(attn, "q_norm") or getattr(attn, "sliding_window", None) or getattr(attn, "softcap", None):
        return False
    act = getattr(getattr(layer.mlp, "config", None), "hidden_act", None)
    rotary = getattr(sys.modules.get(type(layer).__module__), "apply_rotary_pos_emb", None)
    linears = _linears(layer)
    blocks = all(isinstance(m, Int4Linear) for m in linears)
    return (act == "silu" and rotary is not None and getattr(attn, "head_dim", None) is not None
            and (blocks or all(can_pack(m.weight.device, m.weight.dtype) and not isinstance(m, Int4Linear)
                               for m in linears)))


class _Lean:
    """One layer's fused, packed weights and the modules it still calls (norms, rotary)."""

    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.layer = layer
        self.idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.scale = attn.scaling
        self.width = mlp.gate_proj.out_features
        self.rotary = sys.modules[type(layer).__module__].apply_rotary_pos_emb
        self.sources = _linears(layer)  # the modules whose weights the fused copies are made from
        self.pack()

    def pack(self) -> None:
        """(Re)build the fused, packed copies from the source weights as they are now."""
        attn, mlp = self.layer.self_attn, self.layer.mlp
        self.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o = _fused([attn.o_proj])
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj])
        self.down = _fused([mlp.down_proj])

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask, cache) -> torch.Tensor:
        batch, n, _ = h.shape
        layer, d = self.layer, self.head_dim
        qkv = self.qkv(layer.input_layernorm(h))  # [B, n, (heads + 2 kv) d]
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.view(batch, n, self.heads, d).transpose(1, 2)  # [B, heads, n, d]
        k = k.view(batch, n, self.kv_heads, d).transpose(1, 2)
        v = v.view(batch, n, self.kv_heads, d).transpose(1, 2)
        q, k = self.rotary(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.idx)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                           enable_gqa=self.heads != self.kv_heads)
        h = h + self.o(a.transpose(1, 2).reshape(batch, n, -1))
        gate, up = self.gate_up(layer.post_attention_layernorm(h)).split([self.width, self.width], dim=-1)
        return h + self.down(F.silu(gate) * up)


def _fused(linears: list[nn.Module]):
    """One function ``x -> [linear(x) for linear in linears]`` concatenated: the row-concatenation of their weights,
    packed once for oneDNN, or for layers on GGUF blocks one `Int4Linear` over their stacked blocks (one
    kernel call instead of several)."""
    if all(isinstance(m, Int4Linear) for m in linears):
        if len(linears) == 1:
            return linears[0]
        return Int4Linear.fused(linears)
    with torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in linears], dim=0)
        biases = [m.bias for m in linears]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else weight.new_zeros(m.out_features)
             for m, b in zip(linears, biases, strict=True)])
    packed = pack_weight(weight)
    return lambda x: packed_linear(x, packed, bias)


class LeanLayers:
    """The decoder layers ``layers`` as plain functions (module docstring); call `applies` first."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.ok = len(layers) > 0 and all(supports(layer) for layer in layers)
        self.layers = [_Lean(layer) for layer in layers] if self.ok else []
        self._sources = [m for lean in self.layers for m in lean.sources]  # every layer's, in one flat list
        self._packed_versions = self._versions()

    def _versions(self) -> list[int]:
        """The in-place update counter of every source weight (read through its module, each call)."""
        return [weight_version(m.weight) for m in self._sources]

    def applies(self, h: torch.Tensor) -> bool:
        """Whether this call can take the lean path: supported layers, CPU float32. (No gradients either: the
        caller checks that first, before building this, `models.self_draft.SelfDraft._lean_layers`.)"""
        return self.ok and h.device.type == "cpu" and h.dtype == torch.float32

    def __call__(self, h: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], mask, cache
                 ) -> torch.Tensor:
        """Hidden states ``[B, n, H]`` after every layer; updates ``cache`` (a DynamicCache or None)."""
        versions = self._versions()  # one check per call, over all layers
        if versions != self._packed_versions:  # a source weight changed in place (an optimizer step)
            for lean in self.layers:
                lean.pack()
            self._packed_versions = versions
        cos, sin = position_embeddings
        for lean in self.layers:
            h = lean(h, cos, sin, mask, cache)
        return h
