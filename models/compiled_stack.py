"""`CompiledStack`: the int4 target's decoder stack as one ``torch.compile`` graph (inductor's C++ kernels on CPU).

An eager one-token forward of the embedded target makes ~37 operator calls a layer around its four 4-bit products
(norms, casts, rotary, cache writes, residual adds, SiLU): about as much time as the products on 2 cores
(docs/engine.md). Compiled as one graph, the products stay calls of the same 4-bit kernel and the operators between
them fuse into a few C++ loops: a plain step takes ~0.78x the time (docs/engine.md, stop 64, paired).

- The graph runs `models.lean_layers.LeanLayers`' own layer functions over the engine's growing KV buffers
  (`engine.cache.GrowingLayer`): `GrowingLayer.reserve` makes room before the call, the graph writes the new slots
  and attends over the used ones, `GrowingLayer.advance` counts them after, so the engine's prune, crop and fork
  work unchanged. Buffers hold a multiple of `CAPACITY_BLOCK` slots and the write position comes from the mask's
  width, so one graph serves every context length. A ``DynamicCache`` of plain layers (transformers' ``generate``)
  has them replaced by growing ones holding the same slots, once.
- Three graphs a process: a prefill from an empty cache, one-token steps and passes of several rows (torch
  specializes sizes 0 and 1). Tracing costs ~30 s with inductor's on-disk cache warm, ~90 s cold. Recompiling past
  `RECOMPILE_LIMIT` is an error (``fail_on_recompile_limit_hit``), never a silent fall back to eager, which would
  change the function mid-run.
- **Another function than the eager stack, bit for bit; batch invariant like it.** Fused loops round in another
  order, and the int4 backend rounds every product's input to bfloat16, which turns last-bit differences into logit
  differences up to ~0.25 on the embedded target (total variation ~0.03), as between two float orders of the eager
  stack. Held-out perplexity 7.9281 against the eager stack's 7.9240 (`benchmarks.bench_target_backend`). A row's
  logits do not depend on the other rows of its pass (tests/test_compiled_stack.py), which is what the engine needs.
  So every stage must compute the target the same way: ``model.compile`` is one setting for all of them (on by
  default in params; `Placement`'s own default, the library's, stays eager).
- Used where `applies`: every layer on GGUF blocks (`models.int4.Int4Linear`), CPU float32, batch 1 (a batch of
  several prompts runs the eager stack), and a C++ compiler that inductor can call.
"""

from __future__ import annotations

import shutil

import torch
from transformers import DynamicCache

from engine.cache import GrowingLayer
from models.int4 import Int4Linear
from models.lean_layers import LeanLayers

RECOMPILE_LIMIT = 32  # graphs per process over all compiled stacks (each model instance adds its own few)


def compiler_available() -> bool:
    """Whether inductor can build its CPU kernels here (a C++ compiler on the PATH)."""
    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def applies(lean: LeanLayers) -> bool:
    """Whether `CompiledStack` computes ``lean``: supported layers, all on GGUF blocks."""
    return lean.ok and all(isinstance(m, Int4Linear) for layer in lean.layers for m in layer.sources)


CAPACITY_BLOCK = 1024  # KV buffers hold a multiple of this many slots: one graph per multiple, not per length


class _Slots:
    """The cache as a layer sees it inside the graph: each layer's key and value buffers, the new slots
    ``[start, start + n)``."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], start, n) -> None:
        self.keys, self.values, self.start, self.n = keys, values, start, n

    def update(self, k: torch.Tensor, v: torch.Tensor, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        kb, vb = self.keys[idx], self.values[idx]
        kb.narrow(2, self.start, self.n).copy_(k)
        vb.narrow(2, self.start, self.n).copy_(v)
        return kb.narrow(2, 0, self.start + self.n), vb.narrow(2, 0, self.start + self.n)


class CompiledStack:
    """``LeanLayers`` on GGUF blocks as one compiled graph, with `LeanLayers.__call__`'s interface."""

    def __init__(self, lean: LeanLayers) -> None:
        if not applies(lean):
            raise ValueError("CompiledStack computes layers on GGUF blocks only (models.int4.Int4Linear)")
        self.lean = lean
        first = lean.layers[0]
        self.kv_heads, self.head_dim = first.kv_heads, first.head_dim
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        self._graph = torch.compile(self._layers, fullgraph=True)

    def _layers(self, rows, cos, sin, mask, keys, values):
        """Rows ``[n, H]`` after every layer, and each layer's input rows; the new slots are the last ``n`` of the
        mask's ``S + n`` keys (sizes from shapes, so one graph serves every context length)."""
        n = rows.shape[0]
        rope = self.lean.rope(cos, sin)
        slots = _Slots(keys, values, mask.shape[-1] - n, n)
        inputs = []
        for layer in self.lean.layers:
            inputs.append(rows)
            rows = layer(rows, (1, n), rope, mask, slots)
        return rows, inputs

    def _growing_layers(self, cache: DynamicCache | None, count: int) -> list[GrowingLayer]:
        """``cache``'s layers as `GrowingLayer` s (created when missing; a plain layer's slots moved into one)."""
        if cache is None:
            cache = DynamicCache()
        layers = cache.layers
        for i in range(count):
            if i == len(layers):
                layers.append(GrowingLayer())
            elif not isinstance(layers[i], GrowingLayer):
                old, layers[i] = layers[i], GrowingLayer()
                if getattr(old, "keys", None) is not None and old.keys.numel() > 0:
                    layers[i].update(old.keys, old.values)
        cache.layer_class_to_replicate = GrowingLayer
        return layers[:count]

    def __call__(self, h: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor], mask, cache,
                 outputs: list[torch.Tensor] | None = None) -> torch.Tensor:
        """`LeanLayers.__call__`: hidden states ``[B, n, H]`` after every layer; updates ``cache`` (None: a cache
        for this call only); appends each layer's input to ``outputs`` when given."""
        batch, n, width = h.shape
        if batch != 1:
            return self.lean(h, position_embeddings, mask, cache, outputs)
        layers = self._growing_layers(cache, len(self.lean.layers))
        start = layers[0].get_seq_length() if layers[0].is_initialized else 0
        like = h.new_empty((batch, self.kv_heads, 0, self.head_dim), dtype=torch.float64)
        capacity = -(-(start + n) // CAPACITY_BLOCK) * CAPACITY_BLOCK
        buffers = [layer.reserve(like, n, capacity) for layer in layers]
        cos, sin = (t.double() for t in position_embeddings)
        # the graph always takes a mask (None would be a second graph): all zeros lets every query see every key
        mask = h.new_zeros((1, 1, n, start + n), dtype=torch.float64) if mask is None else mask.double()
        rows = h.reshape(n, width)
        for t, dims in ((rows, (0,)), (cos, (1,)), (sin, (1,)), (mask, (2, 3))):
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(t, d)
        rows, inputs = self._graph(rows, cos, sin, mask, [k for k, _ in buffers], [v for _, v in buffers])
        for layer in layers:
            layer.advance(n)
        if outputs is not None:
            outputs.extend(x.view(batch, n, width) for x in inputs)
        return rows.view(batch, n, width)
