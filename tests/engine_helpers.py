"""Model pairs for the engine tests: untied heads (a tiny random LM with tied embeddings greedily repeats
its last token, which would make greedy tests trivial) and drafts that are noisy copies of the target
(``noisy_draft``, defined with the engine benchmark, which uses the same stand-in)."""

from __future__ import annotations

import copy

import torch
from tiny_models import tiny_config
from transformers import LlamaForCausalLM

from benchmarks.bench_engine import noisy_draft  # the one stand-in draft (re-exported for the tests)

VOCAB = 64

__all__ = ["VOCAB", "noisy_draft", "untied_pair"]


def untied_pair(seed: int = 0, noise: float = 0.6, head_scale: float = 3.0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): a 3-layer random Llama with an untied head, and a draft that is a noisy copy of
    it (same architecture) so that drafts are accepted often but not always."""
    torch.manual_seed(seed)
    config = tiny_config(3, hidden=48)
    config.tie_word_embeddings = False
    target = LlamaForCausalLM(config)
    with torch.no_grad():
        target.lm_head.weight.mul_(head_scale)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return target.eval(), draft.eval()


def generate(target, draft, prompt, max_new_tokens, **options):
    """`SpeculativeDecoder.generate` of a fresh decoder over the target's whole head (the tests' shorthand)."""
    from engine.decoder import SpeculativeDecoder
    return SpeculativeDecoder(target, draft).generate(prompt, max_new_tokens, **options)
