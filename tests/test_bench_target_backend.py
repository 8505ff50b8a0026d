"""benchmarks/bench_target_backend.py: our ms per decode step leaves the prompt's prefill out, as llama.cpp's side
does (its first token comes with the prefill; `llama_ms` divides the rest by the tokens after it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import bench_target_backend
from engine.stats import DecodeStats


class _Decoder:
    """A decoder whose every decode took 1.0 s in all, 0.4 s of it the prefill, over 6 steps."""

    def generate(self, ids, tokens, *args, **kwargs):
        return SimpleNamespace(stats=DecodeStats("autoregressive", steps=6, time_prefill=0.4, time_total=1.0))


class _Llama:
    def decode(self, ids, tokens, mode, seed):
        return {"tokens": 7, "prefill_seconds": 0.4, "decode_seconds": 0.6}


def test_a_decode_step_excludes_the_prefill_on_both_sides():
    ours = bench_target_backend.step_ms(_Decoder(), [[1, 2, 3]] * 3, 7, "specinfer", None)
    theirs = bench_target_backend.llama_ms(_Llama(), [[1, 2, 3]] * 3, 7)
    assert ours == pytest.approx(100.0)  # (1.0 - 0.4) s / 6 steps; with the prefill it would read 166.7
    assert theirs == pytest.approx(ours)


def test_llama_cpp_perplexity_scores_the_texts_as_ours_does():
    """The llama.cpp worker's teacher-forced NLL (numpy, in its own environment) is our side's `perplexity` formula:
    the same logits give the same number; a shifted target (each token scored at its own position) would not."""
    import math

    import torch

    from benchmarks.llamacpp_worker import sequence_nll

    gen = torch.Generator().manual_seed(0)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    logits = 30 * torch.randn(len(ids), 11, generator=gen, dtype=torch.float64)  # large: the max shift matters

    class _Model(torch.nn.Module):
        def forward(self, x):
            return SimpleNamespace(logits=logits[None, : x.shape[1]])

    ours = bench_target_backend.perplexity(_Model(), [ids])
    theirs = math.exp(sequence_nll(logits.numpy(), ids) / (len(ids) - 1))
    assert theirs == pytest.approx(ours, rel=1e-12)
    shifted = math.exp(sequence_nll(logits[1:].numpy(), ids[1:] + [0]) / (len(ids) - 1))
    assert shifted != pytest.approx(ours, rel=1e-3)
