"""Model pairs for the engine tests: untied heads (a tiny random LM with tied embeddings greedily repeats
its last token, which would make greedy tests trivial) and drafts that are noisy copies of the target."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaForCausalLM

from models.tiny import tiny_config

VOCAB = 64


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


def noisy_draft(target: torch.nn.Module, noise: float = 0.5, seed: int = 0) -> torch.nn.Module:
    """A copy of ``target`` whose last decoder layer's MLP weights carry Gaussian noise (``noise`` x each
    tensor's std): q close to p but not equal, so drafts are accepted often and rejected often. Early-
    exit drafts of SmolLM2 without an adapter overlap p by < 1%, too little to exercise acceptance."""
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.model.layers[-1].mlp.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=gen).to(p))
    return draft.eval()
