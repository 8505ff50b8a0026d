"""The engine on the embedded SmolLM2-135M target (30 layers, vocab 49152) with a noisy-copy draft:
greedy speculative decoding is token-identical to greedy autoregressive decoding for every method."""

import pytest
import torch
from engine_helpers import noisy_draft

from decoding.actions import Action
from decoding.sampling import Sampling
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from verifiers import METHODS

PROMPT = "Write a Python function that checks whether a number is prime."
NEW = 16


@pytest.fixture(scope="module")
def smol(smollm2_pair):
    tok = smollm2_pair.tokenizer
    enc = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True)
    ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    decoder = SpeculativeDecoder(smollm2_pair.target, noisy_draft(smollm2_pair.target, 0.5), smollm2_pair.vocab_size)
    ar = decoder.generate(ids, NEW, AUTOREGRESSIVE, sampling=Sampling(0.0))
    hf = smollm2_pair.target.generate(torch.tensor([ids]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
    assert ar.tokens == hf[0, len(ids):].tolist()
    return decoder, ids, ar.tokens


def _check(smol, method, action):
    decoder, ids, expect = smol
    res = decoder.generate(ids, NEW, method, action, Sampling(0.0))
    assert res.tokens == expect, method
    assert res.stats.steps < NEW  # some drafts were accepted


@pytest.mark.integration
def test_greedy_traversal_smollm2(smol):
    _check(smol, "traversal", Action(2, 1, 2))


@pytest.mark.integration
@pytest.mark.parametrize("method", sorted(set(METHODS) - {"traversal"}))
def test_greedy_every_method_smollm2(smol, method):
    _check(smol, method, Action(1, 1, 2) if method in ("naive", "bv") else Action(2, 1, 2))
