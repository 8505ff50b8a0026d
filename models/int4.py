"""Linear layers of the quantized target backend (`models.quantized`): torch's 4-bit CPU kernel on GGUF blocks.

`Int4Linear` computes a ``Q4_1`` matrix (blocks of 32 along K, ``w = d * q + m``, ``q`` in 0..15) with
``torch.ops.aten._weight_int4pack_mm_for_cpu``: codes packed once (`_convert_weight_to_int4pack_for_cpu`), one
scale and one zero per block in its convention ``w = (q - 8) * scale + zero``, so ``scale = d`` and
``zero = m + 8 d``. The codes are the file's own; the scales and zeros (float16 in the file) and the activations
are bfloat16, the kernel's fast path on CPU (with float32 activations the same kernel took 32x longer here).
Products accumulate in float32 and come back as float32.

`BF16Linear` is the LM head: the tied Q8_0 embedding as a bfloat16 matrix (8-bit codes times a per-block scale
do not fit a 4-bit kernel; two exact 4-bit halves measured faster but moved perplexity 7x more, docs/engine.md).

Both keep the dense ``weight`` they replace (read for shapes and ties, never in a product), and a row of the output
does not depend on the other rows of the batch (checked in tests/test_quantized_target.py), so a tree pass and a
plain step compute the same rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.gguf_blocks import BLOCK, QuantizedMatrix

ACTIVATIONS = torch.bfloat16


class Int4Linear(nn.Module):
    """A ``Q4_1`` `QuantizedMatrix` ``[N, K]`` as a linear layer (module docstring); ``weight``: the dense weight it
    stands for (kept for shapes and ties)."""

    def __init__(self, w: QuantizedMatrix, weight: torch.Tensor | None = None) -> None:
        super().__init__()
        self.blocks = w
        self.out_features, self.in_features = w.shape
        codes = torch.from_numpy(w.codes.astype(np.int32))
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), persistent=False)
        scale_zero = np.stack([w.d.T, (w.m + 8.0 * w.d).T], axis=-1)  # [K / 32, N, 2]
        self.register_buffer("scale_zero", torch.from_numpy(np.ascontiguousarray(scale_zero)).to(ACTIVATIONS),
                             persistent=False)
        self.weight = weight

    @classmethod
    def fused(cls, linears: list[Int4Linear]) -> Int4Linear:
        """One layer over the row-concatenation of ``linears``' blocks (fused Q/K/V, gate/up)."""
        return cls(QuantizedMatrix.stack([m.blocks for m in linears]))

    @property
    def bytes_read(self) -> int:
        """Bytes a product reads: 4-bit codes and bfloat16 scales and zeros."""
        return self.out_features * self.in_features // 2 + self.scale_zero.numel() * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(ACTIVATIONS)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, BLOCK, self.scale_zero)
        return y.float().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q4_1, bfloat16 activations"


class BF16Linear(nn.Module):
    """A linear layer without bias whose products run in bfloat16 (the LM head of the quantized backend)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # the dense weight (tied to the input embedding), for shapes and ties
        self.register_buffer("weight_bf16", weight.detach().to(ACTIVATIONS), persistent=False)
        self.out_features, self.in_features = weight.shape

    @property
    def bytes_read(self) -> int:
        return self.weight_bf16.numel() * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(ACTIVATIONS), self.weight_bf16).float()
