"""benchmarks/gpu_smoke.py (``make gpu-smoke``) without running the pipeline: where its JSON goes, its refusal
without a GPU, the tree-pass ratios it reads from a latency profile, and the HF draft folder it makes."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_smoke


def test_out_file_names_the_cpu_twin():
    assert gpu_smoke.default_out("cuda").name == "gpu_smoke.json"
    assert gpu_smoke.default_out("cuda:1").name == "gpu_smoke.json"
    assert gpu_smoke.default_out("cpu").name == "gpu_smoke_cpu.json"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_stops_before_any_work():
    with pytest.raises(SystemExit, match="DEVICE=cpu"):
        gpu_smoke.check_device("cuda")


def test_tree_pass_ratios_divide_by_the_plain_step(tmp_path):
    from selector_helpers import toy_latency

    profile = toy_latency()  # t_p(c, n) = 10 + 2 n + c / 10 ms, contexts 16, 256, 1024, n = 1..16
    path = profile.save(tmp_path / "latency.json")
    ratios = gpu_smoke.tree_pass_ratios(path)
    assert set(ratios) == {"context_16", "context_1024"}
    for c, row in (("16", ratios["context_16"]), ("1024", ratios["context_1024"])):
        step = 10 + 2 + int(c) / 10
        assert row["plain_step_ms"] == pytest.approx(step)
        assert [row[str(n)] for n in range(1, 17)] == pytest.approx([(10 + 2 * n + int(c) / 10) / step
                                                                     for n in range(1, 17)])
    assert json.loads(path.read_text())["target_tokens"][0] == 1


def test_the_hf_draft_folder_is_the_targets_first_layers(tmp_path, monkeypatch):
    """Made from a tiny model standing in for the embedded one: same tokenizer, the first k layers' weights."""
    from tiny_models import save_tiny_model
    from transformers import AutoModelForCausalLM

    source = save_tiny_model(tmp_path / "source", 3, seed=0)
    monkeypatch.setattr("models.loading.resolve_model_folder", lambda spec, cache_dir: source)
    target, draft = gpu_smoke.make_hf_folders(tmp_path / "models", 2, tmp_path / "cache")
    t = AutoModelForCausalLM.from_pretrained(target)
    d = AutoModelForCausalLM.from_pretrained(draft)
    assert (t.config.num_hidden_layers, d.config.num_hidden_layers) == (3, 2)
    ts, ds = t.state_dict(), d.state_dict()
    assert all(torch.equal(ds[k], ts[k]) for k in ds)
    assert not any(".layers.2." in k for k in ds)
    assert (draft / "tokenizer.json").is_file() and not list((tmp_path / "models").glob("*.partial"))
    with pytest.raises(SystemExit, match="draft-layers"):
        gpu_smoke.make_hf_folders(tmp_path / "other", 3, tmp_path / "cache")
    with torch.no_grad():
        assert torch.isfinite(d(input_ids=torch.tensor([[5, 6, 7]])).logits).all()


def _tiny_source(tmp_path, monkeypatch):
    from tiny_models import save_tiny_model

    source = save_tiny_model(tmp_path / "source", 3, seed=0)
    monkeypatch.setattr("models.loading.resolve_model_folder", lambda spec, cache_dir: source)
    return source


def test_the_self_draft_run_defaults_to_a_tiny_bf16_target_on_cpu(tmp_path, monkeypatch):
    """The CPU twin's self-draft run: the tiny target in bfloat16 (HF's decoder layers, not the lean path), the
    preset's self-draft (no model.draft flag), its shape for a 2-layer target; on CUDA the SmolLM2 target in DTYPE."""
    from transformers import AutoModelForCausalLM

    _tiny_source(tmp_path, monkeypatch)
    plans = gpu_smoke.run_plans(gpu_smoke.parse_args(["--device", "cpu", "--dtype", "float32", "--draft-layers", "2"]),
                                tmp_path / "m",
                                tmp_path / "cache")
    assert list(plans) == ["hf_draft", "self_draft"]
    pair, flags = plans["self_draft"]
    sets = dict(flags[i + 1].split("=", 1) for i in range(0, len(flags), 2))
    assert pair["dtype"] == sets["model.dtype"] == "bfloat16" and "model.draft" not in sets
    assert sets["model.target"] == f"hf:{tmp_path / 'm' / 'tiny'}" and sets["train_draft.layers"] == "1"
    assert dict(f.split("=", 1) for f in plans["hf_draft"][1][1::2])["model.dtype"] == "float32"
    tiny = AutoModelForCausalLM.from_pretrained(tmp_path / "m" / "tiny")
    assert tiny.config.num_hidden_layers == 2 and (tmp_path / "m" / "tiny" / "tokenizer.json").is_file()
    args = gpu_smoke.parse_args(["--device", "cuda", "--runs", "self_draft", "--draft-layers", "2"])
    pair, flags = gpu_smoke.run_plans(args, tmp_path / "m", tmp_path / "cache")["self_draft"]
    assert pair["dtype"] == "bfloat16" and f"model.target=hf:{tmp_path / 'm' / 'target'}" in flags
    with pytest.raises(SystemExit, match="unknown run"):
        gpu_smoke.run_plans(gpu_smoke.parse_args(["--runs", "self"]), tmp_path / "m", tmp_path / "cache")


def test_ar_vs_generate_reports_both_loops(tmp_path, monkeypatch, one_thread):
    from benchmarks.smoke_ar import ar_vs_generate

    source = _tiny_source(tmp_path, monkeypatch)
    r = ar_vs_generate(source, torch.device("cpu"), torch.float32, tokens=4, rounds=1)
    assert r["ours_tokens_per_second"] > 0 and r["generate_tokens_per_second"] > 0
    assert r["engine_host_overhead_ms_per_step"] == pytest.approx(r["ours_ms_per_token"] - r["generate_ms_per_token"])
    assert isinstance(r["same_tokens"], bool)
