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
