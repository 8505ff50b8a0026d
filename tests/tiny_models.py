"""Tiny random-weight LMs and a tokenizer for unit tests.

Models are Llama-architecture `LlamaForCausalLM`s built from a config (no download) over one
vocabulary, so every code path that runs on a real pair (tree attention, KV caches, sampling) runs here
in milliseconds. The weights are random: distributions are arbitrary but valid, which is all that
losslessness tests need.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TINY_VOCAB = 64


def tiny_config(num_layers: int, hidden: int = 32, vocab: int = TINY_VOCAB) -> LlamaConfig:
    """A small Llama config; `vocab` rows in the embedding (may exceed a tokenizer's length)."""
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def tiny_lm(num_layers: int, seed: int, hidden: int = 32, vocab: int = TINY_VOCAB) -> LlamaForCausalLM:
    """A random-weight causal LM, deterministic in `seed`, in eval mode, float32, `sdpa` attention."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(num_layers, hidden, vocab))
    # Random init gives near-uniform logits; scale the head so distributions have real structure.
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model.eval()


def tiny_tokenizer(vocab: int = TINY_VOCAB, rename: dict[int, str] | None = None):
    """A whitespace word-level tokenizer with ``vocab`` tokens ``<pad> <s> </s> w3 w4 ...``.

    ``rename`` changes the text of some ids, to build a deliberately mismatched tokenizer. A minimal
    chat template is set so chat formatting code paths run offline.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, vocab)]
    for i, text in (rename or {}).items():
        words[i] = text
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok.chat_template = (
        "{% for m in messages %}<s> {{ m['content'] }} </s> {% endfor %}{% if add_generation_prompt %}<s> {% endif %}"
    )
    return tok


def save_tiny_model(folder, num_layers: int, seed: int, tokenizer=None) -> str:
    """Save a tiny random LM and its tokenizer as an HF model folder; returns the folder path."""
    model = tiny_lm(num_layers, seed)
    model.save_pretrained(folder)
    (tokenizer or tiny_tokenizer()).save_pretrained(folder)
    return str(folder)
