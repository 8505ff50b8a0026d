"""``branchpoint decode`` end to end on a saved tiny pair (subprocess, as a user runs it)."""

import json
import subprocess
import sys

import pytest
from tiny_models import save_tiny_model


def branchpoint(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def params(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    t = save_tiny_model(root / "target", 2, seed=0)
    d = save_tiny_model(root / "draft", 1, seed=1)
    path = root / "params.yaml"
    path.write_text(f"model:\n  target: hf:{t}\n  draft: hf:{d}\n  device: cpu\n")
    return str(path)


def test_decode_prints_text_and_stats(params, tmp_path):
    out = tmp_path / "run.json"
    result = branchpoint("decode", "--params", params, "--prompt", "w5 w9 w33", "--method", "traversal",
                         "--action", "4,2,3", "--max-new-tokens", "12", "--temperature", "1.0", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "method traversal" in result.stdout and "block efficiency" in result.stdout
    assert "per-depth acceptance" in result.stdout and "time (s): draft" in result.stdout
    run = json.loads(out.read_text())
    assert run["action"] == "4,2,3" and 1 <= len(run["tokens"]) <= 12
    assert run["stats"]["steps"] >= 1 and run["stats"]["method"] == "traversal"


def test_decode_greedy_speculative_equals_autoregressive(params, tmp_path):
    from pipeline.cli import main

    runs = {}
    for method in ("autoregressive", "specinfer"):
        out = tmp_path / f"{method}.json"
        assert main(["decode", "--params", params, "--prompt", "w7 w8", "--method", method, "--set",
                     "sampling.temperature=0", "--max-new-tokens", "10", "--json", str(out)]) == 0
        runs[method] = json.loads(out.read_text())["tokens"]
    assert runs["autoregressive"] == runs["specinfer"]


def test_decode_with_lookup_first_stays_greedy_and_reports_lookup_steps(params, tmp_path):
    """``--lookup``: context lookup chains where the text repeats, the static action (or, with autoregressive, a plain
    step) elsewhere; greedy decoding still gives the target's own tokens."""
    from pipeline.cli import main

    prompt = "w5 w9 w33 w2 w5 w9 w33 w2 w5 w9"
    runs = {}
    for name, extra in (("ar", ["--method", "autoregressive"]),
                        ("lookup", ["--method", "autoregressive", "--lookup", "3", "--lookup-ngram", "1"]),
                        ("lookup_static", ["--method", "traversal", "--action", "1,1,0", "--lookup", "3"])):
        out = tmp_path / f"{name}.json"
        assert main(["decode", "--params", params, "--prompt", prompt, "--set", "sampling.temperature=0",
                     "--max-new-tokens", "12", "--json", str(out), *extra]) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["lookup"]["tokens"] == runs["ar"]["tokens"] == runs["lookup_static"]["tokens"]
    assert "LookupFirst" in runs["lookup"]["action"]
    for name in ("lookup", "lookup_static"):
        assert any(k.startswith("lookup:") for k in runs[name]["stats"]["classes"]), runs[name]["stats"]
