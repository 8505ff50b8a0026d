"""`models.gguf_blocks` reads Q8_0 blocks as stored, and `models.int4.Int4Linear` computes them exactly as two 4-bit
halves: ``bf16(d) * q`` with bfloat16 activations, each row independent of the others in its batch. `Q8Linear` puts a
float ``nn.Linear`` on Q8_0 blocks of its own weight at inference and stays the float product for training."""

import numpy as np
import torch
from torch import nn

from models.gguf_blocks import BLOCK, from_raw
from models.int4 import Int4Linear, Q8Linear, quantize_q8_0


def _q8_raw(n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random Q8_0 rows as GGUF bytes ``[n, k / 32 * 34]``, with their scales (float16) and signed codes."""
    rng = np.random.default_rng(seed)
    d = (rng.uniform(1e-4, 3e-3, (n, k // BLOCK))).astype(np.float16)
    q = rng.integers(-128, 128, (n, k // BLOCK, BLOCK)).astype(np.int8)
    raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=-1).reshape(n, -1)
    return raw, d, q


def test_q8_0_blocks_dequantize_to_d_times_q():
    raw, d, q = _q8_raw(8, 64)
    w = from_raw("Q8_0", raw, 64)
    assert w.fmt == "Q8_0" and w.shape == (8, 64) and w.codes.dtype == np.uint8
    ref = (d.astype(np.float32)[..., None] * q.astype(np.float32)).reshape(8, 64)
    assert np.array_equal(w.dequantize(), ref)


def test_q8_0_on_the_4bit_kernel_is_bf16_scales_times_codes():
    raw, d, q = _q8_raw(96, 128, seed=1)
    layer = Int4Linear(from_raw("Q8_0", raw, 128))
    # codes (two 4-bit halves per weight), then a bfloat16 scale and zero per block of the doubled width
    assert layer.copies == 2 and layer.bytes_read == 96 * 128 + (2 * 128 // BLOCK) * 96 * 2 * 2
    x = torch.randn(5, 128).to(torch.bfloat16).float()  # the kernel's activations are bfloat16
    d1 = torch.from_numpy(d.astype(np.float32)).to(torch.bfloat16).float()
    exact = (d1[..., None] * torch.from_numpy(q.astype(np.float32))).reshape(96, 128)
    got = layer(x)
    assert torch.allclose(got, x @ exact.T, rtol=2 ** -7, atol=1e-4)  # the kernel rounds its output to bfloat16
    unsigned = (d1[..., None] * torch.from_numpy(q.astype(np.float32) + 128)).reshape(96, 128)
    assert not torch.allclose(got, x @ unsigned.T, rtol=2 ** -7, atol=1e-4)  # the check can fail
    rows = torch.cat([layer(x[i:i + 1]) for i in range(5)])
    assert torch.equal(got, rows)  # batch invariant, bit for bit


def test_q8_0_blocks_of_a_float_weight():
    torch.manual_seed(0)
    w = torch.randn(16, 96) * torch.logspace(-3, 0, 16)[:, None]  # rows of very different scales
    w[3, 32:64] = 0.0  # an all-zero block
    blocks = quantize_q8_0(w)
    d = torch.from_numpy(blocks.d)
    assert torch.equal(d, d.to(torch.bfloat16).float())  # scales the kernel keeps exactly
    assert d[3, 1] == 0 and np.all(blocks.codes[3, 32:64] == 128)
    err = (torch.from_numpy(blocks.dequantize()) - w).abs().reshape(16, 3, 32).amax(-1)
    assert torch.all(err <= 0.51 * d + 1e-12)  # half a step of each block's grid
    assert err.max() > 0  # 8 bits, not the weight itself


def test_q8_linear_is_the_blocks_at_inference_and_the_float_weight_in_training():
    torch.manual_seed(1)
    linear = nn.Linear(128, 64)
    layer = Q8Linear(linear)
    assert layer.weight is linear.weight and layer.bias is linear.bias  # the same parameters
    x = torch.randn(5, 128).to(torch.bfloat16).float()
    with torch.no_grad():
        got = layer(x)
        exact = x @ torch.from_numpy(quantize_q8_0(linear.weight).dequantize()).T + linear.bias
        assert torch.allclose(got, exact, rtol=2 ** -7, atol=1e-3)  # the kernel rounds its output to bfloat16
        assert not torch.equal(got, nn.functional.linear(x, linear.weight, linear.bias))  # not the float product
        assert torch.equal(got, torch.cat([layer(x[i:i + 1]) for i in range(5)]))  # rows independent, bit for bit
    y = layer(x)  # with gradients: the float product, and they reach the weight
    assert torch.equal(y, nn.functional.linear(x, linear.weight, linear.bias))
    y.sum().backward()
    assert linear.weight.grad is not None
    with torch.no_grad():
        linear.weight.mul_(2.0)  # an optimizer step: the blocks follow the new weight
        assert torch.allclose(layer(x) - linear.bias, 2 * (got - linear.bias), rtol=2 ** -6, atol=1e-3)
