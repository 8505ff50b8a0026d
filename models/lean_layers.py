"""Decoder layers without the HF module overhead: `LeanLayers` (the self-draft's shared layers) and
`use_lean_forward` (the target's whole decoder stack).

A decode step runs every layer on one to a few tokens, so much of its time is not the matrix products but
the Python around them: HF's layer, attention and MLP modules, their decorators and keyword plumbing cost
about 0.2 ms per layer per call on this CPU, more than the int4 products of a layer. `LeanLayers` runs the
same computation as HF's Llama-family decoder layer (pre-norm attention with rotary embeddings, grouped
KV heads, gated SiLU MLP) as one plain function per layer, with

- Q, K and V fused into one weight and gate and up into another, each packed once for oneDNN
  (`models.fast_path.pack_weight`): 4 products per layer instead of 7; layers on a GGUF file's blocks
  (`models.int4.Int4Linear`, the quantized target backend) are fused the same way from their blocks;
- the layer's own RMSNorm, as ``torch.nn.functional.rms_norm`` on the module's weight and epsilon where that computes
  the module's function bit for bit (checked once per module on a probe, `fast_norm`; one fused call instead of HF's
  six operators: ~13 us less per norm, 61 norms a target forward), else the module itself;
- rotary embeddings on Q's and K's heads in one go, ``x * cos + roll(x, d / 2) * sin'`` with ``sin'`` the sine with
  its first half negated, built once per forward (`rope_of`): the same products and sum as the architecture's own
  ``apply_rotary_pos_emb`` (``rotate_half(x) * sin``: two slices, a negation and a concatenation per tensor), bit for
  bit, which a probe checks once; an architecture whose function differs keeps its own. With the fused norms this is
  ~550 fewer operator calls per target forward: a plain step 0.91x and a 1,1,0 step 0.95x as long (paired, in one
  process, docs/engine.md);
- rotary and attention **in float64**: SDPA with ``enable_gqa`` (no repeated K/V copies), the caller's additive mask
  and the layer's scale, on a float64 KV cache. A row's attention then rounds to the same float32 whatever else
  the pass holds. In float32 a tree pass's row and a one-token step's differ in the last bits (SDPA reduces over a
  different number of keys); on the int4 backend, which rounds every product's input to bfloat16, those bits grew
  to a 1.2% logit difference (total variation 0.03) between a tree pass and plain steps on an AVX2 EPYC;
- hidden states as rows ``[B * n, H]`` from layer to layer (no reshape around each product), and each product's
  output cast once, to the dtype its next operator needs (`models.int4.Int4Linear.product` returns the kernel's
  bfloat16; the casts are exact): 37 operator calls a layer where the layer above made 48, the same logits bit for
  bit (docs/engine.md, stop 63);
- the same ``DynamicCache`` interface, so `engine.cache.KVState` prunes and forks it as before.

It gives the same hidden states as the HF layers up to float rounding (tested to 1e-5 on tiny Llama and Qwen2
models) and is used only where it applies: CPU float32 with oneDNN, no gradients, layers of the supported form
(`supports`). Anything else (CUDA, bf16, training, q/k-norm architectures such as Qwen3, sliding windows) runs the
HF layers unchanged. A layer shared by the target and the self-draft has one set of fused copies (`_lean_of`),
rebuilt when a source weight changes in place (an optimizer step), as `PackedLinear` does.

`use_lean_forward` routes a loaded causal LM's decoder stack (``model.model``: embedding, rotary, layers, final
norm) through `LeanLayers` for every call it applies to, so the engine, trajectories, labels and transformers'
``generate`` compute the target the same way. Calls it does not cover (gradients, another device or dtype,
``inputs_embeds``, attention outputs, a per-layer-type mask dict, a layer with forward hooks) go to HF's forward.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import nn
from torch.nn import functional as F

from models.fast_path import PackedLinear, can_pack, pack_weight, packed_linear, weight_version
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


def fast_norm(norm: nn.Module):
    """``x -> norm(x)`` as one ``F.rms_norm`` call on ``norm``'s weight and epsilon when that gives the module's own
    output bit for bit on a float32 probe of 1, 3 and 16 rows (an RMSNorm computing ``weight * x / rms(x)``); else
    ``norm`` itself (another formula, e.g. Gemma's ``1 + weight``, or a module without those attributes)."""
    weight, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return norm
    shape = (weight.shape[0],)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for rows in (1, 3, 16):
            probe = torch.randn(1, rows, shape[0], generator=gen).to(weight.device)
            if not torch.equal(norm(probe), F.rms_norm(probe, shape, weight, eps)):
                return norm
    return lambda x: F.rms_norm(x, shape, weight, eps)


class _Lean:
    """One layer's fused, packed weights and the modules it still calls (norms, rotary)."""

    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        # the layer's parts, not the layer itself: `_LEAN` is keyed by the layer and must not keep it alive
        self.input_norm, self.post_norm = fast_norm(layer.input_layernorm), fast_norm(layer.post_attention_layernorm)
        self.idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.scale = attn.scaling
        self.gqa = self.heads != self.kv_heads  # (a bool, so a compiled graph does not trace it as a symbol)
        self.width = mlp.gate_proj.out_features
        self.rotary = sys.modules[type(layer).__module__].apply_rotary_pos_emb
        self.sources = _linears(layer)  # the modules whose weights the fused copies are made from
        self.pack()

    def pack(self) -> None:
        """(Re)build the fused, packed copies from the source weights as they are now."""
        q, k, v, o, gate, up, down = self.sources
        self.qkv = _fused([q, k, v])
        self.o = _fused([o])
        self.gate_up = _fused([gate, up])
        self.down = _fused([down])
        for m in self.sources:  # the fused copies replace the per-module ones (one packed copy of each weight)
            if isinstance(m, PackedLinear):
                m.release()

    def __call__(self, h: torch.Tensor, shape: tuple[int, int], rope, mask, cache) -> torch.Tensor:
        """The layer on hidden states ``h`` ``[B * n, H]`` (``shape``: ``(B, n)``), float32 rows throughout. A
        product's output stays as its kernel returns it (bfloat16 on GGUF blocks) until an operator needs another
        dtype: the casts are exact, and a residual add promotes to float32 exactly as a cast before it would."""
        batch, n = shape
        qk_heads = self.heads + self.kv_heads
        # [B, heads + 2 kv, n, d], float64 from here to attention: Q's heads, K's, V's
        qkv = self.qkv(self.input_norm(h)).to(torch.float64).view(batch, n, qk_heads + self.kv_heads, self.head_dim)
        qkv = qkv.transpose(1, 2)
        q, k = rope(qkv[:, :qk_heads], self.heads)
        v = qkv[:, qk_heads:]
        if cache is not None:
            k, v = cache.update(k, v, self.idx)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                           enable_gqa=self.gqa)
        h = h + self.o(a.transpose(1, 2).reshape(batch * n, -1).to(h.dtype))
        gate, up = self.gate_up(self.post_norm(h)).float().split([self.width, self.width], dim=-1)
        return h + self.down(F.silu(gate) * up)


def _fused(linears: list[nn.Module]):
    """One function, rows ``[T, K]`` -> ``[linear(rows) for linear in linears]`` concatenated: the row-concatenation
    of their weights, packed once for oneDNN (float32 out), or for layers on GGUF blocks the product of one
    `Int4Linear` over their stacked blocks (one kernel call instead of several; `Int4Linear.product`, bfloat16 out)."""
    if all(isinstance(m, Int4Linear) for m in linears):
        return (linears[0] if len(linears) == 1 else Int4Linear.fused(linears)).product
    with torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in linears], dim=0)
        biases = [m.bias for m in linears]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else weight.new_zeros(m.out_features)
             for m, b in zip(linears, biases, strict=True)])
    packed = pack_weight(weight)
    return lambda x: packed_linear(x, packed, bias)


_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer module -> its one `_Lean`


def _lean_of(layer: nn.Module) -> _Lean:
    """The layer's fused copies, built once per layer module (the target and the self-draft share its layers)."""
    lean = _LEAN.get(layer)
    if lean is None:
        lean = _LEAN[layer] = _Lean(layer)
    return lean


def _half_turn(cos: torch.Tensor, sin: torch.Tensor):
    """``(qk, heads) -> (q, k)``: Q's and K's heads ``qk`` ``[B, heads + kv, n, d]`` rotated in one go,
    ``x * cos + roll(x, d / 2) * sin'`` with ``sin'`` the sine with its first half negated (``roll(x, d / 2) * sin'``
    is ``rotate_half(x) * sin`` exactly: only signs move), then split after ``heads``; cos and sin ``[B, n, d]``."""
    half = cos.shape[-1] // 2
    c, s = cos.unsqueeze(1), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).unsqueeze(1)

    def rope(qk, heads):
        out = qk * c + qk.roll(half, -1) * s
        return out[:, :heads], out[:, heads:]

    return rope


def _own_rotary(rotary):
    """`_half_turn`'s interface over the architecture's own ``rotary(q, k, cos, sin)``."""

    def bind(cos, sin):
        return lambda qk, heads: rotary(qk[:, :heads], qk[:, heads:], cos, sin)

    return bind


def rope_of(rotary, head_dim: int):
    """``(cos, sin) -> rope``, ``rope(qk, heads) -> (q, k)`` (`_half_turn`): `_half_turn` when it gives the
    architecture's ``rotary`` (``apply_rotary_pos_emb``) bit for bit on a float64 probe, else ``rotary`` itself."""
    gen = torch.Generator().manual_seed(0)
    qk = torch.randn(1, 6, 3, head_dim, generator=gen, dtype=torch.float64)
    cos, sin = torch.randn(2, 1, 3, head_dim, generator=gen, dtype=torch.float64)
    own = _own_rotary(rotary)
    if head_dim % 2 == 0 and all(torch.equal(a, b) for a, b in zip(own(cos, sin)(qk, 4), _half_turn(cos, sin)(qk, 4),
                                                                   strict=True)):
        return _half_turn
    return own


class LeanLayers:
    """The decoder layers ``layers`` as plain functions (module docstring); call `applies` first."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.ok = len(layers) > 0 and all(supports(layer) for layer in layers)
        self.layers = [_lean_of(layer) for layer in layers] if self.ok else []
        self.rope = rope_of(self.layers[0].rotary, self.layers[0].head_dim) if self.ok else None
        # every layer's float sources, in one flat list: a layer on GGUF blocks is fused from its blocks, which an
        # in-place change of its ``weight`` does not touch (and 210 counter reads cost ~0.2 ms per target forward)
        self._sources = [m for lean in self.layers for m in lean.sources if not isinstance(m, Int4Linear)]
        self._packed_versions = self._versions()

    def _versions(self) -> list[int]:
        """The in-place update counter of every source weight (read through its module, each call)."""
        return [weight_version(m.weight) for m in self._sources]

    def applies(self, h: torch.Tensor) -> bool:
        """Whether this call can take the lean path: supported layers, CPU float32. (No gradients either: the
        caller checks that first, before building this, `models.self_draft.SelfDraft._lean_layers`.)"""
        return self.ok and h.device.type == "cpu" and h.dtype == torch.float32

    def __call__(self, h: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], mask, cache,
                 outputs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Hidden states ``[B, n, H]`` after every layer; updates ``cache`` (a DynamicCache or None); appends each
        layer's input to ``outputs`` when given (HF's ``hidden_states`` but the last)."""
        versions = self._versions()  # one check per call, over all layers
        if versions != self._packed_versions:  # a source weight changed in place (an optimizer step)
            for lean in self.layers:
                lean.pack()
            self._packed_versions = versions
        # rotary and attention in float64 (module docstring): a row's attention is the same whatever the pass holds
        rope = self.rope(*(t.double() for t in position_embeddings))
        mask = None if mask is None else mask.double()  # [B|1, 1, n, S + n]: additive, as the scores
        batch, n, width = h.shape
        rows = h.reshape(batch * n, width)  # the layers work on rows: no reshape around every product
        for lean in self.layers:
            if outputs is not None:
                outputs.append(rows.view(batch, n, width))
            rows = lean(rows, (batch, n), rope, mask, cache)
        return rows.view(batch, n, width)


def additive_mask(mask, n: int, past: int, dtype, device):
    """None (every query may attend every key) or an additive float mask ``[B|1, 1, n, past+n]`` from a 4D mask (bool:
    True = may attend, or already additive), a 2D padding mask ``[B, past+n]`` or None (causal over the new tokens)."""
    blocked = torch.finfo(dtype).min
    if mask is not None and mask.dim() == 4:
        if mask.dtype == torch.bool:
            return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, blocked)
        return mask.to(dtype)
    causal = None
    if n > 1:
        q = torch.arange(past, past + n, device=device).unsqueeze(1)  # [n, 1]
        kv = torch.arange(past + n, device=device).unsqueeze(0)  # [1, past+n]
        causal = torch.zeros(n, past + n, dtype=dtype, device=device).masked_fill(kv > q, blocked)[None, None]
    if mask is None or bool(mask.all()):
        return causal
    if mask.dim() != 2 or mask.shape[1] != past + n:
        raise ValueError(f"2D attention_mask must be [B, past+n] = [B, {past + n}], got {tuple(mask.shape)}")
    pad = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(mask == 0, blocked)[:, None, None, :]
    return pad if causal is None else (pad + causal).clamp_min(blocked)


def step_inputs(h: torch.Tensor, rotary_emb: nn.Module, attention_mask, position_ids, cache):
    """``(position_ids, position_embeddings, additive mask)`` of a forward over ``h`` ``[B, n, H]`` appended after
    ``cache``'s slots (positions ``past .. past + n - 1`` unless ``position_ids`` says otherwise)."""
    n = h.shape[1]
    past = cache.get_seq_length() if cache is not None else 0
    if position_ids is None:
        position_ids = torch.arange(past, past + n, device=h.device).unsqueeze(0)  # [1, n]
    return (position_ids, rotary_emb(h, position_ids=position_ids),
            additive_mask(attention_mask, n, past, h.dtype, h.device))


_DECODER_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")
_PASSED_THROUGH = {"return_dict", "output_attentions"}  # keywords the lean forward accepts when falsy / None


def _hooked(layers: nn.ModuleList) -> bool:
    """Whether a layer module has forward hooks (e.g. `models.draft_data` capturing layer k's output): they fire
    only when the module itself is called, so such a call takes HF's path."""
    return any(layer._forward_hooks or layer._forward_pre_hooks for layer in layers)


def use_lean_forward(model: nn.Module, compile: bool = False) -> bool:
    """Route ``model.model``'s forward through `LeanLayers` (module docstring) where it applies, in place; returns
    whether it was installed (a Llama-family decoder stack whose every layer `supports`). ``compile``: run a stack
    on GGUF blocks as one compiled graph (`models.compiled_stack`) where a C++ compiler is found."""
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in _DECODER_PARTS) or len(inner.layers) == 0:
        return False
    if getattr(inner, "_lean_installed", False):
        return False
    lean = LeanLayers(inner.layers)
    if not lean.ok:
        return False
    final_norm = fast_norm(inner.norm)
    stack = lean
    if compile:
        from models import compiled_stack

        if compiled_stack.applies(lean):
            if compiled_stack.compiler_available():
                stack = compiled_stack.CompiledStack(lean)
            else:  # a different function than the compiled one: say so (every stage should compute the same)
                print("branchpoint: model.compile is on but no C++ compiler (g++, c++, clang++) is on the PATH: the "
                      "target's decoder stack runs eager", file=sys.stderr)
    from transformers.modeling_outputs import BaseModelOutputWithPast

    cache_field = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
    hf_forward = inner.forward

    def forward(input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs):
        use_cache, output_hidden_states = kwargs.pop("use_cache", None), kwargs.pop("output_hidden_states", None)
        cache = kwargs.pop("cache", None)
        cache = kwargs.pop("past_key_values", None) if cache is None else cache
        unsupported = (input_ids is None or inputs_embeds is not None or isinstance(attention_mask, dict)
                       or torch.is_grad_enabled() or any(kwargs.get(k) for k in _PASSED_THROUGH)
                       or set(kwargs) - _PASSED_THROUGH or _hooked(inner.layers))
        h = None if unsupported else inner.embed_tokens(input_ids)  # [B, n, H]
        if h is None or not lean.applies(h):
            more = {} if cache is None else {cache_field: cache}
            return hf_forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              inputs_embeds=inputs_embeds, use_cache=use_cache,
                              output_hidden_states=output_hidden_states, **more, **kwargs)
        if use_cache is None:
            use_cache = inner.config.use_cache
        if use_cache and cache is None:
            from transformers import DynamicCache

            cache = DynamicCache()
        _, pos_emb, mask = step_inputs(h, inner.rotary_emb, attention_mask, position_ids, cache)
        hidden = [] if output_hidden_states else None
        h = final_norm(stack(h, pos_emb, mask, cache if use_cache else None, hidden))
        return BaseModelOutputWithPast(last_hidden_state=h, hidden_states=None if hidden is None else (*hidden, h),
                                       **{cache_field: cache if use_cache else None})

    inner.forward = forward
    inner._lean_installed = True
    inner._lean_compiled = stack is not lean
    return True
