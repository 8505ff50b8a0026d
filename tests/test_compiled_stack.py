"""models/compiled_stack.py: a decoder stack on GGUF-style blocks as one compiled graph (``model.compile``).

A tiny Llama whose layers compute from Q8_0 blocks of their weights on the 4-bit kernel (`models.int4.Int4Linear`),
the form of the embedded target's layers. The compiled graph is another function than the eager stack (fused loops
round in another order), so what must hold is what the engine relies on: a tree pass equals one-token steps bit for
bit, the engine's KV cache operations (prune after verification, crop) keep it consistent, and greedy speculative
decoding emits the autoregressive tokens, which transformers' ``generate`` (a plain ``DynamicCache``) emits too.
"""

from __future__ import annotations

import copy

import pytest
import torch
from engine_helpers import chain_together_and_apart, noisy_draft
from tiny_models import tiny_lm

from decoding.actions import Action
from decoding.sampling import Sampling
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from models import compiled_stack
from models.int4 import Int4Linear, quantize_q8_0
from models.lean_layers import use_lean_forward
from models.placement import Placement

pytestmark = pytest.mark.skipif(not compiled_stack.compiler_available(), reason="no C++ compiler for inductor")

PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def blocks_lm(seed: int = 0) -> torch.nn.Module:
    """A 2-layer tiny Llama (hidden 64) whose layers' linear maps and head compute from Q8_0 blocks of their weights
    (a float32 head's matmul would not be batch invariant: the graph would not be the only thing tested)."""
    model = tiny_lm(2, seed, hidden=64)
    model.lm_head = Int4Linear(quantize_q8_0(model.lm_head.weight.detach()), model.lm_head.weight)
    for layer in model.model.layers:
        for part, names in PROJECTIONS.items():
            for name in names:
                linear = getattr(getattr(layer, part), name)
                setattr(getattr(layer, part), name, Int4Linear(quantize_q8_0(linear.weight.detach()), linear.weight))
    return model.eval()


@pytest.fixture(scope="module")
def pair():
    """(compiled target, eager target with the same weights, a dense noisy draft)."""
    compiled = blocks_lm()
    eager = copy.deepcopy(compiled)
    assert use_lean_forward(compiled, compile=True) and compiled.model._lean_compiled
    assert use_lean_forward(eager) and not eager.model._lean_compiled
    return compiled, eager, noisy_draft(tiny_lm(2, 0, hidden=64), 0.3)


PROMPT = [5, 17, 3, 40, 22, 9, 31, 12, 7, 50, 44, 1, 28, 36, 19, 60, 11, 2, 33, 25]


@torch.inference_mode()
def test_a_tree_pass_equals_one_token_steps_bit_for_bit(pair):
    together, apart = chain_together_and_apart(pair[0], PROMPT[:14], PROMPT[14:])
    assert torch.equal(together, apart), (together - apart).abs().max()


def test_the_compiled_stack_is_the_eager_one_up_to_rounding(pair):
    compiled, eager, _ = pair
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        a, b = compiled(ids).logits, eager(ids).logits
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, atol=0.05, rtol=0.0)  # bfloat16 inputs of every product: rounding moves bits


@pytest.mark.parametrize("method,action", [("specinfer", Action(2, 1, 2)), ("traversal", Action(3, 0, 2))])
def test_greedy_identity_on_the_compiled_target(pair, method, action):
    target, _, draft = pair
    decoder = SpeculativeDecoder(target, draft)
    ar = decoder.generate(PROMPT, 24, AUTOREGRESSIVE, sampling=Sampling(0.0))
    res = decoder.generate(PROMPT, 24, method, action, Sampling(0.0))
    assert res.tokens == ar.tokens
    assert res.stats.steps < 24  # drafts were accepted: the pruned and cropped cache was read
    hf = target.generate(torch.tensor([PROMPT]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                         eos_token_id=None, pad_token_id=0)  # transformers' own DynamicCache, its layers replaced
    assert hf[0, len(PROMPT):].tolist() == ar.tokens


def test_the_pipeline_compiles_the_library_does_not_and_only_blocks_compile():
    from pipeline.config import load_config

    assert load_config(None).model.placement().compile is True  # every stage: one function (params.yaml)
    assert Placement().compile is False  # a library caller's default: the eager stack
    dense = tiny_lm(2, 0, hidden=64)
    assert use_lean_forward(dense, compile=True) is not None and not getattr(dense.model, "_lean_compiled", False)


def test_without_a_compiler_the_stack_runs_eager_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(compiled_stack, "compiler_available", lambda: False)
    model = blocks_lm()
    assert use_lean_forward(model, compile=True) and not model.model._lean_compiled
    assert "no C++ compiler" in capsys.readouterr().err
