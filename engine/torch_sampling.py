"""Probability rows from model logits, on the model's device (the torch side of `decoding.sampling`).

`transform_logits` applies the sampling transform (temperature, then top-p) exactly as its numpy twin
`decoding.sampling.transform_logits_np`; `to_numpy_rows` hands the rows to the verifiers as float64;
`prob_rows` does both, cut to the pair's common vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from decoding.sampling import Sampling


def transform_logits(logits: torch.Tensor, sampling: Sampling, vocab_size: int | None = None) -> torch.Tensor:
    """Probabilities ``[..., V]`` (float32 or wider) from raw logits ``[..., V']``.

    ``vocab_size`` cuts the last axis to the common vocabulary first (models may pad their heads)."""
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    logits = logits.float()
    if sampling.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    # x / 1.0 == x exactly: at T = 1 the division (a copy of every row) is skipped
    probs = torch.softmax(logits if sampling.temperature == 1 else logits / sampling.temperature, dim=-1)  # [..., V]
    if sampling.top_p < 1.0:
        # stable sort: equal probabilities keep token-id order
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # [..., V] mass of better-ranked tokens
        drop_sorted = mass_before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def to_numpy_rows(probs: torch.Tensor) -> np.ndarray:
    """Probability rows as float64 numpy, renormalized in float64 (verifiers check sums to 1e-5).

    The rows leave the device in their own dtype (float32: half the bytes of float64) and are widened on the host,
    the same values as widening on the device; the renormalization divides the fresh copy in place."""
    probs = probs.detach()
    if probs.dtype not in (torch.float32, torch.float64):
        probs = probs.float()
    rows = probs.cpu().numpy().astype(np.float64)  # a copy: the caller's tensor is never written
    rows /= rows.sum(axis=-1, keepdims=True)
    return rows


def prob_rows(logits: torch.Tensor, sampling: Sampling, vocab_size: int) -> np.ndarray:
    """Transformed probability rows ``[..., V]`` as float64 numpy (what every verifier consumes)."""
    return to_numpy_rows(transform_logits(logits, sampling, vocab_size))
