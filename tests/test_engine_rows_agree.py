"""Batch invariance on the real pair: a draft row (q) and a target row (p) for a path are the same wherever
they are computed: in the collection's forest (16-28 rows per draft forward, one target pass over the
whole forest), in the decoder's drafting (a few rows per forward) and in a plain causal forward of the
path alone. Checked at every depth of the default union tree (max abs difference < 1e-4). The old
per-tensor int8 dynamic-quantized draft failed this by up to 0.4 (its activation scale spans the batch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.drafting as drafting
from data_collection.root_collector import RootCollector, UnionTrees
from decoding.sampling import Sampling
from decoding.tree import DraftTree
from engine.decoder import SpeculativeDecoder
from engine.torch_sampling import prob_rows
from engine.tree_pass import target_tree_pass
from models.fast_path import PackedLinear, prepare_for_inference
from models.self_draft import SelfDraft, SelfDraftConfig
from pipeline.config import load_config

TOL = 1e-4
SAMPLING = Sampling(1.0)


@pytest.fixture(scope="module")
def real_self_draft(smollm2_pair):
    """An untrained self-draft of the default shape with a random (non-identity) adapter and logit bias."""
    td = load_config(None).train_draft
    config = SelfDraftConfig(layers=td.layers, adapter_width=td.adapter_width,
                             vocab_subset_size=td.vocab_subset_size)
    draft = SelfDraft(smollm2_pair.target, config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        draft.adapter.down.weight.copy_(0.02 * torch.randn(draft.adapter.down.weight.shape, generator=gen))
        draft.head.bias.copy_(0.5 * torch.randn(draft.head.bias.shape, generator=gen))
    return prepare_for_inference(draft.eval())


def _path(parents: np.ndarray, node: int) -> list[int]:
    """Nodes from the root's child down to ``node``."""
    out = []
    while node > 0:
        out.append(node)
        node = int(parents[node])
    return out[::-1]


@torch.inference_mode()
def _causal_row(model, ids: list[int], vocab: int) -> np.ndarray:
    """The transformed row after ``ids`` from one plain causal forward without any cache."""
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
    return prob_rows(logits, SAMPLING, vocab)


def test_forest_decoder_and_causal_rows_agree(smollm2_pair, real_self_draft, monkeypatch):
    pair, draft = smollm2_pair, real_self_draft
    assert isinstance(draft.layers[0].mlp.down_proj, PackedLinear)  # the path under test is the packed one
    vocab, space = pair.vocab_size, load_config(None).actions.space()
    chat = [{"role": "user", "content": "Explain in two sentences why the sky is blue."}]
    seq = list(pair.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
    seq = [int(t) for t in seq] + pair.tokenizer.encode(" The sky looks blue because")
    r = len(seq) - 1  # the root: the last token

    # 1. the collection: one prefill per model, the forest drafted below the root, one target pass over it
    collector = RootCollector(pair.target, draft, vocab, space, ["traversal"], UnionTrees(4, 0))
    pre = collector._prefill(seq, [r], SAMPLING)
    forest = drafting.draft_layout(drafting.DraftRoot(pre["kv_d"].fork(r + 1), pre["q_root"][0]), collector.parents,
                                   collector.depths, drafting.DraftRule(SAMPLING, vocab), np.random.default_rng(3))
    tree_f = DraftTree(space.max_action, forest.tokens, collector.parents, collector.depths, collector.children,
                       forest.q_rows)
    with torch.inference_mode():
        p_forest = prob_rows(target_tree_pass(pre["kv_t"].fork(r), seq[r], tree_f)[0], SAMPLING, vocab)
    # a deepest node of the LAST union tree copy (its rows shared a forward with the other copies)
    deepest = int(np.flatnonzero(collector.depths == collector.depths.max())[-1])
    path = _path(collector.parents, deepest)  # path[d - 1] is the node at depth d
    tokens = [int(forest.tokens[n]) for n in path]
    assert len(path) == space.max_action.L1 + space.max_action.L2

    # 2. the decoder: its draft cache and drafting of the envelope action, every node at depth d drawn as
    #    the path's token at depth d (so every branch follows the same path)
    decoder = SpeculativeDecoder(pair.target, draft, vocab)
    state = decoder.start(seq, SAMPLING)
    with torch.inference_mode():
        q_root_dec, _ = decoder.draft_root(state, SAMPLING, False)
        depth_token = {d + 1: t for d, t in enumerate(tokens)}
        calls = iter(range(1, len(tokens) + 1))
        monkeypatch.setattr(drafting, "draw", lambda rows, rng, count=1: np.full((rows.shape[0], 1),
                                                                                depth_token[next(calls)]))
        dec = drafting.draft_tree(drafting.DraftRoot(state.kv_d, q_root_dec), space.max_action,
                                  drafting.DraftRule(SAMPLING, vocab), np.random.default_rng(0))
        p_dec = prob_rows(target_tree_pass(state.kv_t, seq[r], dec.tree)[0], SAMPLING, vocab)

    worst_q = worst_p = 0.0
    for d in range(len(path) + 1):
        prefix = seq + tokens[:d]
        f_node = path[d - 1] if d else 0
        dec_nodes = np.flatnonzero(dec.tree.depths == d)
        p_ref = _causal_row(pair.target, prefix, vocab)
        for got in [p_forest[f_node], *p_dec[dec_nodes]]:
            worst_p = max(worst_p, float(np.abs(got - p_ref).max()))
        if d == len(path):
            continue  # leaves are never fed to the draft: no q row
        q_ref = _causal_row(draft, prefix, vocab)
        fed = [n for n in dec_nodes if int(n) in dec.node_slots]
        for got in [forest.q_rows[f_node], *dec.tree.q_rows[fed]]:
            worst_q = max(worst_q, float(np.abs(got - q_ref).max()))
        assert worst_q < TOL, f"depth {d}: q rows differ by {worst_q:.2e}"
        assert worst_p < TOL, f"depth {d}: p rows differ by {worst_p:.2e}"
    assert worst_p < TOL, f"leaf depth: p rows differ by {worst_p:.2e}"
