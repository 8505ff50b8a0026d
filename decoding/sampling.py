"""The sampling transform: temperature, then top-p, applied identically to target rows p and draft rows q.

ALGORITHMS.md notation: ``p(.|c)`` and ``q(.|c)`` are the distributions AFTER this transform, so every
verifier is lossless with respect to the transformed target (what plain sampling with the same settings
draws).

- ``temperature = 0`` means greedy: the row becomes one-hot at the argmax (lowest token id on ties), so
  every verification method reduces to exact match.
- ``top_p < 1`` keeps the smallest set of most-probable tokens whose mass reaches ``top_p`` (the token
  that crosses the threshold is kept; ties broken by token id) and renormalizes.

This module is numpy only (it is imported by torch-free code: the feature schema, the ONNX runtime).
The torch version of the transform, run on the model's device, is `engine.torch_sampling.transform_logits`
(import it from there: this module never imports torch or the engine);
`transform_logits_np` is its float64 numpy twin and they agree to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import UserInputError


@dataclass(frozen=True)
class Sampling:
    """Sampling settings shared by target and draft."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = no truncation

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise UserInputError(f"Sampling.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise UserInputError(f"Sampling.top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_key(temperature: float, top_p: float) -> str:
    """The one text name of a sampling setting (``T=0.6,top_p=1``): metrics' keys and per-setting groups."""
    return f"T={temperature:g},top_p={top_p:g}"


def transform_logits_np(logits: np.ndarray, sampling: Sampling, vocab_size: int | None = None) -> np.ndarray:
    """Numpy (float64) twin of `engine.torch_sampling.transform_logits`."""
    x = np.asarray(logits, dtype=np.float64)
    if vocab_size is not None:
        x = x[..., :vocab_size]
    if sampling.greedy:
        out = np.zeros_like(x)
        np.put_along_axis(out, x.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    z = x / sampling.temperature
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    probs = z / z.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
        drop = np.zeros(probs.shape, dtype=bool)
        np.put_along_axis(drop, order, mass_before >= sampling.top_p, axis=-1)
        probs = np.where(drop, 0.0, probs)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def draw(rows: np.ndarray, rng: np.random.Generator, count: int = 1) -> np.ndarray:
    """``count`` i.i.d. tokens from each row of ``rows`` ``[R, V]`` (inverse CDF); returns ``[R, count]``.

    Tokens of probability 0 are never drawn (also when ``u * total`` rounds up to the total)."""
    rows = np.atleast_2d(rows)
    cdf = np.cumsum(rows, axis=-1)  # [R, V]
    total = cdf[:, -1:]
    u = rng.random((rows.shape[0], count)) * total  # [R, count]
    out = np.empty((rows.shape[0], count), dtype=np.int64)
    for r in range(rows.shape[0]):
        idx = np.searchsorted(cdf[r], u[r], side="right")
        over = idx >= rows.shape[1]
        if over.any():
            idx[over] = int(np.flatnonzero(rows[r] > 0)[-1])
        out[r] = idx
    return out
