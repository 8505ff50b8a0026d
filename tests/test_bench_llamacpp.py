"""benchmarks/bench_llamacpp.py: the llama.cpp anchor skips with one clear line where its environment is missing or
cannot start, and its tokens/s excludes the first token (the prefill) on both sides."""

from __future__ import annotations

import sys

import pytest

from benchmarks import bench_llamacpp


def test_tokens_per_second_counts_the_tokens_after_the_first():
    runs = [{"tokens": 11, "decode_seconds": 2.0}, {"tokens": 5, "decode_seconds": 2.0}]
    assert bench_llamacpp.tokens_per_second(runs) == pytest.approx((10 + 4) / 4.0)


def test_skips_without_an_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BRANCHPOINT_LLAMACPP_PYTHON", str(tmp_path / "absent" / "python"))
    out = tmp_path / "r.json"
    assert bench_llamacpp.main(["--out", str(out)]) == 0
    assert "skipped, no llama.cpp environment" in capsys.readouterr().out
    assert not out.exists()


def test_skips_when_llama_cpp_cannot_start(tmp_path, monkeypatch, capsys):
    # this interpreter has no llama_cpp: the worker exits at its import, and the benchmark says so
    monkeypatch.setenv("BRANCHPOINT_LLAMACPP_PYTHON", sys.executable)
    monkeypatch.setattr(bench_llamacpp, "ours_decoder", lambda threads: pytest.fail("decoded without llama.cpp"))
    out = tmp_path / "r.json"
    assert bench_llamacpp.main(["--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert "skipped, llama.cpp could not start" in line and "llama_cpp" in line
    assert not out.exists()
