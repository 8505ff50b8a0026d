"""models/lean_layers.py: the self-draft's shared layers without HF's module overhead give HF's hidden
states (Llama and Qwen2 with biases, prefill, cached steps, tree masks), fall back where they do not apply,
and never run on stale fused weights."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_VOCAB, tiny_lm
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from models.fast_path import can_pack, prepare_for_inference
from models.lean_layers import LeanLayers, supports
from models.self_draft import SelfDraft, SelfDraftConfig

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32), reason="needs oneDNN on CPU")


def qwen_like(cls, config_cls, seed=0):
    torch.manual_seed(seed)
    cfg = config_cls(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=8,
                     tie_word_embeddings=True)
    model = cls(cfg).eval()
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero: make them matter
        for p in model.parameters():
            if p.dim() == 1 and p.abs().sum() == 0:
                p.normal_(0, 0.5)
    return model


def draft_of(target, k=2):
    torch.manual_seed(1)
    draft = SelfDraft(target, SelfDraftConfig(layers=k, adapter_width=16, vocab_subset_size=0))
    with torch.no_grad():
        draft.adapter.down.weight.normal_(0, 0.1)
    prepare_for_inference(target)
    return prepare_for_inference(draft.eval())


def hidden_both(draft, ids, steps):
    """Hidden states of the prefill ``ids[:, :steps[0]]`` and then each cached chunk, HF path vs lean path."""
    out = {}
    for lean in (False, True):
        draft.lean = lean
        cache, hs, start = DynamicCache(), [], 0
        with torch.inference_mode():
            for end in steps:
                hs.append(draft.hidden_after_layers(ids[:, start:end], cache=cache))
                start = end
        out[lean] = (hs, cache)
    return out


@pytest.mark.parametrize("make", [lambda: tiny_lm(3, seed=0, hidden=32),
                                  lambda: qwen_like(Qwen2ForCausalLM, Qwen2Config)], ids=["llama", "qwen2-bias"])
def test_lean_matches_hf_prefill_and_cached_steps(make, one_thread):
    draft = draft_of(make())
    assert draft._lean is None
    ids = torch.randint(0, TINY_VOCAB, (1, 14))
    out = hidden_both(draft, ids, [9, 10, 12, 14])  # prefill 9, then 1, 2, 2 cached tokens
    assert draft._lean is not None and draft._lean.ok
    for a, b in zip(out[False][0], out[True][0], strict=True):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    for la, lb in zip(out[False][1].layers, out[True][1].layers, strict=True):  # same cache contents
        assert torch.allclose(la.keys, lb.keys, atol=1e-5) and torch.allclose(la.values, lb.values, atol=1e-5)


def test_lean_matches_hf_under_a_tree_mask(one_thread):
    """Two sibling tokens after a prefill, each seeing the context and itself only (a 4D additive mask)."""
    draft = draft_of(tiny_lm(3, seed=2, hidden=32))
    ids = torch.randint(0, TINY_VOCAB, (1, 8))
    blocked = torch.finfo(torch.float32).min
    mask = torch.zeros(1, 1, 2, 8)
    mask[0, 0, 0, 7], mask[0, 0, 1, 6] = blocked, blocked  # sibling 6 does not see 7, nor 7 see 6
    hs = {}
    for lean in (False, True):
        draft.lean = lean
        cache = DynamicCache()
        with torch.inference_mode():
            draft.hidden_after_layers(ids[:, :6], cache=cache)
            hs[lean] = draft.hidden_after_layers(ids[:, 6:], attention_mask=mask,
                                                 position_ids=torch.tensor([[6, 6]]), cache=cache)
    assert torch.allclose(hs[False], hs[True], atol=1e-5)
    # and the siblings really are independent: each equals its own single-token step
    cache = DynamicCache()
    with torch.inference_mode():
        draft.hidden_after_layers(ids[:, :6], cache=cache)
        alone = draft.hidden_after_layers(ids[:, 7:8], position_ids=torch.tensor([[6]]), cache=cache)
    assert torch.allclose(hs[True][:, 1], alone[:, 0], atol=1e-5)


def test_fallbacks_grad_and_unsupported_layers(one_thread):
    draft = draft_of(tiny_lm(2, seed=3, hidden=32))
    h = torch.zeros(1, 1, 32)
    with torch.no_grad():
        assert draft._lean_layers(h) is not None
    with torch.enable_grad():
        assert draft._lean_layers(h) is None  # training runs the HF layers (autograd through them)
    with torch.no_grad():
        assert draft._lean_layers(h.double()) is None
        draft.lean = False
        assert draft._lean_layers(h) is None
    qwen3 = qwen_like(Qwen3ForCausalLM, Qwen3Config)  # q/k norms: not the form LeanLayers computes
    assert not supports(qwen3.model.layers[0]) and not LeanLayers(qwen3.model.layers).ok


def test_in_place_weight_change_repacks(one_thread):
    target = tiny_lm(2, seed=4, hidden=32)
    draft = draft_of(target)
    ids = torch.randint(0, TINY_VOCAB, (1, 5))
    with torch.no_grad():
        before = draft.hidden_after_layers(ids, use_cache=False)
        target.model.layers[0].mlp.up_proj.weight.mul_(3.0)  # an in-place update (an optimizer step)
        after_lean = draft.hidden_after_layers(ids, use_cache=False)
        draft.lean = False
        after_hf = draft.hidden_after_layers(ids, use_cache=False)
    assert not torch.allclose(before, after_hf, atol=1e-3)
    assert torch.allclose(after_lean, after_hf, atol=1e-5)
