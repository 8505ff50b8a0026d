"""Model pairs for the engine tests: untied heads (a tiny random LM with tied embeddings greedily repeats
its last token, which would make greedy tests trivial) and drafts that are noisy copies of the target
(``noisy_draft``, defined with the engine benchmark, which uses the same stand-in)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from tiny_models import tiny_config
from transformers import LlamaForCausalLM

from benchmarks.bench_engine import noisy_draft  # the one stand-in draft (re-exported for the tests)

VOCAB = 64

__all__ = ["VOCAB", "chain_together_and_apart", "noisy_draft", "untied_pair"]


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


def chain_together_and_apart(model, context: list[int], chain: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ``chain`` after ``context``, ``(together, apart)`` ``[len(chain), V]``: scored in one causal masked
    pass, and one token at a time, each on a fresh prefill of ``context`` (the engine's batch invariance holds when
    they are equal). Runs in the caller's grad mode."""
    from engine.cache import KVState
    from engine.tree_pass import forward_nodes, prefill

    c, n = len(context), len(chain)
    kv = KVState(model)
    prefill(kv, context)
    allowed = np.concatenate([np.ones((n, c), bool), np.tril(np.ones((n, n), bool))], axis=1)
    together, _ = forward_nodes(kv, chain, list(range(c, c + n)), allowed)
    kv = KVState(model)
    prefill(kv, context)
    apart = torch.stack([forward_nodes(kv, [t], [c + i], np.ones((1, c + i + 1), bool))[0][0]
                         for i, t in enumerate(chain)])
    return together, apart
