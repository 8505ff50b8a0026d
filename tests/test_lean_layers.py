"""models/lean_layers.py: the self-draft's shared layers and the target's decoder stack (`use_lean_forward`)
without HF's module overhead give HF's hidden states (Llama and Qwen2 with biases, prefill, cached steps, tree
masks), fall back where they do not apply, never run on stale fused weights, and score a tree pass's rows exactly
as one-token steps (float64 attention)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import chain_together_and_apart
from tiny_models import TINY_VOCAB, tiny_lm
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from models.fast_path import can_pack, prepare_for_inference
from models.lean_layers import LeanLayers, supports, use_lean_forward
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
        assert lb.keys.dtype == lb.values.dtype == torch.float64  # the lean path attends in float64
        assert torch.allclose(la.keys, lb.keys.float(), atol=1e-5)
        assert torch.allclose(la.values, lb.values.float(), atol=1e-5)


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


def lean_target(seed=5):
    """A tiny target whose decoder stack runs through `use_lean_forward`, and the same weights through HF's."""
    plain = tiny_lm(3, seed=seed, hidden=32)
    lean = prepare_for_inference(tiny_lm(3, seed=seed, hidden=32))
    assert use_lean_forward(lean) and not use_lean_forward(lean)  # installed once
    return lean, plain


def test_lean_forward_matches_hf_with_cache_and_hidden_states(one_thread):
    lean, plain = lean_target()
    ids = torch.randint(0, TINY_VOCAB, (1, 9))
    with torch.inference_mode():
        outs = []
        for model in (plain, lean):
            cache = DynamicCache()
            first = model(input_ids=ids[:, :6], past_key_values=cache, use_cache=True)
            step = model(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True, output_hidden_states=True)
            outs.append((first, step, cache))
    (f0, s0, c0), (f1, s1, c1) = outs
    assert torch.allclose(f0.logits, f1.logits, atol=1e-5) and torch.allclose(s0.logits, s1.logits, atol=1e-5)
    assert len(s1.hidden_states) == len(s0.hidden_states) == 4  # embeddings, 2 layer outputs, the final norm
    for a, b in zip(s0.hidden_states, s1.hidden_states, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert c1.get_seq_length() == c0.get_seq_length() == 9


def test_lean_forward_falls_back_to_hf(one_thread):
    lean, plain = lean_target()
    ids = torch.randint(0, TINY_VOCAB, (1, 5))
    with torch.enable_grad():  # autograd runs HF's layers: gradients reach the weights
        lean(input_ids=ids, use_cache=False).logits.sum().backward()
    assert lean.model.layers[0].mlp.up_proj.weight.grad is not None
    with torch.no_grad():  # inputs_embeds is HF's business too
        embeds = lean.model.embed_tokens(ids)
        a, b = lean(inputs_embeds=embeds, use_cache=False).logits, plain(inputs_embeds=embeds, use_cache=False).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_a_tree_pass_scores_its_rows_exactly_as_one_token_steps(one_thread):
    """The engine's batch invariance: 5 chained tokens in one masked pass equal 5 one-token steps bit for bit
    (float32 attention reduces over a different number of keys and misses this in the last bits)."""
    lean, _ = lean_target(seed=6)
    ids = torch.randint(0, TINY_VOCAB, (12,)).tolist()
    context, chain = ids[:7], ids[7:]
    with torch.inference_mode():
        together, apart = chain_together_and_apart(lean, context, chain)
    assert torch.equal(together, apart)


def test_fast_norm_is_the_modules_function_bit_for_bit_or_the_module_itself():
    from torch import nn

    from models.lean_layers import fast_norm

    model = tiny_lm(2, seed=4)
    norm = model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    fast = fast_norm(norm)
    assert not isinstance(fast, nn.Module)  # the fused call replaced HF's module
    x = torch.randn(2, 7, norm.weight.shape[0])
    with torch.no_grad():
        assert torch.equal(fast(x), norm(x))
        norm.weight.mul_(2.0)  # an in-place update of the module's weight reaches the fused call
        assert torch.equal(fast(x), norm(x))

    class OnePlus(nn.Module):  # Gemma's form: same attributes, another function
        def __init__(self, w):
            super().__init__()
            self.weight, self.variance_epsilon = nn.Parameter(w.clone()), 1e-6

        def forward(self, h):
            return (1 + self.weight) * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    other = OnePlus(norm.weight.detach())
    assert fast_norm(other) is other
    layer_norm = nn.LayerNorm(8)  # no variance_epsilon: not an RMSNorm
    assert fast_norm(layer_norm) is layer_norm


def test_rope_of_takes_the_half_turn_only_where_it_equals_the_architectures_rotary():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from models.lean_layers import _half_turn, rope_of

    assert rope_of(apply_rotary_pos_emb, 8) is _half_turn  # Llama's rotate_half form, bit for bit

    def interleaved(q, k, cos, sin):  # GPT-J's pairs (x0, x1), (x2, x3), ...: another function
        def turn(x):
            pairs = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
            return x * cos.unsqueeze(1) + pairs * sin.unsqueeze(1)
        return turn(q), turn(k)

    rope = rope_of(interleaved, 8)
    assert rope is not _half_turn
    gen = torch.Generator().manual_seed(1)
    qk = torch.randn(1, 5, 2, 8, generator=gen, dtype=torch.float64)
    cos, sin = torch.randn(2, 1, 2, 8, generator=gen, dtype=torch.float64)
    q, k = rope(cos, sin)(qk, 3)
    want_q, want_k = interleaved(qk[:, :3], qk[:, 3:], cos, sin)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
