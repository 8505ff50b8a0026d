"""The quantized blocks of a GGUF file, read as they are stored (`read_blocks`), and their exact dequantization.

The backend reads two of ggml's layouts, both in blocks of 32 along a row's input axis:
- ``Q4_1`` (the embedded target's linear layers): 20 bytes per block, ``d`` (float16), ``m`` (float16), then 16
  bytes of 4-bit codes ``q``: byte ``j`` holds element ``j`` in its low nibble and element ``j + 16`` in its high
  nibble. ``w = d * q + m``.
- ``Q8_0`` (its tied embedding / LM head): 34 bytes per block, ``d`` (float16), then 32 signed bytes ``q``.
  ``w = d * q``. Stored here as unsigned codes ``c = q + 128`` with ``m = 0``, so ``w = d * (c - 128)``.

`QuantizedMatrix` keeps the codes unpacked (one uint8 per element, ``[N, K]``) with per-block ``d`` and ``m``
(``[N, K / 32]`` float32): the form `models.int4` packs for torch's 4-bit CPU kernel. Its
`dequantize` is the float32 matrix transformers builds from the same file (``gguf``'s own dequantization
computes ``d * q + m`` or ``d * q`` in float32 from the float16 scales as well), which `models.quantized` checks
weight by weight before using any block.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK = 32
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
FORMATS = tuple(BLOCK_BYTES)
ZERO_CODE = {"Q4_1": 0, "Q8_0": 128}  # the code that stands for q = 0


class GGUFBlockError(ValueError):
    """A GGUF tensor cannot be read as blocks (unknown format, wrong size)."""


@dataclass(frozen=True)
class QuantizedMatrix:
    """A weight ``[N, K]`` as integer codes and per-block affine parameters: ``w = d * (c - zero) + m`` blockwise,
    ``zero`` 0 for Q4_1 and 128 for Q8_0 (module docstring)."""

    fmt: str  # "Q4_1" or "Q8_0"
    codes: np.ndarray  # [N, K] uint8: 0..15 (Q4_1), 0..255 (Q8_0)
    d: np.ndarray  # [N, K / 32] float32 scale
    m: np.ndarray  # [N, K / 32] float32 offset

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """The float32 weight ``[N, K]``."""
        n, k = self.codes.shape
        q = self.codes.reshape(n, k // BLOCK, BLOCK).astype(np.float32) - ZERO_CODE[self.fmt]
        return (q * self.d[:, :, None] + self.m[:, :, None]).reshape(n, k)

    def rows(self, order: np.ndarray) -> QuantizedMatrix:
        """The same matrix with its output rows reordered (blocks run along K, so rows move whole)."""
        return QuantizedMatrix(self.fmt, self.codes[order], self.d[order], self.m[order])

    @staticmethod
    def stack(parts: list[QuantizedMatrix]) -> QuantizedMatrix:
        """Row-concatenation of matrices of one input size (fused Q/K/V, gate/up)."""
        if len({p.shape[1] for p in parts}) != 1:
            raise GGUFBlockError(f"cannot fuse {[p.shape for p in parts]}: one input size needed")
        return QuantizedMatrix(parts[0].fmt, np.concatenate([p.codes for p in parts]),
                               np.concatenate([p.d for p in parts]), np.concatenate([p.m for p in parts]))


def from_raw(fmt: str, raw: np.ndarray, k: int) -> QuantizedMatrix:
    """A matrix from its GGUF bytes ``raw`` ``[N, K / 32 * block bytes]`` uint8."""
    if fmt not in FORMATS:
        raise GGUFBlockError(f"block format {fmt} is not supported (supported: {', '.join(FORMATS)})")
    if k % BLOCK:
        raise GGUFBlockError(f"input size {k} is not a multiple of the block size {BLOCK}")
    size = BLOCK_BYTES[fmt]
    n = raw.shape[0]
    if raw.shape[1] != k // BLOCK * size:
        raise GGUFBlockError(f"{fmt} rows of {raw.shape[1]} bytes do not hold {k} elements")
    blocks = np.ascontiguousarray(raw).reshape(n, k // BLOCK, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if fmt == "Q8_0":
        codes = (blocks[..., 2:].view(np.int8).astype(np.int16) + ZERO_CODE[fmt]).astype(np.uint8)
        return QuantizedMatrix(fmt, codes.reshape(n, k), d, np.zeros_like(d))
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # elements 0..15, then 16..31
    return QuantizedMatrix(fmt, codes.reshape(n, k), d, m)


def read_blocks(path: str | Path) -> dict[str, QuantizedMatrix]:
    """Every Q4_1 and Q8_0 2-D tensor of a GGUF file by its GGUF name (``blk.0.attn_q.weight``,
    ``token_embd.weight``, ...)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        fmt = t.tensor_type.name
        if fmt in FORMATS and len(t.shape) == 2:
            out[t.name] = from_raw(fmt, np.asarray(t.data), int(t.shape[0]))
    return out


def architecture(path: str | Path) -> dict[str, int | str]:
    """The few header fields the row order of Q and K depends on (head counts)."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(name):
        f = reader.fields.get(name)
        if f is None:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types and f.types[0] == gguf.GGUFValueType.STRING else int(value[0])

    arch = field("general.architecture")
    return {"architecture": arch, "heads": field(f"{arch}.attention.head_count"),
            "kv_heads": field(f"{arch}.attention.head_count_kv")}
