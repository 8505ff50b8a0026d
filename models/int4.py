"""Linear layers of the quantized target backend (`models.quantized`): torch's 4-bit CPU kernel on GGUF blocks.

`Int4Linear` computes a block matrix with ``torch.ops.aten._weight_int4pack_mm_for_cpu``: 4-bit codes packed once
(`_convert_weight_to_int4pack_for_cpu`), one scale and one zero per block of 32 in the kernel's convention
``w = (q - 8) * scale + zero``. Scales, zeros and activations are bfloat16, the kernel's fast path on CPU (with
float32 activations the same kernel took 32x longer here); products accumulate in float32 and come back as float32.

- ``Q4_1`` (``w = d * q + m``, ``q`` in 0..15): the file's codes, ``scale = d``, ``zero = m + 8 d``.
- ``Q8_0`` (``w = d * (c - 128)``, ``c`` in 0..255; the LM head): each code splits into two 4-bit halves,
  ``c = 16 hi + lo``, so ``w = 16 d (hi - 8) + d (lo - 8) + 8 d``: the halves are one 4-bit matrix twice as wide,
  ``[hi | lo]`` with scales ``16 d`` and ``d`` and zeros ``0`` and ``8 d``, multiplied by the input repeated twice,
  ``[x | x]``. With ``d`` rounded to bfloat16 (``16 d`` and ``8 d`` then round the same way) this is exactly
  ``bf16(d) * q``: a finer head than the bfloat16 matrix it replaced, which rounded every weight (held-out
  perplexity and step times in docs/engine.md).

`Q8Linear` puts an ordinary ``nn.Linear`` (the EAGLE draft's fc and adapter, `models.eagle_draft.for_inference`) on the
same kernel at inference: Q8_0 blocks of its own weight (`quantize_q8_0`), a quarter of float32's bytes. Training and
other devices or dtypes run the float weight.

A layer keeps the dense ``weight`` it replaces (read for shapes and ties, never in a product), and a row of the
output does not depend on the other rows of the batch (checked in tests/test_quantized_target.py), so a tree pass
and a plain step compute the same rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.fast_path import replace_linears, runs_float, weight_version
from models.gguf_blocks import BLOCK, QuantizedMatrix

ACTIVATIONS = torch.bfloat16


class Int4Linear(nn.Module):
    """A ``Q4_1`` or ``Q8_0`` `QuantizedMatrix` ``[N, K]`` as a linear layer (module docstring); ``weight``: the
    dense weight it stands for (kept for shapes and ties)."""

    def __init__(self, w: QuantizedMatrix, weight: torch.Tensor | None = None) -> None:
        super().__init__()
        self.blocks = w
        self.out_features, self.in_features = w.shape
        d = torch.from_numpy(w.d.T.copy()).to(ACTIVATIONS)  # [K / 32, N], the scales the kernel multiplies by
        if w.fmt == "Q4_1":
            codes = w.codes.astype(np.int32)
            scale_zero = torch.stack([d, torch.from_numpy((w.m + 8.0 * w.d).T.copy()).to(ACTIVATIONS)], dim=-1)
        elif w.fmt == "Q8_0":
            c = w.codes.astype(np.int32)
            codes = np.concatenate([c >> 4, c & 15], axis=1)  # [N, 2K]: [hi | lo]
            scale_zero = torch.cat([torch.stack([16 * d, torch.zeros_like(d)], dim=-1),
                                    torch.stack([d, 8 * d], dim=-1)])
        else:
            raise ValueError(f"Int4Linear computes Q4_1 or Q8_0 blocks, not {w.fmt}")
        self.copies = codes.shape[1] // self.in_features  # how many times a product reads its input
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes), 1),
                             persistent=False)
        self.register_buffer("scale_zero", scale_zero.contiguous(), persistent=False)  # [K' / 32, N, 2]
        self.weight = weight

    @classmethod
    def fused(cls, linears: list[Int4Linear]) -> Int4Linear:
        """One layer over the row-concatenation of ``linears``' blocks (fused Q/K/V, gate/up)."""
        return cls(QuantizedMatrix.stack([m.blocks for m in linears]))

    @property
    def bytes_read(self) -> int:
        """Bytes a product reads: 4-bit codes and bfloat16 scales and zeros."""
        return self.out_features * self.in_features * self.copies // 2 + self.scale_zero.numel() * 2

    def product(self, rows: torch.Tensor) -> torch.Tensor:
        """The kernel's product of ``rows`` ``[T, K]`` (any float dtype): ``[T, N]`` in bfloat16, as the kernel
        returns it (every bfloat16 value is a float32 and a float64 exactly, so a caller casts once, to what it needs)."""
        rows = rows.to(ACTIVATIONS)
        if self.copies > 1:
            rows = rows.repeat(1, self.copies)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, BLOCK, self.scale_zero)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.product(x.reshape(-1, self.in_features))
        return y.float().reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.blocks.fmt}, " \
               "bfloat16 activations"


def quantize_q8_0(weight: torch.Tensor) -> QuantizedMatrix:
    """Q8_0 blocks of a float weight ``[N, K]``: per block of 32 along K, ``d`` = the block's largest magnitude / 127,
    rounded to bfloat16 (the precision `Int4Linear` keeps, so the product is exactly ``d * q``), and
    ``q = round(w / d)`` in -127..127 (an all-zero block: ``d = 0``, ``q = 0``)."""
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"input size {k} is not a multiple of the block size {BLOCK}")
    blocks = weight.detach().float().cpu().reshape(n, k // BLOCK, BLOCK)
    d = (blocks.abs().amax(-1) / 127).to(ACTIVATIONS).float()  # [N, K / 32]
    q = torch.where(d[..., None] > 0, torch.round(blocks / d.clamp_min(1e-30)[..., None]), 0.0).clamp(-127, 127)
    codes = (q + 128).to(torch.uint8).reshape(n, k).numpy()
    return QuantizedMatrix("Q8_0", codes, d.numpy(), np.zeros_like(d.numpy()))


class Q8Linear(nn.Module):
    """An ``nn.Linear`` (the same ``weight`` and ``bias`` parameters) that at inference on CPU float32 computes
    from Q8_0 blocks of its weight on the 4-bit kernel (`Int4Linear`), rebuilt when the weight changes in place;
    with gradients, or on another device or dtype, it is the plain float product."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._kernel: tuple[Int4Linear, int] | None = None  # (the blocks' layer, the weight version it was built at)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if runs_float(self, x):
            return nn.functional.linear(x, self.weight, self.bias)
        version = weight_version(self.weight)
        if self._kernel is None or self._kernel[1] != version:
            self._kernel = (Int4Linear(quantize_q8_0(self.weight)), version)
        y = self._kernel[0](x)
        return y if self.bias is None else y + self.bias.detach()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q8_0 blocks at inference"


def use_q8_linears(module: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` below ``module`` whose weight is CPU float32 with an input size in whole
    blocks of 32 by a `Q8Linear` (in place); returns how many."""
    return replace_linears(module, Q8Linear, lambda m: m.weight.device.type == "cpu"
                           and m.weight.dtype == torch.float32 and m.in_features % BLOCK == 0)
